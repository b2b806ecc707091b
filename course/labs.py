"""``python -m course labs``: check the lab contract of every lab folder.

A lab folder is ``phase-*/labs/lab-*/``. For each one the checker verifies:

1. **Files**: ``README.md``, ``starter.py``, ``solution.py`` and ``test_lab.py`` exist
   (GPU labs may add ``run.py``), and the README title carries a tag:
   ``[CPU-OK]``, ``[GPU-OPT]`` or ``[GPU-REQ]``.
2. **Same public API**: the top-level public names of ``starter.py`` and
   ``solution.py`` (functions, classes, constants; names not starting with ``_``;
   imported names are not part of it) are the same, and so are the signatures of
   every public function, class (bases, decorators, fields) and method.
3. **No leaked solution**: a *learner function* is one whose starter body raises
   ``NotImplementedError``. The starter must have at least one. No statement
   list anywhere in ``starter.py`` may contain a run of consecutive statements
   copied from the solution body of a learner function once the run is
   non-trivial: at least ``LEAK_MIN_NODES`` AST nodes (a loop, a few
   computations; ``out = []`` alone is not a leak). Helpers the learner is not
   asked to write are identical in both files by design and are not learner
   functions, so they are never reported; a statement that also appears in the
   solution outside every learner function (a shared argument check, say) weighs
   nothing.
4. **Honest grading**, by running pytest twice over all labs (``-m "not gpu"``),
   once per implementation, both at once, each writing a JUnit XML report that
   is split per lab: with the solution every test passes and at least one runs;
   with ``LAB_IMPL=starter`` every test that runs fails, each because of a
   ``NotImplementedError``, and nothing fails at collection (an import or syntax
   error in the starter is a violation, not a failure).

It prints a table (lab, tag, tests, solution, starter), then every violation as
``lab: problem``, and exits 1 if there is any.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator

from course.errors import CourseError

REQUIRED_FILES = ("README.md", "starter.py", "solution.py", "test_lab.py")
TAGS = ("CPU-OK", "GPU-OPT", "GPU-REQ")
TAG_RE = re.compile(r"\[(CPU-OK|GPU-OPT|GPU-REQ)\]")
LEAK_MIN_NODES = 15
PYTEST_TIMEOUT_S = 900


# ---------------------------------------------------------------------------
# Finding labs
# ---------------------------------------------------------------------------


def find_labs(root: pathlib.Path) -> list[pathlib.Path]:
    """Every ``phase-*/labs/lab-*/`` folder under ``root``, sorted."""
    return sorted(p for p in root.glob("phase-*/labs/lab-*") if p.is_dir())


def read_tag(readme: pathlib.Path) -> str | None:
    """The tag in the README's title line (the first ``# `` heading)."""
    if not readme.is_file():
        return None
    for line in readme.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("# "):
            match = TAG_RE.search(line)
            return match.group(1) if match else None
    return None


# ---------------------------------------------------------------------------
# Static checks: API and leaks
# ---------------------------------------------------------------------------

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def _signature(fn: FunctionNode) -> str:
    prefix = "async def" if isinstance(fn, ast.AsyncFunctionDef) else "def"
    decorators = "".join(f"@{ast.unparse(d)} " for d in fn.decorator_list)
    returns = f" -> {ast.unparse(fn.returns)}" if fn.returns is not None else ""
    return f"{decorators}{prefix} {fn.name}({ast.unparse(fn.args)}){returns}"


def _is_public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _targets(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    else:
        return []
    names: list[str] = []
    for target in targets:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name):
                names.append(sub.id)
    return names


def public_api(tree: ast.Module) -> dict[str, str]:
    """name -> description of every public top-level name (and class member)."""
    api: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if not node.name.startswith("_"):
                api[node.name] = _signature(node)
        elif isinstance(node, ast.ClassDef):
            if node.name.startswith("_"):
                continue
            decorators = "".join(f"@{ast.unparse(d)} " for d in node.decorator_list)
            bases = ", ".join(ast.unparse(b) for b in [*node.bases, *node.keywords])
            api[node.name] = f"{decorators}class {node.name}({bases})"
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    if _is_public(item.name):
                        api[f"{node.name}.{item.name}"] = _signature(item)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    if not item.target.id.startswith("_"):
                        api[f"{node.name}.{item.target.id}"] = (
                            f"field {item.target.id}: {ast.unparse(item.annotation)}"
                        )
                else:
                    for name in _targets(item):
                        if not name.startswith("_"):
                            api[f"{node.name}.{name}"] = f"attribute {name}"
        else:
            for name in _targets(node):
                if not name.startswith("_"):
                    api[name] = f"constant {name}"
    return api


