"""The lab-contract checker against fixture labs built in tmp_path."""

from __future__ import annotations

import ast

import pytest

from course import labs

SOLUTION = '''
"""Fixture lab: running totals."""
from __future__ import annotations

SCALE = 2


def helper(x: int) -> int:
    """Given to the learner: identical in both files."""
    return x * SCALE


def running_total(values: list[int]) -> list[int]:
    """Prefix sums of values."""
    out = []
    total = 0
    for v in values:
        total += v
        out.append(total)
    return out


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def bump(self, by: int = 1) -> int:
        self.value += by
        return self.value
'''

STARTER = '''
"""Fixture lab: running totals."""
from __future__ import annotations

SCALE = 2


def helper(x: int) -> int:
    """Given to the learner: identical in both files."""
    return x * SCALE


def running_total(values: list[int]) -> list[int]:
    """Recipe: keep a running sum, append it after each value."""
    out = []
    raise NotImplementedError("running_total")


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def bump(self, by: int = 1) -> int:
        """Recipe: add `by` to self.value and return it."""
        raise NotImplementedError("Counter.bump")
'''

TESTS = """
from course import load_impl

impl = load_impl(__file__)


def test_running_total_is_the_prefix_sum():
    assert impl.running_total([1, 2, 3]) == [1, 3, 6]


def test_bump_adds_and_returns_the_new_value():
    assert impl.Counter(1).bump(2) == 3
"""

README = "[nav](../README.md)\n\n# Lab 00-0N — Running totals [CPU-OK]\n\nHook.\n"


def lab_files(name: str, **overrides: str) -> dict[str, str]:
    files = {
        "README.md": README,
        "starter.py": STARTER,
        "solution.py": SOLUTION,
        "test_lab.py": TESTS,
    }
    files.update(overrides)
    return {
        f"phase-00-fixture/labs/{name}/{f}": text for f, text in files.items() if text is not None
    }


@pytest.fixture(scope="module")
def checked(tmp_path_factory, write_files):
    """One checker run (two pytest processes) over four fixture labs."""
    write_tree = write_files
    root = tmp_path_factory.mktemp("labs")
    write_tree(root, lab_files("lab-01-good"))
    write_tree(
        root,
        lab_files(
            "lab-02-starter-passes",
            **{
                "test_lab.py": TESTS + "\n\ndef test_helper_doubles():\n"
                "    assert impl.helper(3) == 6\n"
            },
        ),
    )
    write_tree(
        root,
        lab_files(
            "lab-03-import-error",
            **{
                "starter.py": STARTER.replace(
                    "SCALE = 2", "import no_such_module_for_the_fixture\n\nSCALE = 2"
                )
            },
        ),
    )
    write_tree(
        root,
        lab_files(
            "lab-04-wrong-failure",
            **{
                "starter.py": STARTER.replace(
                    'raise NotImplementedError("Counter.bump")', "return 0"
                )
            },
        ),
    )
    found = labs.find_labs(root)
    results = labs.check_labs(root, found)
    return root, {r.lab.name: r for r in results}


def test_good_fixture_lab_passes(checked):
    _, results = checked
    good = results["lab-01-good"]
    assert good.problems == []
    assert (good.tag, good.tests, good.solution) == ("CPU-OK", "2", "2 passed")
    assert good.starter == "2 NotImplementedError"


def test_a_test_that_passes_on_the_starter_is_a_violation(checked):
    _, results = checked
    assert results["lab-02-starter-passes"].problems == [
        "starter: test_helper_doubles passes on the starter"
    ]


def test_an_import_error_in_the_starter_is_a_violation(checked):
    _, results = checked
    problems = results["lab-03-import-error"].problems
    assert len(problems) == 1
    assert problems[0].startswith("starter: error at collection")
    assert "no_such_module_for_the_fixture" in problems[0]


def test_a_failure_other_than_not_implemented_is_a_violation(checked):
    _, results = checked
    problems = results["lab-04-wrong-failure"].problems
    assert len(problems) == 1
    assert problems[0].startswith(
        "starter: test_bump_adds_and_returns_the_new_value fails, but not by NotImplementedError"
    )


def test_table_lists_every_lab_and_counts_violations(checked):
    root, results = checked
    lines = labs.format_table(list(results.values()), root)
    assert lines[0].split() == ["lab", "tag", "tests", "solution", "starter"]
    assert sum("phase-00-fixture/labs/lab-0" in ln and "CPU-OK" in ln for ln in lines) == 4
    assert lines[-1] == "4 labs checked; 3 with contract violations"


# ---- static checks: no test runs -------------------------------------------------


def static(tree, name: str, **overrides: str) -> list[str]:
    root = tree(lab_files(name, **overrides))
    return labs.static_problems(root / "phase-00-fixture" / "labs" / name)


def test_static_checks_pass_the_good_lab(tree):
    assert static(tree, "lab-01-good") == []


def test_missing_file_is_caught(tree):
    assert static(tree, "lab-01-x", **{"README.md": None}) == ["missing README.md"]


def test_missing_tag_is_caught(tree):
    problems = static(tree, "lab-01-x", **{"README.md": "# Lab 00-01 — No tag\n"})
    assert problems == ["README.md title has no tag (one of [CPU-OK], [GPU-OPT], [GPU-REQ])"]


