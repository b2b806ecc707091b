"""``python -m course mutants`` against fixture labs built in tmp_path."""

from __future__ import annotations

import json
import textwrap

import pytest

from course import mutants
from course.__main__ import main as cli
from course.errors import CourseError

SOLUTION = '''
"""Fixture lab: clamp and count."""
from __future__ import annotations

import pathlib

WORDS = pathlib.Path(__file__).with_name("words.txt")


def helper(x: int) -> int:
    """Given to the learner."""
    return x * 2


def clamp(x: int, low: int, high: int) -> int:
    """x limited to [low, high]."""
    if low > high:
        raise ValueError("low must not exceed high")
    if x < low:
        return low
    elif x > high:
        return high
    return x


def count_words() -> int:
    """How many words words.txt holds."""
    return len(WORDS.read_text().split())
'''

STARTER = '''
"""Fixture lab: clamp and count."""
from __future__ import annotations

import pathlib

WORDS = pathlib.Path(__file__).with_name("words.txt")


def helper(x: int) -> int:
    """Given to the learner."""
    return x * 2


def clamp(x: int, low: int, high: int) -> int:
    """x limited to [low, high]; ValueError when low > high."""
    raise NotImplementedError("clamp")


def count_words() -> int:
    """How many words words.txt holds."""
    raise NotImplementedError("count_words")
'''

TESTS = """
import pytest

from course import load_impl

impl = load_impl(__file__)


def test_clamp_limits_both_sides():
    assert impl.clamp(-5, 0, 10) == 0
    assert impl.clamp(50, 0, 10) == 10
    assert impl.clamp(5, 0, 10) == 5


def test_clamp_rejects_an_empty_range():
    with pytest.raises(ValueError):
        impl.clamp(1, 3, 2)


def test_count_words_reads_the_file_next_to_the_code():
    assert impl.count_words() == 3
"""

LAB = "phase-00-x/labs/lab-01-clamp"


def make_diff(before: str, after: str, header: str) -> str:
    import difflib

    body = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True),
        "a/solution.py", "b/solution.py",
    )
    return f"# {header}\n" + "".join(body)


def mutated(old: str, new: str) -> str:
    src = textwrap.dedent(SOLUTION).lstrip("\n")
    assert src.count(old) == 1, old
    return src.replace(old, new)


@pytest.fixture
def lab_tree(tree):
    def build(diffs: dict[str, str] | None = None, equivalent: str | None = None):
        files = {
            f"{LAB}/solution.py": SOLUTION,
            f"{LAB}/starter.py": STARTER,
            f"{LAB}/test_lab.py": TESTS,
            f"{LAB}/README.md": "# Lab 01: clamp [CPU-OK]\n",
            f"{LAB}/words.txt": "one two three\n",
        }
        for name, text in (diffs or {}).items():
            files[f"{LAB}/mutants/{name}"] = text
        if equivalent is not None:
            files[f"{LAB}/mutants/equivalent.txt"] = equivalent
        return tree(files)

    return build


SRC = textwrap.dedent(SOLUTION).lstrip("\n")
KILLED = make_diff(SRC, mutated("x < low", "x <= low - 1 and False"), "lower bound never applied")
SURVIVOR = make_diff(SRC, mutated("    elif x > high:", "    elif x >= high:"),
                     "upper bound inclusive (same result at x == high)")
BROKEN = make_diff(SRC, mutated("import pathlib\n", "import pathlib\nimport no_such_module_x\n"),
                   "imports a module that does not exist")


# ---------------------------------------------------------------------------
# apply_diff
# ---------------------------------------------------------------------------


def test_apply_diff_reproduces_the_mutated_source():
    after = mutated("x < low", "x <= low")
    assert mutants.apply_diff(SRC, make_diff(SRC, after, "bug"), "m.diff") == after


def test_apply_diff_tolerates_a_shifted_hunk():
    after = mutated("x < low", "x <= low")
    diff = make_diff(SRC, after, "bug")
    shifted = "\n\n\n" + SRC
    assert mutants.apply_diff(shifted, diff, "m.diff") == "\n\n\n" + after