def compare_api(solution: ast.Module, starter: ast.Module) -> list[str]:
    """Differences between the two public APIs, as messages."""
    want, have = public_api(solution), public_api(starter)
    problems = []
    for name in sorted(want.keys() - have.keys()):
        problems.append(f"starter.py lacks {name} ({want[name]})")
    for name in sorted(have.keys() - want.keys()):
        problems.append(f"starter.py has {name}, which solution.py does not define")
    for name in sorted(want.keys() & have.keys()):
        if want[name] != have[name]:
            problems.append(
                f"{name} differs: solution.py has `{want[name]}`, starter.py has `{have[name]}`"
            )
    return problems


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, FunctionNode]]:
    """(qualified name, node) of every function and method, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            qualname = f"{prefix}{node.name}"
            yield qualname, node
            yield from _functions(node, f"{qualname}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        elif not isinstance(node, ast.expr):
            yield from _functions(node, prefix)


def _raises_not_implemented(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.Raise) or stmt.exc is None:
        return False
    exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def learner_functions(starter: ast.Module) -> set[str]:
    """Functions whose starter body raises NotImplementedError (not nested deeper)."""
    return {
        name
        for name, fn in _functions(starter)
        if any(_raises_not_implemented(stmt) for stmt in fn.body)
    }


def _strip_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            return body[1:]
    return body


def _statement_lists(tree: ast.AST) -> Iterator[list[ast.stmt]]:
    """Every list of statements in ``tree`` (bodies, else branches, handlers ...)."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            value = getattr(node, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                yield _strip_docstring(value) if field == "body" else value


def _size(stmt: ast.stmt) -> int:
    return sum(1 for _ in ast.walk(stmt))


def _longest_shared_run(
    a: list[ast.stmt], b: list[ast.stmt], shared: frozenset[str] = frozenset()
) -> tuple[int, int]:
    """Largest (AST-node weight, statement count) of a run of equal consecutive statements.

    Statements whose dump is in ``shared`` continue a run but add no weight.
    """
    da = [ast.dump(s) for s in a]
    db = [ast.dump(s) for s in b]
    best = (0, 0)
    # weight[i][j]: weight of the shared run ending at a[i-1], b[j-1]
    prev = [(0, 0)] * (len(db) + 1)
    for i in range(1, len(da) + 1):
        cur = [(0, 0)] * (len(db) + 1)
        for j in range(1, len(db) + 1):
            if da[i - 1] == db[j - 1]:
                w, n = prev[j - 1]
                cur[j] = (w + (0 if da[i - 1] in shared else _size(a[i - 1])), n + 1)
                best = max(best, cur[j])
        prev = cur
    return best


def find_leaks(solution: ast.Module, starter: ast.Module) -> list[str]:
    """Learner-function code of the solution found in the starter, as messages."""
    learners = learner_functions(starter)
    solution_fns = dict(_functions(solution))
    starter_lists = list(_statement_lists(starter))
    inside = {
        id(node)
        for name in learners
        if name in solution_fns
        for node in ast.walk(solution_fns[name])
    }
    shared = frozenset(
        ast.dump(node)
        for node in ast.walk(solution)
        if isinstance(node, ast.stmt) and id(node) not in inside
    )
    problems = []
    for name in sorted(learners):
        fn = solution_fns.get(name)
        if fn is None:
            continue
        for sol_list in _statement_lists(fn):
            hit = max(
                (_longest_shared_run(sol_list, st_list, shared) for st_list in starter_lists),
                default=(0, 0),
            )
            if hit[0] >= LEAK_MIN_NODES:
                problems.append(
                    f"starter.py leaks the solution of {name}: {hit[1]} statement(s) "
                    f"({hit[0]} AST nodes) copied from solution.py"
                )
                break
    return problems