def test_api_mismatch_is_caught(tree):
    starter = STARTER.replace(
        "def running_total(values: list[int]) -> list[int]:",
        "def running_total(values: list[int], start: int = 0) -> list[int]:",
    ).replace("SCALE = 2", "FACTOR = 2\nSCALE = 2\n")
    starter = starter.replace(
        "    def bump(self, by: int = 1) -> int:\n", "    def bump(self, by):\n"
    )
    problems = static(tree, "lab-01-x", **{"starter.py": starter})
    assert problems == [
        "starter.py has FACTOR, which solution.py does not define",
        "Counter.bump differs: solution.py has `def bump(self, by: int=1) -> int`, "
        "starter.py has `def bump(self, by)`",
        "running_total differs: solution.py has "
        "`def running_total(values: list[int]) -> list[int]`, starter.py has "
        "`def running_total(values: list[int], start: int=0) -> list[int]`",
    ]


def test_missing_public_name_is_caught(tree):
    starter = STARTER.replace("def helper(", "def _helper(")
    problems = static(tree, "lab-01-x", **{"starter.py": starter})
    assert problems == ["starter.py lacks helper (def helper(x: int) -> int)"]


def test_leaked_solution_body_is_caught(tree):
    leaked = STARTER.replace(
        '    out = []\n    raise NotImplementedError("running_total")',
        "    out = []\n    total = 0\n    for v in values:\n        total += v\n"
        '        out.append(total)\n    raise NotImplementedError("running_total")',
    )
    problems = static(tree, "lab-01-x", **{"starter.py": leaked})
    assert problems == [
        "starter.py leaks the solution of running_total: 3 statement(s) "
        "(28 AST nodes) copied from solution.py"
    ]


def test_leak_threshold_tolerates_scaffolding_but_not_a_copied_loop():
    solution = ast.parse(SOLUTION)
    fn = next(n for n in solution.body if getattr(n, "name", "") == "running_total")
    weights = [sum(1 for _ in ast.walk(s)) for s in fn.body[1:]]  # without the docstring
    # out = [] and total = 0 are scaffolding; the loop alone crosses the threshold
    assert weights[0] + weights[1] < labs.LEAK_MIN_NODES <= weights[2]


def test_leak_hidden_in_another_function_is_caught(tree):
    leaked = STARTER + (
        "\n\ndef _private(values):\n    out = []\n    total = 0\n"
        "    for v in values:\n        total += v\n        out.append(total)\n    return out\n"
    )
    problems = static(tree, "lab-01-x", **{"starter.py": leaked})
    assert len(problems) == 1 and "leaks the solution of running_total" in problems[0]


def test_starter_without_any_not_implemented_is_caught(tree):
    problems = static(tree, "lab-01-x", **{"starter.py": SOLUTION})
    assert problems == ["starter.py has no function that raises NotImplementedError"]


def test_syntax_error_is_caught(tree):
    problems = static(tree, "lab-01-x", **{"starter.py": "def broken(:\n"})
    assert problems == ["starter.py does not parse: line 1: invalid syntax"]


def test_bare_module_import_in_tests_is_caught(tree):
    problems = static(tree, "lab-01-x", **{"test_lab.py": "from solution import running_total\n"})
    assert problems == [
        "test_lab.py does not get its code through load_impl(__file__)",
        "test_lab.py imports solution/starter by bare module name",
    ]


def test_no_labs_prints_and_exits_zero(tmp_path, capsys):
    assert labs.main(tmp_path, []) == 0
    assert "nothing to check" in capsys.readouterr().out


def test_static_mode_exit_status(tree, capsys):
    root = tree(lab_files("lab-01-good"))
    assert labs.main(root, [], static_only=True) == 0
    tree(lab_files("lab-02-bad", **{"README.md": None}))
    assert labs.main(root, [], static_only=True) == 1
    out = capsys.readouterr().out
    assert "phase-00-fixture/labs/lab-02-bad: missing README.md" in out


def test_a_statement_shared_with_a_given_helper_is_not_a_leak(tree):
    """A check the solution repeats in a helper the learner is given weighs nothing."""
    guard = '    if not values:\n        raise ValueError(f"values must not be empty, got {values!r}")\n'
    solution = (
        SOLUTION.replace(
            '    """Prefix sums of values."""\n', '    """Prefix sums of values."""\n' + guard
        )
        + "\n\ndef check(values):\n"
        + guard
        + "    return values\n"
    )
    starter = (
        STARTER.replace(
            '    out = []\n    raise NotImplementedError("running_total")',
            guard + '    raise NotImplementedError("running_total")',
        )
        + "\n\ndef check(values):\n"
        + guard
        + "    return values\n"
    )
    problems = static(tree, "lab-01-x", **{"solution.py": solution, "starter.py": starter})
    assert problems == []


def test_a_task_the_readme_names_but_the_starter_lacks_is_caught():
    starter = ast.parse(STARTER)
    readme = (
        "# Lab\n\n## What to implement\n\n"
        "- `running_total(values) -> list[int]`: prefix sums.\n"
        "- `Counter.bump(by)`: add and return.\n"
        "- `running_sum(values)`: a stale name from an older draft.\n"
        "- `Counter.reset()`: a method the starter never grew.\n\n"
        "Calls in running text, like `len(values)` or `engine.step()`, are not tasks.\n\n"
        "## Notes\n\n- `not_a_task(x)`: outside the section.\n"
    )
    problems = labs.unknown_task_names(readme, starter)
    assert problems == [
        "README.md names `Counter.reset(` under What to implement, but starter.py has no such name",
        "README.md names `running_sum(` under What to implement, but starter.py has no such name",
    ]


def test_a_task_defined_under_a_guard_is_found():
    starter = ast.parse(
        "try:\n    import triton\nexcept ImportError:\n    triton = None\n\n"
        "if triton is not None:\n    def _kernel(x):\n        raise NotImplementedError\n"
    )
    readme = "## What to implement\n\n- `_kernel(x)`: the Triton kernel.\n"
    assert labs.unknown_task_names(readme, starter) == []