@pytest.mark.parametrize(
    ("diff", "message"),
    [
        ("--- a/solution.py\n+++ b/solution.py\n@@ -1 +1 @@\n-x\n+y\n", "first line"),
        ("# bug\n--- a/other.py\n+++ b/other.py\n@@ -1 +1 @@\n-x\n+y\n", "only solution.py"),
        ("# bug\n--- a/solution.py\n+++ b/solution.py\n@@ -1 +1 @@\n-nope\n+y\n",
         "does not apply"),
        ("# bug\n--- a/solution.py\n+++ b/solution.py\n", "no hunk"),
        ("# bug\njust words\n", "not a unified diff"),
    ],
)
def test_apply_diff_rejects_bad_diffs_naming_the_file(diff, message):
    with pytest.raises(CourseError, match=message) as info:
        mutants.apply_diff(SRC, diff, "labs/x/mutants/01-bad.diff")
    assert "01-bad.diff" in str(info.value)


def test_a_diff_that_changes_nothing_is_rejected():
    diff = "# bug\n--- a/solution.py\n+++ b/solution.py\n@@ -1 +1 @@\n-" + SRC.splitlines()[0]
    diff += "\n+" + SRC.splitlines()[0] + "\n"
    with pytest.raises(CourseError, match="changes nothing"):
        mutants.apply_diff(SRC, diff, "m.diff")


# ---------------------------------------------------------------------------
# generated mutants
# ---------------------------------------------------------------------------


def test_generated_mutants_cover_every_operator_family_of_learner_functions_only():
    found = mutants.generate_mutants(SRC, {"clamp", "count_words"})
    kinds = {m.id.split(":", 3)[3] for m in found}
    assert {"Gt->GtE", "Lt->LtE", "stmt-removed", "if-False", "elif-if", "return-None"} <= kinds
    assert all(m.id.split(":")[0] in ("clamp", "count_words") for m in found)
    assert not any("helper" in m.id for m in found)
    for m in found:  # every one compiles and differs from the solution
        compile(m.source, "solution.py", "exec")
        assert m.source != SRC
        assert m.description.startswith("line ")
    # the docstring is never mutated
    assert all('"""x limited to [low, high]."""' in m.source for m in found)


def test_each_operator_of_a_chained_comparison_gets_its_own_id():
    src = "def within(t, n):\n    return 0 < t < n\n"
    ids = [m.id for m in mutants.generate_mutants(src, {"within"}) if "->" in m.id]
    assert "within:2:11:Lt->LtE#0" in ids and "within:2:11:Lt->LtE#1" in ids
    assert len(ids) == len(set(ids))


def test_an_equivalent_id_may_hold_a_hash_sign(tmp_path):
    lab = tmp_path / "phase-00-x" / "labs" / "lab-01-x"
    (lab / "mutants").mkdir(parents=True)
    (lab / "mutants" / "equivalent.txt").write_text(
        "within:2:11:Lt->LtE#1  # t == n gives the same answer\n", encoding="utf-8"
    )
    assert mutants.read_equivalent(lab, tmp_path) == {
        "within:2:11:Lt->LtE#1": "t == n gives the same answer"
    }


def test_generated_ids_are_stable_and_unique():
    first = mutants.generate_mutants(SRC, {"clamp"})
    second = mutants.generate_mutants(SRC, {"clamp"})
    assert [m.id for m in first] == [m.id for m in second]
    assert len({m.id for m in first}) == len(first)
    assert len({m.source for m in first}) == len(first)


def test_nested_chains_get_ids_of_their_own_and_other_ids_do_not_move():
    # a * b * c * d nests three Mult nodes that all start at column 11
    src = "def f(a, b, c, d):\n    return a * b * c * d + a\n"
    raw = mutants.generate_mutants(src, {"f"})
    named = mutants.unique_ids(raw)
    ids = [m.id for m in named]
    assert len(set(ids)) == len(ids)
    assert [m.source for m in named] == [m.source for m in raw]
    chain = [i for i in ids if i.startswith("f:2:11:Mult->Div")]
    assert chain == ["f:2:11:Mult->Div", "f:2:11:Mult->Div@2", "f:2:11:Mult->Div@3"]
    # an id that was unique before keeps its name, so recorded verdicts stay valid
    assert [r.id for r in raw if [x.id for x in raw].count(r.id) == 1] == [
        n.id for n, r in zip(named, raw) if [x.id for x in raw].count(r.id) == 1]