def _parse(path: pathlib.Path) -> tuple[ast.Module | None, str | None]:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), None
    except SyntaxError as exc:
        return None, f"{path.name} does not parse: line {exc.lineno}: {exc.msg}"
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"{path.name} cannot be read: {exc}"


# A task line: a list item, numbered item or heading that opens with a call in
# backticks, e.g. "- `apply_top_k(logits, k) -> ndarray`: ..." or "### 2. `BlockPool.touch(blocks)`".
_TASK_CALL = re.compile(
    r"^\s*(?:[-*+]|\d+\.|#+)\s+(?:\d+\.\s+)?(?:\*\*)?`([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)\(",
    re.M,
)


def _section(markdown: str, heading: str) -> str:
    """The body of the ``## heading`` section of a markdown page ('' if absent)."""
    match = re.search(rf"^## {re.escape(heading)}[^\n]*\n(.*?)(?=^## |\Z)", markdown, re.M | re.S)
    return match.group(1) if match else ""


def unknown_task_names(readme: str, starter: ast.Module) -> list[str]:
    """Task lines under "What to implement" that name a call the starter lacks.

    A README that tells the learner to write ``evict_tail(...)`` when the starter
    calls it ``evict_last`` sends them hunting; tiny-llm checks the same drift.
    A bare ``name(`` must be a top-level name of the starter, one it imports, a
    method of one of its classes, or a builtin; ``Class.method(`` must be a method
    of that starter class. Calls on other objects (``engine.step(``) are skipped.
    """
    # Any def or class of the module counts, nested ones too (a Triton kernel is
    # often defined under `if triton is not None:`).
    top = {
        n.name
        for n in ast.walk(starter)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    top |= {t for n in starter.body for t in _targets(n)}
    imported = {
        (a.asname or a.name).split(".")[0]
        for n in ast.walk(starter)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    classes = {n.name: n for n in starter.body if isinstance(n, ast.ClassDef)}
    methods = {
        m.name for c in classes.values() for m in c.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    unknown = []
    for name in sorted(set(_TASK_CALL.findall(_section(readme, "What to implement")))):
        owner, _, attr = name.partition(".")
        if attr:
            if owner in classes and attr not in {
                m.name for m in classes[owner].body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
            }:
                unknown.append(name)
        elif not (owner in top or owner in imported or owner in methods or hasattr(builtins, owner)):
            unknown.append(name)
    return [f"README.md names `{n}(` under What to implement, but starter.py has no such name" for n in unknown]


def static_problems(lab: pathlib.Path) -> list[str]:
    """Files, tag, API and leak checks of one lab folder (no code is run)."""
    problems = [f"missing {name}" for name in REQUIRED_FILES if not (lab / name).is_file()]
    if (lab / "README.md").is_file() and read_tag(lab / "README.md") is None:
        problems.append(
            "README.md title has no tag (one of " + ", ".join(f"[{t}]" for t in TAGS) + ")"
        )
    if not ((lab / "starter.py").is_file() and (lab / "solution.py").is_file()):
        return problems
    solution, why_sol = _parse(lab / "solution.py")
    starter, why_st = _parse(lab / "starter.py")
    problems += [why for why in (why_sol, why_st) if why]
    if solution is None or starter is None:
        return problems
    problems += compare_api(solution, starter)
    if not learner_functions(starter):
        problems.append("starter.py has no function that raises NotImplementedError")
    problems += find_leaks(solution, starter)
    if (lab / "README.md").is_file():
        problems += unknown_task_names((lab / "README.md").read_text(encoding="utf-8"), starter)
    test_file = lab / "test_lab.py"
    if test_file.is_file():
        text = test_file.read_text(encoding="utf-8", errors="replace")
        if "load_impl" not in text:
            problems.append("test_lab.py does not get its code through load_impl(__file__)")
        if re.search(r"^\s*(from|import)\s+(solution|starter)\b", text, re.M):
            problems.append("test_lab.py imports solution/starter by bare module name")
    return problems


# ---------------------------------------------------------------------------
# Running the tests
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    """One test case's result, from the JUnit XML."""

    name: str
    status: str  # passed | failed | error | skipped
    message: str = ""


@dataclasses.dataclass
class Run:
    """One pytest process over many labs."""

    cases: dict[pathlib.Path, list[Outcome]]  # lab -> outcomes
    collection_errors: dict[pathlib.Path, str]
    returncode: int
    tail: str


def _lab_of(file_attr: str, root: pathlib.Path, labs: list[pathlib.Path]) -> pathlib.Path | None:
    path = (root / file_attr).resolve()
    for lab in labs:
        if path.is_relative_to(lab.resolve()):
            return lab
    return None


def _classname_lab(
    classname: str, root: pathlib.Path, labs: list[pathlib.Path]
) -> pathlib.Path | None:
    for lab in labs:
        dotted = lab.resolve().relative_to(root.resolve()).as_posix().replace("/", ".")
        if classname == dotted or classname.startswith(dotted + "."):
            return lab
    return None


def parse_junit(xml_path: pathlib.Path, root: pathlib.Path, labs: list[pathlib.Path]) -> Run:
    cases: dict[pathlib.Path, list[Outcome]] = {lab: [] for lab in labs}
    collection_errors: dict[pathlib.Path, str] = {}
    tree = ET.parse(xml_path)
    for case in tree.iter("testcase"):
        file_attr = case.get("file")
        classname = case.get("classname", "")
        lab = _lab_of(file_attr, root, labs) if file_attr else None
        if lab is None:
            lab = _classname_lab(classname, root, labs)
        if lab is None:
            continue
        status, headline, message = "passed", "", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = "failed" if child.tag == "failure" else child.tag
                headline = child.get("message") or ""
                message = headline + "\n" + (child.text or "")
                break
        if status == "error" and (not classname or headline == "collection failure"):
            collection_errors[lab] = _first_error_line(message)
            continue
        cases[lab].append(Outcome(case.get("name", ""), status, message))
    return Run(cases, collection_errors, 0, "")


def _first_error_line(message: str) -> str:
    """The exception line of a JUnit message (its headline, else the last ``E`` line)."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    if lines and lines[0] != "collection failure" and not lines[0].startswith("E "):
        return lines[0]
    for ln in reversed(lines):
        if ln.startswith("E "):
            return ln[1:].strip()
    return lines[0] if lines else "error"


def run_pytest(
    root: pathlib.Path, labs: list[pathlib.Path], impl: str, xml_path: pathlib.Path
) -> subprocess.Popen[str]:
    env = dict(os.environ, LAB_IMPL=impl, PYTHONDONTWRITEBYTECODE="1")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *[str(lab) for lab in labs],
        "-q",
        "-p",
        "no:cacheprovider",
        "--import-mode=importlib",
        f"--rootdir={root}",
        "-m",
        "not gpu",
        "--continue-on-collection-errors",
        f"--junitxml={xml_path}",
        "-o",
        "junit_family=xunit1",
        "-o",
        "junit_logging=no",
        # Tracebacks of hundreds of failing starter tests are costly: one line each.
        "--tb=line" if impl == "starter" else "--tb=short",
    ]
    return subprocess.Popen(
        cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def run_both(root: pathlib.Path, labs: list[pathlib.Path]) -> dict[str, Run]:
    """Run every lab's tests with the solution and with the starter, concurrently."""
    runs: dict[str, Run] = {}
    with tempfile.TemporaryDirectory(prefix="course-labs-") as tmp:
        procs = {}
        for impl in ("solution", "starter"):
            xml_path = pathlib.Path(tmp) / f"{impl}.xml"
            procs[impl] = (run_pytest(root, labs, impl, xml_path), xml_path)
        for impl, (proc, xml_path) in procs.items():
            try:
                output, _ = proc.communicate(timeout=PYTEST_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                output, _ = proc.communicate()
                raise CourseError(
                    f"pytest with LAB_IMPL={impl} ran past {PYTEST_TIMEOUT_S} s"
                ) from None
            if not xml_path.is_file():
                tail = " | ".join(output.strip().splitlines()[-3:])
                raise CourseError(f"pytest with LAB_IMPL={impl} wrote no report: {tail}")
            run = parse_junit(xml_path, root, labs)
            run.returncode = proc.returncode
            run.tail = output
            runs[impl] = run
    return runs


# ---------------------------------------------------------------------------
# Judging
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class LabResult:
    lab: pathlib.Path
    tag: str
    tests: str = "-"
    solution: str = "-"
    starter: str = "-"
    problems: list[str] = dataclasses.field(default_factory=list)


def _count(outcomes: Iterable[Outcome], status: str) -> int:
    return sum(1 for o in outcomes if o.status == status)


def judge_solution(result: LabResult, run: Run) -> None:
    lab = result.lab
    if lab in run.collection_errors:
        result.solution = "collection error"
        result.problems.append(f"solution: error at collection: {run.collection_errors[lab]}")
        return
    outcomes = run.cases.get(lab, [])
    passed, skipped = _count(outcomes, "passed"), _count(outcomes, "skipped")
    bad = [o for o in outcomes if o.status in ("failed", "error")]
    result.tests = f"{len(outcomes)}" + (f" ({skipped} skipped)" if skipped else "")
    result.solution = f"{passed} passed" + (f", {len(bad)} failed" if bad else "")
    for o in bad:
        result.problems.append(f"solution: {o.name} {o.status}: {_first_error_line(o.message)}")
    if not outcomes:
        result.problems.append("no test collected (outside `-m 'not gpu'`)")
    elif passed == 0 and not bad:
        result.problems.append(f"no test ran with the solution (all {skipped} skipped)")


def judge_starter(result: LabResult, run: Run) -> None:
    lab = result.lab
    if lab in run.collection_errors:
        result.starter = "collection error"
        result.problems.append(
            "starter: error at collection (must fail by NotImplementedError inside tests): "
            + run.collection_errors[lab]
        )
        return
    outcomes = run.cases.get(lab, [])
    ran = [o for o in outcomes if o.status != "skipped"]
    by_nie = [
        o for o in ran if o.status in ("failed", "error") and "NotImplementedError" in o.message
    ]
    passed = [o for o in ran if o.status == "passed"]
    other = [o for o in ran if o.status in ("failed", "error") and o not in by_nie]
    parts = [f"{len(by_nie)} NotImplementedError"]
    if passed:
        parts.append(f"{len(passed)} PASSED")
    if other:
        parts.append(f"{len(other)} other failures")
    result.starter = ", ".join(parts)
    for o in passed:
        result.problems.append(f"starter: {o.name} passes on the starter")
    for o in other:
        result.problems.append(
            f"starter: {o.name} fails, but not by NotImplementedError: {_first_error_line(o.message)}"
        )


def check_labs(
    root: pathlib.Path, labs: list[pathlib.Path], run_tests: bool = True
) -> list[LabResult]:
    results = [LabResult(lab, read_tag(lab / "README.md") or "?") for lab in labs]
    for result in results:
        result.problems.extend(static_problems(result.lab))
    runnable = [r.lab for r in results if (r.lab / "test_lab.py").is_file()]
    if run_tests and runnable:
        runs = run_both(root, runnable)
        for result in results:
            # a missing file is already reported; its import error would only repeat it
            if result.lab in runnable and (result.lab / "solution.py").is_file():
                judge_solution(result, runs["solution"])
            if result.lab in runnable and (result.lab / "starter.py").is_file():
                judge_starter(result, runs["starter"])
    return results


def format_table(results: list[LabResult], root: pathlib.Path) -> list[str]:
    def rel(p: pathlib.Path) -> str:
        try:
            return p.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            return str(p)

    rows = [("lab", "tag", "tests", "solution", "starter")]
    rows += [(rel(r.lab), r.tag, r.tests, r.solution, r.starter) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    problems = [f"{rel(r.lab)}: {p}" for r in results for p in r.problems]
    if problems:
        lines += ["", *problems]
    bad = sum(1 for r in results if r.problems)
    noun = "lab" if len(results) == 1 else "labs"
    lines += ["", f"{len(results)} {noun} checked; {bad} with contract violations"]
    return lines


def main(root: pathlib.Path, lab_args: list[str], static_only: bool = False) -> int:
    root = root.resolve()
    if lab_args:
        labs = []
        for arg in lab_args:
            lab = pathlib.Path(arg).resolve()
            if not lab.is_dir():
                raise CourseError(f"--lab {arg}: no such folder")
            labs.append(lab)
    else:
        labs = find_labs(root)
    if not labs:
        print(f"no lab folders (phase-*/labs/lab-*/) under {root}: nothing to check")
        return 0
    results = check_labs(root, labs, run_tests=not static_only)
    for line in format_table(results, root):
        print(line)
    return 1 if any(r.problems for r in results) else 0