def test_generated_operator_families_on_a_small_function():
    src = (
        "def f(a, b, flag):\n"
        "    total = 0\n"
        "    total += a * b / 2\n"
        "    if flag and not a % 3 == 0:\n"
        "        return -total // 1\n"
        "    return total - True\n"
    )
    ids = {m.id for m in mutants.generate_mutants(src, {"f"})}
    expected = {
        "f:2:12:0->1", "f:3:4:Add->Sub", "f:3:13:Mult->Div", "f:3:13:Div->FloorDiv",
        "f:4:7:And->Or", "f:4:16:not-dropped", "f:4:20:Mod->FloorDiv", "f:4:20:Eq->NotEq",
        "f:5:15:minus-dropped", "f:6:19:True->False", "f:6:4:return-None", "f:2:4:stmt-removed",
        "f:3:13:Div->Mult", "f:6:11:Sub->Add", "f:5:15:FloorDiv->Div", "f:4:7:if-False",
    }
    assert expected <= ids, sorted(expected - ids)


def test_equivalent_file_is_parsed_and_a_line_without_reason_is_bad_input(tmp_path):
    lab = tmp_path / "lab"
    (lab / "mutants").mkdir(parents=True)
    (lab / "mutants" / "equivalent.txt").write_text(
        "# reviewed\n\nclamp:6:7:Lt->LtE  # x == low returns low either way\n"
    )
    assert mutants.read_equivalent(lab, tmp_path) == {
        "clamp:6:7:Lt->LtE": "x == low returns low either way"
    }
    (lab / "mutants" / "equivalent.txt").write_text("clamp:6:7:Lt->LtE\n")
    with pytest.raises(CourseError, match="line 1"):
        mutants.read_equivalent(lab, tmp_path)


# ---------------------------------------------------------------------------
# whole runs (each starts real workers: kept few)
# ---------------------------------------------------------------------------


def test_hand_mode_reports_killed_survived_and_broken_and_leaves_nothing_behind(
    lab_tree, capsys, tmp_path
):
    root = lab_tree({"01-killed.diff": KILLED, "02-survivor.diff": SURVIVOR,
                     "03-broken.diff": BROKEN})
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    out_json = tmp_path / "out.json"
    code = cli(["mutants", "--root", str(root), "--min-mutants", "1", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert code == 1
    assert "survived  02-survivor.diff  # upper bound inclusive" in out
    assert "03-broken.diff is broken" in out and "no_such_module_x" in out
    data = json.loads(out_json.read_text())
    lab = data["labs"][0]
    assert (lab["mutants"], lab["killed"], lab["survived"], lab["broken"]) == (3, 1, 1, 1)
    assert lab["survivors"] == [
        {"name": "02-survivor.diff", "header": "upper bound inclusive (same result at x == high)"}
    ]
    after = sorted(p.relative_to(root) for p in root.rglob("*") if p != out_json)
    assert after == before  # no mutated copy, cache or __pycache__ left in the tree


def test_a_lab_with_too_few_mutants_fails_and_graded_copies_see_sibling_files(
    lab_tree, capsys
):
    # the count_words test passes only if words.txt sits beside the graded copy:
    # otherwise the baseline run of solution.py would be reported as a problem
    root = lab_tree({"01-killed.diff": KILLED})
    assert cli(["mutants", "--root", str(root), "-j", "1"]) == 1  # default: at least 6
    out = capsys.readouterr().out
    assert "1 mutants (at least 6 wanted)" in out
    assert "do not pass on solution.py" not in out
    assert "1 labs, 1 hand-written mutants graded" in out


def test_a_hanging_mutant_counts_as_killed_by_timeout(lab_tree, capsys):
    hang = make_diff(SRC, mutated("    return x\n", "    while True:\n        pass\n"),
                     "loops forever")
    root = lab_tree({"01-hang.diff": hang})
    code = cli(["mutants", "--root", str(root), "--min-mutants", "1", "--timeout", "1",
                "--json", str(root / "r.json")])
    assert code == 0
    result = json.loads((root / "r.json").read_text())["labs"][0]["results"][0]
    assert result["verdict"] == "killed" and "timed out" in result["detail"]


def test_generated_mode_reports_the_rate_and_honours_equivalent_entries(lab_tree, capsys):
    found = mutants.generate_mutants(SRC, {"clamp", "count_words"})
    gt = next(m.id for m in found if m.id.endswith(":Gt->GtE"))
    root = lab_tree(equivalent=f"{gt}  # clamp(high, low, high) is high either way\n")
    out_json = root / "gen.json"
    code = cli(["mutants", "--root", str(root), "--generated", "--threshold", "0",
                "--json", str(out_json)])
    out = capsys.readouterr().out
    assert code == 0, out
    lab = json.loads(out_json.read_text())["labs"][0]
    assert lab["generated"] == len(found) == lab["mutants"]
    assert lab["equivalent"] == 1
    judged = lab["mutants"] - lab["equivalent"]
    assert lab["kill_rate"] == round(100 * lab["killed"] / judged, 1)
    assert lab["killed"] + lab["survived"] + lab["broken"] == judged
    # x <= low returns low at x == low too: equivalent, but not listed, so it survives
    assert any(s["name"].endswith("Lt->LtE") for s in lab["survivors"])
    assert f"{lab['kill_rate']:5.1f}%" in out
    # a rate under the threshold fails the lab
    report = mutants.LabReport(LAB, "generated", [
        mutants.MutantResult("a", "", "killed"), mutants.MutantResult("b", "", "survived"),
        mutants.MutantResult("c", "", "equivalent"),
    ])
    assert report.rate == 50.0
    assert mutants.failed(report, True, 50.0, 6) is False
    assert mutants.failed(report, True, 50.1, 6) is True


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["mutants", "no/such/lab"], "LAB no/such/lab: no such folder"),
        (["mutants", "-j", "0"], "-j 0: must be at least 1"),
        (["mutants", "--generated", "--threshold", "120"], "--threshold 120.0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, lab_tree, capsys):
    root = lab_tree()
    assert cli([*argv, "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_diff_that_does_not_apply_is_bad_input_naming_it(lab_tree, capsys):
    bad = "# stale\n--- a/solution.py\n+++ b/solution.py\n@@ -3 +3 @@\n-gone\n+x\n"
    root = lab_tree({"07-stale.diff": bad})
    assert cli(["mutants", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"{LAB}/mutants/07-stale.diff" in err and "does not apply" in err


# ---------------------------------------------------------------------------
# the ledger (what CI reuses)
# ---------------------------------------------------------------------------


def test_the_fingerprint_follows_code_and_tests_but_not_prose(lab_tree):
    root = lab_tree({"01-killed.diff": KILLED})
    lab = root / LAB
    fp = mutants.fingerprint(lab, root, "hand", 400)
    assert fp == mutants.fingerprint(lab, root, "hand", 400)  # no clock, no path outside root
    assert fp != mutants.fingerprint(lab, root, "generated", 400)
    (lab / "README.md").write_text("# reworded\n")
    (lab / "mutants" / mutants.LEDGER_FILE).write_text("{}\n")
    assert mutants.fingerprint(lab, root, "hand", 400) == fp
    (lab / "test_lab.py").write_text(TESTS + "\n# one more line\n")
    assert mutants.fingerprint(lab, root, "hand", 400) != fp
    fp = mutants.fingerprint(lab, root, "hand", 400)
    (root / "conftest.py").write_text("# a conftest above the lab\n")
    assert mutants.fingerprint(lab, root, "hand", 400) != fp
    fp = mutants.fingerprint(lab, root, "hand", 400)
    (root / "mini_vllm").mkdir()
    (root / "mini_vllm" / "__init__.py").write_text("")
    (root / "mini_vllm" / "thing.py").write_text("X = 1\n")
    (lab / "helper.py").write_text("from mini_vllm.thing import X\n")
    with_import = mutants.fingerprint(lab, root, "hand", 400)
    assert with_import != fp
    (root / "mini_vllm" / "thing.py").write_text("X = 2\n")  # an imported module changed
    assert mutants.fingerprint(lab, root, "hand", 400) != with_import


def test_update_ledger_then_ledger_reuses_it_and_a_wrong_record_is_caught(lab_tree, capsys):
    root = lab_tree({"01-killed.diff": KILLED, "02-survivor.diff": SURVIVOR})
    ledger = root / LAB / "mutants" / mutants.LEDGER_FILE
    base = ["mutants", "--root", str(root), "--min-mutants", "1", "-j", "1", "--ledger"]
    # no record yet: graded in full, then written
    assert cli([*base, "--update-ledger"]) == 1
    assert "0 lab(s) taken from mutants/ledger.json with a spot check, 1 graded in full" \
        in capsys.readouterr().out
    data = json.loads(ledger.read_text())
    assert data["hand"]["verdicts"] == {"01-killed.diff": "killed", "02-survivor.diff": "survived"}
    assert data["hand"]["fingerprint"] == mutants.fingerprint(root / LAB, root, "hand", 400)
    # reused: the same verdicts, so the survivor still fails the run; nothing is rewritten
    out_json = root / "r.json"
    before = ledger.read_text()
    assert cli([*base, "--update-ledger", "--json", str(out_json)]) == 1
    out = capsys.readouterr().out
    assert "1 lab(s) taken from mutants/ledger.json" in out and "survived  02-survivor.diff" in out
    lab = json.loads(out_json.read_text())["labs"][0]
    assert lab["from_ledger"] and (lab["killed"], lab["survived"]) == (1, 1)
    assert ledger.read_text() == before
    # a record that does not match a re-graded mutant is a problem, not a pass
    data["hand"]["verdicts"]["02-survivor.diff"] = "killed"
    ledger.write_text(json.dumps(data))
    assert cli(base) == 1
    assert "the ledger disagrees: 02-survivor.diff was killed" in capsys.readouterr().out


def test_the_spot_check_is_a_seeded_sample_of_the_pending_mutants():
    report = mutants.LabReport(LAB, "generated", fingerprint="ab" * 32)
    pending = list(range(50))
    sample = mutants.spot_sample(report, pending)
    assert len(sample) == mutants.SPOT_CHECK["generated"] and set(sample) <= set(pending)
    assert sample == mutants.spot_sample(report, pending)
    other = mutants.LabReport(LAB, "generated", fingerprint="cd" * 32)
    assert mutants.spot_sample(other, pending) != sample
    assert mutants.spot_sample(report, [3, 4]) == [3, 4]


def test_a_record_that_cannot_tell_two_mutants_apart_is_not_used(lab_tree):
    root = lab_tree()
    lab = root / LAB
    report = mutants.LabReport(LAB, "generated", fingerprint="f" * 64)
    found = [(mutants.MutantResult("f:1:0:Add->Sub", ""), ""),
             (mutants.MutantResult("f:1:0:Add->Sub", ""), "")]  # the same id twice
    (lab / "mutants").mkdir()
    (lab / "mutants" / mutants.LEDGER_FILE).write_text(json.dumps(
        {"format": mutants.LEDGER_FORMAT,
         "generated": {"fingerprint": "f" * 64, "verdicts": {"f:1:0:Add->Sub": "killed"}}}))
    assert mutants.use_ledger(lab, report, found) is None
    assert [m.verdict for m, _ in found] == ["pending", "pending"] and not report.from_ledger


def test_killed_and_broken_agree_for_generated_mutants_only():
    assert mutants._agree("broken", "killed", generated=True)
    assert mutants._agree("killed", "broken", generated=True)
    assert not mutants._agree("killed", "survived", generated=True)
    assert not mutants._agree("broken", "killed", generated=False)
    assert mutants._agree("survived", "survived", generated=False)
