"""``python -m course mutants [LAB ...]``: do each lab's tests catch wrong code?

Hand-written mode (the default) takes every ``mutants/*.diff`` of a lab, a
unified diff of ``solution.py`` whose first line (``# ...``) says which
realistic bug it plants, applies it to a copy of ``solution.py`` and grades that
copy in place: ``LAB_IMPL=starter LAB_IMPL_FILE=<copy>`` and the lab's own
``test_lab.py``. A mutant is

* ``killed`` when its tests ran and at least one failed (or they hung past the
  time limit, which CI would also notice);
* ``survived`` when every test that ran passed: the tests miss that bug;
* ``broken`` when the tests could not even be collected (the diff breaks the
  import): the mutant, not the tests, needs fixing.

``--generated`` builds operator-level mutants of every learner function (one
whose body in ``starter.py`` raises ``NotImplementedError``) with :mod:`ast`:
comparison and arithmetic operators swapped, constants nudged, a statement or a
branch removed, ``elif`` made ``if``, ``and``/``or`` swapped, a return value
replaced by ``None``, a ``not`` or a unary minus dropped. Each has a stable id
``function:line:col:kind``. A lab's kill rate is killed / (generated -
equivalent), where ``mutants/equivalent.txt`` lists reviewed-equivalent ids, one
per line: ``<id>  # <reason>``.

Speed: pytest's start-up dominates, so ``-j`` warm workers (default 2, one per
core) each import pytest, hypothesis, numpy (and torch or mini_vllm when a lab
uses them) once, then fork one child per mutant that calls ``pytest.main``. The
children run with ``PYTHONHASHSEED=0``, seeded ``random``/numpy and a Hypothesis
profile that is derandomized and has no example database, so a verdict never
depends on the run. Mutated copies live in a temporary folder beside copies of
the lab's other files (so ``Path(__file__).with_name("corpus.txt")`` still
works); nothing is left behind.

The ledger: a full run of every lab's mutants takes longer than CI can give as
the course grows, so ``--update-ledger`` writes each fully graded lab's verdicts
to ``mutants/ledger.json`` under a fingerprint (a SHA-256 over every file of the
lab but its Markdown, the conftests above it, the repository modules its Python
files import by name, and the source of the grader itself). ``--ledger`` takes a
lab's verdicts from that file when its fingerprint still matches, and re-grades
a seeded sample of them (``SPOT_CHECK``) that must agree verdict for verdict; a
lab without a matching entry is graded in full. CI runs with ``--ledger``; a
learner's plain ``python -m course mutants`` grades everything.

Exit status: 0 every mutant killed (and, with ``--generated``, every lab at or
above ``--threshold``), 1 otherwise, 2 bad input (one line on stderr).
"""

from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import hashlib
import importlib
import inspect
import json
import os
import pathlib
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from course import labs as labs_mod
from course.errors import CourseError

DEFAULT_JOBS = 2
DEFAULT_THRESHOLD = 90.0
DEFAULT_MIN_MUTANTS = 6
DEFAULT_MAX_GENERATED = 400
WARM_PREFIX = "warm:"  # a preload entry that calls a function instead of importing a module
EQUIVALENT_FILE = "equivalent.txt"
LEDGER_FILE = "ledger.json"  # in a lab's mutants/: verdicts of its last full run
LEDGER_FORMAT = 1
SPOT_CHECK = {"hand": 4, "generated": 8}  # --ledger: mutants re-graded per lab
REPO_PACKAGES = ("mini_vllm", "course", "benchmarks")  # imports that count in a fingerprint
HYPOTHESIS_PROFILE = "course-mutants"
# Modules worth importing once in each warm worker when a lab uses them.
PRELOAD_ROOTS = ("numpy", "torch", "hypothesis", "mini_vllm", "transformers", "tokenizers")
PACKAGE_ROOT = pathlib.Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class MutantResult:
    name: str  # a diff's file name, or a generated mutant's id
    header: str  # the diff's first line, or the generated mutant's description
    verdict: str = "pending"  # killed | survived | broken | equivalent
    detail: str = ""  # the first failing test, or why it is broken / timed out
    seconds: float = 0.0


@dataclasses.dataclass
class LabReport:
    lab: str  # repo-relative path
    mode: str  # hand | generated
    mutants: list[MutantResult] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    generated: int = 0  # generated mode: compiled mutants before any cap
    baseline_seconds: float = 0.0
    fingerprint: str = ""
    from_ledger: bool = False  # verdicts taken from mutants/ledger.json (a sample re-graded)

    def count(self, verdict: str) -> int:
        return sum(m.verdict == verdict for m in self.mutants)

    @property
    def survivors(self) -> list[MutantResult]:
        return [m for m in self.mutants if m.verdict == "survived"]

    @property
    def rate(self) -> float | None:
        """Generated mode: killed / (mutants - equivalent), in percent."""
        judged = len(self.mutants) - self.count("equivalent")
        return 100.0 * self.count("killed") / judged if judged else None

    def as_json(self) -> dict:
        data = {
            "lab": self.lab,
            "mode": self.mode,
            "mutants": len(self.mutants),
            "killed": self.count("killed"),
            "survived": self.count("survived"),
            "broken": self.count("broken"),
            "problems": self.problems,
            "notes": self.notes,
            "survivors": [
                {"name": m.name, "header": m.header} for m in self.survivors
            ],
            "results": [dataclasses.asdict(m) for m in self.mutants],
            "baseline_seconds": round(self.baseline_seconds, 2),
            "from_ledger": self.from_ledger,
        }
        if self.mode == "generated":
            data["generated"] = self.generated
            data["equivalent"] = self.count("equivalent")
            rate = self.rate
            data["kill_rate"] = None if rate is None else round(rate, 1)
        return data


# ---------------------------------------------------------------------------
# Hand-written mutants: unified diffs of solution.py
# ---------------------------------------------------------------------------

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_TARGETS = ("solution.py", "a/solution.py", "b/solution.py")


def _diff_target(line: str) -> str:
    return line[4:].split("\t")[0].strip()


def apply_diff(original: str, diff_text: str, label: str) -> str:
    """``original`` with the unified diff applied; CourseError naming ``label`` if it does not."""

    def fail(why: str) -> CourseError:
        return CourseError(f"{label}: {why}")

    lines = diff_text.splitlines()
    if not lines or not lines[0].startswith("#") or not lines[0].lstrip("#").strip():
        raise fail("the first line must be '# <the realistic bug this is>'")
    try:
        start = next(i for i, ln in enumerate(lines) if ln.startswith("--- "))
    except StopIteration:
        raise fail("no '--- a/solution.py' header: not a unified diff") from None
    if start + 1 >= len(lines) or not lines[start + 1].startswith("+++ "):
        raise fail("'--- ' is not followed by '+++ '")
    for ln in lines[start : start + 2]:
        if _diff_target(ln) not in _TARGETS:
            raise fail(f"diffs only solution.py, found header {ln!r}")

    src = original.splitlines(keepends=True)
    ends_with_newline = original.endswith("\n")
    out: list[str] = []
    cursor = 0  # next unconsumed line of src
    i = start + 2
    hunk_no = 0
    while i < len(lines):
        m = _HUNK.match(lines[i])
        if not m:
            if lines[i].strip() == "":
                i += 1
                continue
            raise fail(f"line {i + 1}: expected a hunk header '@@ -a,b +c,d @@'")
        hunk_no += 1
        old_len = int(m.group(2)) if m.group(2) is not None else 1
        new_len = int(m.group(4)) if m.group(4) is not None else 1
        old: list[str] = []
        new: list[str] = []
        no_newline_new = False
        i += 1
        last_kind = ""
        while i < len(lines) and (len(old) < old_len or len(new) < new_len or
                                  (i < len(lines) and lines[i].startswith("\\"))):
            ln = lines[i]
            kind, text = (ln[:1], ln[1:]) if ln else (" ", "")
            if kind == " ":
                old.append(text)
                new.append(text)
            elif kind == "-":
                old.append(text)
            elif kind == "+":
                new.append(text)
            elif kind == "\\":
                if last_kind in (" ", "+"):
                    no_newline_new = True
            else:
                raise fail(f"hunk {hunk_no}: unexpected line {ln!r}")
            last_kind = kind if kind != "\\" else last_kind
            i += 1
        if len(old) != old_len or len(new) != new_len:
            raise fail(f"hunk {hunk_no}: line counts do not match its header")
        expected = max(int(m.group(1)) - 1, 0) if old_len else int(m.group(1))
        at = _find_block(src, old, expected, cursor)
        if at is None:
            raise fail(f"hunk {hunk_no} does not apply to solution.py (context not found)")
        out += src[cursor:at]
        out += [t + "\n" for t in new]
        cursor = at + len(old)
        if no_newline_new and cursor >= len(src):
            ends_with_newline = False
    if hunk_no == 0:
        raise fail("no hunk")
    out += src[cursor:]
    text = "".join(out)
    if cursor >= len(src) and not ends_with_newline and text.endswith("\n"):
        text = text[:-1]
    if text == original:
        raise fail("the diff changes nothing")
    return text


def _find_block(src: list[str], block: list[str], expected: int, floor: int) -> int | None:
    stripped = [s.rstrip("\r\n") for s in src]

    def matches(at: int) -> bool:
        return at >= floor and at + len(block) <= len(src) and stripped[at : at + len(block)] == block

    for delta in range(len(src) + 1):
        for at in (expected - delta, expected + delta):
            if matches(at):
                return at
    return None


def read_hand_mutants(lab: pathlib.Path, root: pathlib.Path) -> list[tuple[MutantResult, str]]:
    """(result shell, mutated source) of every mutants/*.diff of ``lab``, sorted by name."""
    original = (lab / "solution.py").read_text(encoding="utf-8")
    found = []
    for diff in sorted((lab / "mutants").glob("*.diff")):
        label = diff.relative_to(root).as_posix() if diff.is_relative_to(root) else str(diff)
        text = diff.read_text(encoding="utf-8")
        mutated = apply_diff(original, text, label)
        header = text.splitlines()[0].lstrip("#").strip()
        found.append((MutantResult(diff.name, header), mutated))
    return found


# ---------------------------------------------------------------------------
# Generated mutants: operator-level changes made with ast
# ---------------------------------------------------------------------------

_CMP_SWAP = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
    ast.In: ast.NotIn, ast.NotIn: ast.In,
}
_BIN_SWAP: dict[type, tuple[type, ...]] = {
    ast.Add: (ast.Sub,), ast.Sub: (ast.Add,), ast.Mult: (ast.Div,),
    ast.Div: (ast.Mult, ast.FloorDiv), ast.FloorDiv: (ast.Div,), ast.Mod: (ast.FloorDiv,),
    ast.Pow: (ast.Mult,), ast.LShift: (ast.RShift,), ast.RShift: (ast.LShift,),
    ast.BitAnd: (ast.BitOr,), ast.BitOr: (ast.BitAnd,), ast.BitXor: (ast.BitOr,),
}


@dataclasses.dataclass
class GeneratedMutant:
    id: str
    description: str
    source: str


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Generator:
    def __init__(self, source: str) -> None:
        self.source = source
        self.data = source.encode("utf-8")
        self.line_starts = [0]
        for line in self.data.splitlines(keepends=True):
            self.line_starts.append(self.line_starts[-1] + len(line))
        self.found: list[GeneratedMutant] = []
        self.seen: set[str] = {source}
        self.function = ""

    def offset(self, line: int, col: int) -> int:
        return self.line_starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (
            self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
            self.offset(node.end_lineno, node.end_col_offset),  # type: ignore[attr-defined]
        )

    def add(self, node: ast.AST, kind: str, replacement: str,
            span: tuple[int, int] | None = None) -> None:
        start, end = span or self.span(node)
        new_data = self.data[:start] + replacement.encode("utf-8") + self.data[end:]
        new_source = new_data.decode("utf-8")
        if new_source in self.seen:
            return
        self.seen.add(new_source)
        try:
            compile(new_source, "solution.py", "exec")
        except SyntaxError:
            return  # a mutant that does not compile is skipped, never counted
        before = self.data[start:end].decode("utf-8")
        line, col = node.lineno, node.col_offset  # type: ignore[attr-defined]
        mid = f"{self.function}:{line}:{col}:{kind}"
        desc = f"line {line}: `{_short(before)}` -> `{_short(replacement)}`"
        self.found.append(GeneratedMutant(mid, desc, new_source))

    # -- walking ---------------------------------------------------------
    def function_body(self, qualname: str, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.function = qualname
        self.statements(fn.body, docstring_allowed=True)

    def statements(self, body: list[ast.stmt], docstring_allowed: bool = False) -> None:
        for index, stmt in enumerate(body):
            if (index == 0 and docstring_allowed and isinstance(stmt, ast.Expr)
                    and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)):
                continue
            self.statement(stmt, body)

    def statement(self, stmt: ast.stmt, body: list[ast.stmt]) -> None:
        if isinstance(stmt, ast.Assert | ast.Pass | ast.Global | ast.Nonlocal | ast.Import
                      | ast.ImportFrom):
            return
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            self.statements(stmt.body, docstring_allowed=True)
            return
        if isinstance(stmt, ast.Expr) and _is_print(stmt.value):
            return
        # a statement removed
        if not isinstance(stmt, ast.Return):
            self.add(stmt, "stmt-removed", "pass")
        if isinstance(stmt, ast.Return) and stmt.value is not None and not (
            isinstance(stmt.value, ast.Constant) and stmt.value.value is None
        ):
            self.add(stmt, "return-None", "return None")
        if isinstance(stmt, ast.AugAssign):
            for new_op in _BIN_SWAP.get(type(stmt.op), ()):
                mutated = ast.AugAssign(target=stmt.target, op=new_op(), value=stmt.value)
                self.add(stmt, f"{type(stmt.op).__name__}->{new_op.__name__}",
                         ast.unparse(mutated))
        if isinstance(stmt, ast.If):
            self.add(stmt.test, "if-False", "False")
            if len(stmt.orelse) == 1 and isinstance(stmt.orelse[0], ast.If):
                inner = stmt.orelse[0]
                at = self.offset(inner.lineno, inner.col_offset)
                if self.data[at : at + 4] == b"elif":
                    self.add(inner, "elif-if", "if", span=(at, at + 4))
        # descend into the expressions and the nested statement lists
        for field, value in ast.iter_fields(stmt):
            if field in ("annotation", "type_comment", "decorator_list", "returns"):
                continue
            if isinstance(value, list):
                if value and all(isinstance(v, ast.stmt) for v in value):
                    self.statements(value)
                else:
                    for v in value:
                        if isinstance(v, ast.AST):
                            self.expression(v)
            elif isinstance(value, ast.AST):
                self.expression(value)

    def expression(self, node: ast.AST) -> None:
        if isinstance(node, ast.JoinedStr | ast.Lambda):
            return
        if isinstance(node, ast.Call) and _is_print(node):
            return
        if isinstance(node, ast.excepthandler):
            if node.type is not None:  # type: ignore[attr-defined]
                self.expression(node.type)  # type: ignore[attr-defined]
            self.statements(node.body)  # type: ignore[attr-defined]
            return
        if isinstance(node, ast.match_case):
            self.statements(node.body)
            return
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                swap = _CMP_SWAP.get(type(op))
                if swap is None:
                    continue
                ops = list(node.ops)
                ops[i] = swap()
                mutated = ast.Compare(left=node.left, ops=ops, comparators=node.comparators)
                # a chained comparison (0 < t < n) has one mutant per operator: number them
                which = f"#{i}" if len(node.ops) > 1 else ""
                self.add(node, f"{type(op).__name__}->{swap.__name__}{which}",
                         f"({ast.unparse(mutated)})")
        elif isinstance(node, ast.BinOp):
            for new_op in _BIN_SWAP.get(type(node.op), ()):
                mutated = ast.BinOp(left=node.left, op=new_op(), right=node.right)
                self.add(node, f"{type(node.op).__name__}->{new_op.__name__}",
                         f"({ast.unparse(mutated)})")
        elif isinstance(node, ast.BoolOp):
            new_op = ast.Or if isinstance(node.op, ast.And) else ast.And
            mutated = ast.BoolOp(op=new_op(), values=node.values)
            self.add(node, f"{type(node.op).__name__}->{new_op.__name__}",
                     f"({ast.unparse(mutated)})")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not | ast.USub):
            kind = "not-dropped" if isinstance(node.op, ast.Not) else "minus-dropped"
            self.add(node, kind, f"({ast.unparse(node.operand)})")
        elif isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool):
                self.add(node, f"{value}->{not value}", repr(not value))
            elif isinstance(value, int):
                for new in ([1] if value == 0 else [value + 1, value - 1]):
                    self.add(node, f"{value}->{new}", repr(new))
            elif isinstance(value, float):
                new = 1.0 if value == 0.0 else value + 1.0
                self.add(node, f"{value!r}->{new!r}", repr(new))
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr_context | ast.operator | ast.cmpop | ast.boolop
                          | ast.unaryop):
                continue
            self.expression(child)


def _is_print(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "print")


def generate_mutants(solution_source: str, learner_names: set[str]) -> list[GeneratedMutant]:
    """Operator-level mutants of the functions named in ``learner_names``, in source order."""
    tree = ast.parse(solution_source)
    gen = _Generator(solution_source)
    for qualname, fn in sorted(labs_mod._functions(tree), key=lambda item: item[1].lineno):
        if qualname in learner_names:
            gen.function_body(qualname, fn)
    return gen.found


def unique_ids(mutants: list[GeneratedMutant]) -> list[GeneratedMutant]:
    """The same mutants, each with an id of its own.

    An id names the function, the line and column where the mutated node starts, and the
    operator change. Nested nodes of one left-associative chain (``a * b * c``) start at the same
    column, so two different mutants can share an id; the second and later ones get ``@2``,
    ``@3``, ... in source order. A lab with no such chain keeps every id it had, so its recorded
    verdicts and its ``equivalent.txt`` stay valid.
    """
    seen: collections.Counter[str] = collections.Counter()
    out: list[GeneratedMutant] = []
    for g in mutants:
        seen[g.id] += 1
        out.append(g if seen[g.id] == 1 else dataclasses.replace(g, id=f"{g.id}@{seen[g.id]}"))
    return out


def read_equivalent(lab: pathlib.Path, root: pathlib.Path) -> dict[str, str]:
    path = lab / "mutants" / EQUIVALENT_FILE
    if not path.is_file():
        return {}
    label = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    entries: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        # the reason follows whitespace and "#" (an id itself may hold "#": Lt->LtE#1)
        parts = re.split(r"\s+#", line, maxsplit=1)
        mid, sep, reason = (parts[0], "#", parts[1]) if len(parts) == 2 else (line, "", "")
        if not sep or not reason.strip() or len(mid.split()) != 1:
            raise CourseError(f"{label} line {number}: expected '<mutant id>  # <reason>'")
        entries[mid.strip()] = reason.strip()
    return entries


# ---------------------------------------------------------------------------
# The ledger: verdicts of the last full run, under a fingerprint of what they depend on
# ---------------------------------------------------------------------------


def _grader_source() -> str:
    """The code whose change changes a verdict: the generator, the diff reader, the grading."""
    parts = [_Generator, generate_mutants, apply_diff, _child, classify, _timeout_for,
             labs_mod.learner_functions]
    return "\n".join(inspect.getsource(obj) for obj in parts)


def _module_file(root: pathlib.Path, dotted: str) -> pathlib.Path | None:
    base = root.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _repo_imports(lab: pathlib.Path, root: pathlib.Path) -> set[pathlib.Path]:
    """Repository modules that the lab's own Python files import by name (not transitively)."""
    found: set[pathlib.Path] = set()
    for path in lab.glob("*.py"):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            dotted: list[str] = []
            if isinstance(node, ast.Import):
                dotted = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import name`: name may be a submodule or an attribute
                dotted = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in dotted:
                if name.split(".")[0] in REPO_PACKAGES:
                    module = _module_file(root, name)
                    if module is not None:
                        found.add(module)
    if found & {p for p in root.joinpath("course").glob("*.py")}:
        found.update((root / "course" / "__init__.py", root / "course" / "loader.py"))
    return {p for p in found if p.is_file()}


def fingerprint(lab: pathlib.Path, root: pathlib.Path, mode: str, max_generated: int) -> str:
    """SHA-256 of everything a lab's verdicts depend on that this repository holds."""
    files: set[pathlib.Path] = set()
    for path in lab.rglob("*"):
        rel = path.relative_to(lab)
        if not path.is_file() or path.suffix == ".md":
            continue
        if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            continue
        if rel.as_posix() == f"mutants/{LEDGER_FILE}":
            continue
        files.add(path)
    folder = lab
    while True:
        if (folder / "conftest.py").is_file():
            files.add(folder / "conftest.py")
        if folder == root or folder == folder.parent:
            break
        folder = folder.parent
    files |= _repo_imports(lab, root)
    digest = hashlib.sha256()
    header = f"ledger {LEDGER_FORMAT} {mode} {max_generated if mode == 'generated' else ''}"
    digest.update(header.encode() + b"\0")
    digest.update(hashlib.sha256(_grader_source().encode()).digest())
    for path in sorted(files, key=lambda p: _rel(p, root)):
        digest.update(_rel(path, root).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def read_ledger(lab: pathlib.Path) -> dict:
    path = lab / "mutants" / LEDGER_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise CourseError(f"{path}: not JSON ({exc}); delete it or run --update-ledger") from exc
    return data if isinstance(data, dict) and data.get("format") == LEDGER_FORMAT else {}


def write_ledger(lab: pathlib.Path, report: LabReport) -> None:
    path = lab / "mutants" / LEDGER_FILE
    data = read_ledger(lab) or {"format": LEDGER_FORMAT}
    data[report.mode] = {
        "fingerprint": report.fingerprint,
        "verdicts": {m.name: m.verdict for m in report.mutants if m.verdict != "equivalent"},
    }
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _agree(recorded: str, now: str, generated: bool) -> bool:
    """Whether a re-graded verdict confirms the ledger's. A generated mutant that crashes the test
    run (``broken``: Triton's interpreter does, now and then) and one that fails a test
    (``killed``) both did not survive; a hand-written mutant must match exactly."""
    if generated and {recorded, now} <= {"killed", "broken"}:
        return True
    return recorded == now


def spot_sample(report: LabReport, pending: list[int]) -> list[int]:
    """The mutants a --ledger run re-grades: seeded by the fingerprint, so CI repeats itself."""
    k = SPOT_CHECK[report.mode]
    if len(pending) <= k:
        return list(pending)
    return sorted(random.Random(report.fingerprint).sample(pending, k))


# ---------------------------------------------------------------------------
# Running: warm workers that fork one pytest per mutant
# ---------------------------------------------------------------------------


def _lab_imports(lab: pathlib.Path) -> set[str]:
    wanted: set[str] = set()
    for name in ("test_lab.py", "solution.py"):
        path = lab / name
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            wanted.update(n for n in names if n.split(".")[0] in PRELOAD_ROOTS)
    if any(call in (lab / "test_lab.py").read_text(encoding="utf-8", errors="replace")
           for call in ('gguf_reader("smollm2")', "gguf_reader('smollm2')")):
        # the shared GGUF parse (seconds, mostly tokenizer strings): once per worker, and every
        # forked child finds it in hub.gguf_reader's cache
        wanted.add(WARM_PREFIX + "mini_vllm.models.hub:gguf_reader:smollm2")
    if any(n.split(".")[0] == "torch" for n in wanted):
        # torch.compile and make_fx import Dynamo on first use (about 3 s): once per worker
        # rather than once per mutant
        wanted.add("torch._dynamo")
    return wanted


@dataclasses.dataclass
class _Job:
    key: tuple[int, int]  # (lab index, mutant index; -1 is the unmutated baseline)
    lab: pathlib.Path
    source: str
    timeout: float


def _worker_env(root: pathlib.Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONHASHSEED="0",
        PYTHONDONTWRITEBYTECODE="1",
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p
    )
    nvidia = pathlib.Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None
    if not nvidia:  # as the root conftest does: Triton kernels run in its interpreter
        env.setdefault("TRITON_INTERPRET", "1")
    return env


class _Pool:
    """``jobs`` warm worker processes; ``run`` grades a list of jobs on them."""

    def __init__(self, root: pathlib.Path, jobs: int, preload: list[str], tmp: pathlib.Path):
        self.root = root
        self.tmp = tmp
        self.workers: list[tuple[subprocess.Popen[str], pathlib.Path]] = []
        env = _worker_env(root)
        for n in range(jobs):
            log = tmp / f"worker-{n}.log"
            with open(log, "w", encoding="utf-8") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-c", "from course.mutants import _worker_main; "
                     "_worker_main()", json.dumps(preload)],
                    cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=err, text=True, bufsize=1,
                )
            self.workers.append((proc, log))
        self.counter = 0

    def close(self) -> None:
        for proc, _ in self.workers:
            try:
                if proc.stdin:
                    proc.stdin.close()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()

    def _prepare(self, job: _Job) -> pathlib.Path:
        """A folder holding the lab's other files and the mutated solution.py."""
        self.counter += 1
        where = self.tmp / f"m{self.counter}" / job.lab.name
        where.mkdir(parents=True)
        for item in job.lab.iterdir():
            if item.is_file() and item.name not in ("solution.py", "starter.py", "test_lab.py"):
                shutil.copy2(item, where / item.name)
        impl = where / "solution.py"
        impl.write_text(job.source, encoding="utf-8")
        return impl

    def run(self, jobs: list[_Job], on_done=None) -> dict[tuple[int, int], dict]:
        todo: queue.Queue[_Job] = queue.Queue()
        for job in jobs:
            todo.put(job)
        results: dict[tuple[int, int], dict] = {}
        lock = threading.Lock()
        failures: list[str] = []

        def serve(proc: subprocess.Popen[str], log: pathlib.Path) -> None:
            while not failures:
                try:
                    job = todo.get_nowait()
                except queue.Empty:
                    return
                with lock:
                    impl = self._prepare(job)
                request = {
                    "test": str(job.lab / "test_lab.py"),
                    "impl": str(impl),
                    "root": str(self.root),
                    "timeout": job.timeout,
                    "result": str(impl.parent.parent / "result.json"),
                    "log": str(impl.parent.parent / "pytest.log"),
                }
                try:
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write(json.dumps(request) + "\n")
                    proc.stdin.flush()
                    line = proc.stdout.readline()
                except OSError:
                    line = ""
                if not line:
                    tail = log.read_text(encoding="utf-8", errors="replace").strip()
                    failures.append(" | ".join(tail.splitlines()[-3:]) or "no output")
                    return
                result = json.loads(line)
                shutil.rmtree(impl.parent.parent, ignore_errors=True)
                with lock:
                    results[job.key] = result
                    if on_done:
                        on_done(job, result)

        threads = [threading.Thread(target=serve, args=w, daemon=True) for w in self.workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failures:
            raise CourseError(f"a mutant worker died: {failures[0]}")
        return results


class _Collector:
    """A pytest plugin that records what the child's test run did."""

    def __init__(self) -> None:
        self.collect_errors: list[str] = []
        self.failed: list[str] = []
        self.passed = 0

    def pytest_collectreport(self, report) -> None:  # noqa: ANN001
        if report.failed:
            self.collect_errors.append(_first_line(report.longreprtext) or report.nodeid)

    def pytest_runtest_logreport(self, report) -> None:  # noqa: ANN001
        if report.failed:
            message = _first_line(report.longreprtext)
            self.failed.append(f"{report.nodeid.split('::')[-1]}: {message}")
        elif report.when == "call" and report.passed:
            self.passed += 1


def _first_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("E ") and len(ln[1:].strip()) > 3:
            return _short(ln[1:].strip(), 120)
    return _short(lines[-1], 120) if lines else ""


def _child(request: dict) -> None:
    """Runs in the forked child: grade one file, write the verdict, never return."""
    code = 3
    try:
        os.setpgid(0, 0)
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.chdir(request["root"])
        os.environ["LAB_IMPL"] = "starter"
        os.environ["LAB_IMPL_FILE"] = request["impl"]
        random.seed(0)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(0)
        import pytest

        collector = _Collector()
        exit_code = pytest.main(
            [request["test"], "-q", "-x", "-p", "no:cacheprovider", "--import-mode=importlib",
             f"--rootdir={request['root']}", "-m", "not gpu", "--tb=short",
             "-W", "ignore::pytest.PytestAssertRewriteWarning"],
            plugins=[collector],
        )
        result = {
            "exit": int(exit_code),
            "collect_errors": collector.collect_errors,
            "failed": collector.failed,
            "passed": collector.passed,
        }
        with open(request["result"], "w", encoding="utf-8") as fh:
            json.dump(result, fh)
        code = 0
    except BaseException as exc:  # noqa: BLE001 - report anything, never return
        try:
            with open(request["result"], "w", encoding="utf-8") as fh:
                json.dump({"exit": -1, "collect_errors": [f"{type(exc).__name__}: {exc}"],
                           "failed": [], "passed": 0}, fh)
        except OSError:
            pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _worker_main() -> None:
    """A warm worker: import the heavy modules once, then fork a child per request."""
    sys.dont_write_bytecode = True
    out = sys.stdout
    for name in ["pytest", "_pytest.python", "_pytest.main", "hypothesis",
                 *json.loads(sys.argv[1] if len(sys.argv) > 1 else "[]")]:
        try:
            if name.startswith(WARM_PREFIX):  # "warm:module:function:argument"
                module, function, argument = name[len(WARM_PREFIX):].split(":")
                getattr(importlib.import_module(module), function)(argument)
            else:
                __import__(name)
        except Exception:  # noqa: BLE001 - a preload is only an optimisation
            pass
    try:  # pytest's plugins (hypothesis, anyio, ...): else each child imports them again
        from importlib.metadata import entry_points

        for ep in entry_points(group="pytest11"):
            try:
                ep.load()
            except Exception:  # noqa: BLE001
                pass
    except ImportError:
        pass
    try:
        from hypothesis import Phase, settings

        # derandomized: the same examples every run; no shrinking: a failing example
        # already kills the mutant, and shrinking it only costs time
        settings.register_profile(
            HYPOTHESIS_PROFILE, derandomize=True, database=None, deadline=None,
            print_blob=False, report_multiple_bugs=False,
            phases=[Phase.explicit, Phase.reuse, Phase.generate],
        )
        settings.load_profile(HYPOTHESIS_PROFILE)
    except ImportError:
        pass
    for line in sys.stdin:
        request = json.loads(line)
        out.flush()
        sys.stderr.flush()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(request)
        timed_out = False
        while True:
            done, _status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() - started > request["timeout"]:
                timed_out = True
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.01)
        # a test may have left grandchildren in the group: end them too
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            with open(request["result"], encoding="utf-8") as fh:
                result = json.load(fh)
        except (OSError, ValueError):
            log = ""
            try:
                with open(request["log"], encoding="utf-8", errors="replace") as fh:
                    log = _first_line(fh.read())
            except OSError:
                pass
            result = {"exit": -1, "collect_errors": [log or "the test run died"],
                      "failed": [], "passed": 0}
        result["timed_out"] = timed_out
        result["seconds"] = round(time.monotonic() - started, 3)
        out.write(json.dumps(result) + "\n")
        out.flush()


def classify(result: dict) -> tuple[str, str]:
    """(verdict, detail) of one graded copy."""
    if result.get("timed_out"):
        return "killed", f"timed out after {result['seconds']:.0f} s"
    if result["collect_errors"]:
        return "broken", result["collect_errors"][0]
    if result["failed"]:
        return "killed", result["failed"][0]
    if result["passed"] == 0:
        return "broken", "no test ran (every test skipped or deselected)"
    return "survived", ""


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------


def resolve_labs(root: pathlib.Path, lab_args: list[str]) -> list[pathlib.Path]:
    if not lab_args:
        return labs_mod.find_labs(root)
    labs = []
    for arg in lab_args:
        candidates = [pathlib.Path(arg), root / arg]
        lab = next((c.resolve() for c in candidates if c.is_dir()), None)
        if lab is None:
            raise CourseError(f"LAB {arg}: no such folder")
        for needed in ("solution.py", "test_lab.py"):
            if not (lab / needed).is_file():
                raise CourseError(f"LAB {arg}: not a lab folder (no {needed})")
        if lab not in labs:
            labs.append(lab)
    return labs


def _rel(path: pathlib.Path, root: pathlib.Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def _timeout_for(baseline: float, override: float | None) -> float:
    if override is not None:
        return override
    return max(20.0, 4 * baseline + 10.0)


def collect(root: pathlib.Path, labs: list[pathlib.Path], generated: bool, max_generated: int
            ) -> tuple[list[LabReport], list[list[tuple[MutantResult, str]]]]:
    reports: list[LabReport] = []
    sources: list[list[tuple[MutantResult, str]]] = []
    for lab in labs:
        report = LabReport(_rel(lab, root), "generated" if generated else "hand")
        if not generated:
            found = read_hand_mutants(lab, root) if (lab / "mutants").is_dir() else []
        else:
            found = []
            starter = lab / "starter.py"
            solution_src = (lab / "solution.py").read_text(encoding="utf-8")
            try:
                names = labs_mod.learner_functions(ast.parse(starter.read_text(encoding="utf-8")))
                ast.parse(solution_src)
            except (OSError, SyntaxError, ValueError) as exc:
                report.problems.append(f"cannot read starter.py / solution.py: {exc}")
                names = set()
            if names:
                gen = unique_ids(generate_mutants(solution_src, names))
                report.generated = len(gen)
                equivalent = read_equivalent(lab, root)
                known = {g.id for g in gen}
                stale = sorted(set(equivalent) - known)
                if stale:
                    report.notes.append(
                        f"{len(stale)} id(s) in mutants/{EQUIVALENT_FILE} match no generated "
                        f"mutant (stale?): {', '.join(stale[:5])}"
                    )
                if len(gen) > max_generated:
                    rng = random.Random(f"{report.lab}:{len(gen)}")
                    keep = set(rng.sample(range(len(gen)), max_generated))
                    gen = [g for i, g in enumerate(gen) if i in keep]
                    report.notes.append(
                        f"{report.generated} generated; a seeded sample of {max_generated} "
                        f"was run (--max-generated)"
                    )
                for g in gen:
                    shell = MutantResult(g.id, g.description)
                    if g.id in equivalent:
                        shell.verdict = "equivalent"
                        shell.detail = equivalent[g.id]
                    found.append((shell, g.source))
            elif not report.problems:
                report.notes.append("no learner function (nothing raises NotImplementedError)")
        report.mutants = [shell for shell, _ in found]
        reports.append(report)
        sources.append(found)
    return reports, sources


def use_ledger(lab: pathlib.Path, report: LabReport, found: list[tuple[MutantResult, str]]
               ) -> dict[str, str] | None:
    """The ledger's verdicts when its fingerprint and mutant names still match, else None.

    On a match every pending mutant takes its recorded verdict except a seeded sample, which
    stays pending to be graded again and compared.
    """
    entry = read_ledger(lab).get(report.mode)
    pending = [j for j, (shell, _) in enumerate(found) if shell.verdict == "pending"]
    if not entry or entry.get("fingerprint") != report.fingerprint:
        return None
    recorded: dict[str, str] = entry.get("verdicts", {})
    names = [found[j][0].name for j in pending]
    # ids are unique (unique_ids); a hand-written mutants/ folder cannot repeat a file name
    # either, but a record keyed by id must never pair one verdict with two mutants.
    if len(names) != len(set(names)) or set(recorded) != set(names):
        return None
    sample = set(spot_sample(report, pending))
    for j in pending:
        if j not in sample:
            shell = found[j][0]
            shell.verdict, shell.detail = recorded[shell.name], "from the ledger"
    report.from_ledger = True
    return recorded


def run_all(root: pathlib.Path, labs: list[pathlib.Path], *, generated: bool = False,
            jobs: int = DEFAULT_JOBS, timeout: float | None = None,
            max_generated: int = DEFAULT_MAX_GENERATED, progress: bool = False,
            ledger: bool = False) -> list[LabReport]:
    reports, sources = collect(root, labs, generated, max_generated)
    recorded: dict[int, dict[str, str]] = {}
    for i, lab in enumerate(labs):
        reports[i].fingerprint = fingerprint(lab, root, reports[i].mode, max_generated)
        if ledger and sources[i] and not reports[i].problems:
            verdicts = use_ledger(lab, reports[i], sources[i])
            if verdicts is not None:
                recorded[i] = verdicts
    preload = sorted(set().union(*[_lab_imports(lab) for lab in labs])) if labs else []
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="course-mutants-"))
    total = sum(1 for found in sources for shell, _ in found if shell.verdict == "pending")
    done = [0]

    def tick(job: _Job, result: dict) -> None:
        done[0] += 1
        if progress:
            print(f"\r  graded {done[0]}/{total + len(labs)}", end="", file=sys.stderr,
                  flush=True)

    try:
        pool = _Pool(root, max(1, jobs), preload, tmp)
        try:
            baseline_jobs = [
                _Job((i, -1), lab, (lab / "solution.py").read_text(encoding="utf-8"), 600.0)
                for i, lab in enumerate(labs) if sources[i]
            ]
            base = pool.run(baseline_jobs, tick)
            mutant_jobs = []
            for i, lab in enumerate(labs):
                if not sources[i]:
                    continue
                result = base[(i, -1)]
                reports[i].baseline_seconds = result["seconds"]
                verdict, detail = classify(result)
                if verdict != "survived":
                    reports[i].problems.append(
                        f"the tests do not pass on solution.py ({verdict}: {detail})"
                    )
                    for shell, _ in sources[i]:
                        if shell.verdict == "pending":
                            shell.verdict, shell.detail = "not run", "solution.py fails"
                    continue
                limit = _timeout_for(result["seconds"], timeout)
                for j, (shell, src) in enumerate(sources[i]):
                    if shell.verdict == "pending":
                        mutant_jobs.append(_Job((i, j), lab, src, limit))
            # the slowest labs first, so the two workers finish together
            mutant_jobs.sort(key=lambda jb: -reports[jb.key[0]].baseline_seconds)
            results = pool.run(mutant_jobs, tick)
        finally:
            pool.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if progress and total:
            print("\r" + " " * 40 + "\r", end="", file=sys.stderr, flush=True)
    for (i, j), result in sorted(results.items()):
        shell = sources[i][j][0]
        shell.verdict, shell.detail = classify(result)
        shell.seconds = result["seconds"]
        if i in recorded and not _agree(recorded[i][shell.name], shell.verdict, generated):
            reports[i].problems.append(
                f"the ledger disagrees: {shell.name} was {recorded[i][shell.name]} in "
                f"mutants/{LEDGER_FILE}, {shell.verdict} now; grade the lab in full "
                "(--update-ledger)"
            )
    for i, report in enumerate(reports):
        if i in recorded:
            checked = sum(1 for (li, _j) in results if li == i)
            report.notes.append(
                f"verdicts from mutants/{LEDGER_FILE} (fingerprint {report.fingerprint[:12]}); "
                f"{checked} re-graded as a spot check"
            )
        if not generated:
            for shell in report.mutants:
                if shell.verdict == "broken":
                    report.problems.append(f"mutants/{shell.name} is broken: {shell.detail}")
    return reports


def format_table(reports: list[LabReport], generated: bool, threshold: float,
                 min_mutants: int) -> list[str]:
    lines: list[str] = []
    width = max([len(r.lab) for r in reports] + [3])
    if generated:
        lines.append(f"{'LAB':<{width}}  GENERATED  EQUIV  KILLED  SURVIVED  RATE")
    else:
        lines.append(f"{'LAB':<{width}}  MUTANTS  KILLED  SURVIVED  BROKEN")
    for r in reports:
        if generated:
            rate = r.rate
            shown = "  -  " if rate is None else f"{rate:5.1f}%"
            flag = "" if rate is None or rate >= threshold else f"  < {threshold:g}%"
            lines.append(
                f"{r.lab:<{width}}  {len(r.mutants):>9}  {r.count('equivalent'):>5}  "
                f"{r.count('killed'):>6}  {r.count('survived'):>8}  {shown}{flag}"
            )
        else:
            lines.append(
                f"{r.lab:<{width}}  {len(r.mutants):>7}  {r.count('killed'):>6}  "
                f"{r.count('survived'):>8}  {r.count('broken'):>6}"
            )
        for m in r.survivors:
            lines.append(f"    survived  {m.name}  # {m.header}")
        for problem in r.problems:
            lines.append(f"    problem   {problem}")
        if not generated and len(r.mutants) < min_mutants and not r.problems:
            lines.append(f"    problem   {len(r.mutants)} mutants (at least {min_mutants} wanted)")
        for note in r.notes:
            lines.append(f"    note      {note}")
    return lines


def failed(r: LabReport, generated: bool, threshold: float, min_mutants: int) -> bool:
    if r.problems or r.count("broken") and not generated:
        return True
    if generated:
        rate = r.rate
        return rate is not None and rate < threshold
    return bool(r.survivors) or len(r.mutants) < min_mutants


def main(root: pathlib.Path, lab_args: list[str], *, generated: bool = False,
         jobs: int = DEFAULT_JOBS, threshold: float = DEFAULT_THRESHOLD,
         json_path: str | None = None, min_mutants: int = DEFAULT_MIN_MUTANTS,
         max_generated: int = DEFAULT_MAX_GENERATED, timeout: float | None = None,
         ledger: bool = False, update_ledger: bool = False) -> int:
    if jobs < 1:
        raise CourseError(f"-j {jobs}: must be at least 1")
    if not 0 <= threshold <= 100:
        raise CourseError(f"--threshold {threshold}: must be between 0 and 100")
    if max_generated < 1:
        raise CourseError(f"--max-generated {max_generated}: must be at least 1")
    if timeout is not None and timeout <= 0:
        raise CourseError(f"--timeout {timeout}: must be positive (seconds)")
    root = root.resolve()
    labs = resolve_labs(root, lab_args)
    if not labs:
        print(f"no lab folders (phase-*/labs/lab-*/) under {root}: nothing to run")
        return 0
    started = time.monotonic()
    reports = run_all(root, labs, generated=generated, jobs=jobs, timeout=timeout,
                      max_generated=max_generated, progress=sys.stderr.isatty(),
                      ledger=ledger)
    elapsed = time.monotonic() - started
    if update_ledger:
        for lab, report in zip(labs, reports):
            if not report.from_ledger and report.mutants and not any(
                    "do not pass on solution.py" in p for p in report.problems):
                write_ledger(lab, report)
    for line in format_table(reports, generated, threshold, min_mutants):
        print(line)
    bad = [r for r in reports if failed(r, generated, threshold, min_mutants)]
    ran = sum(1 for r in reports for m in r.mutants if m.verdict not in ("equivalent", "not run"))
    what = "generated" if generated else "hand-written"
    reused = [r for r in reports if r.from_ledger]
    print(f"\n{len(reports)} labs, {ran} {what} mutants graded in {elapsed:.1f} s on "
          f"{jobs} worker(s); {len(bad)} lab(s) failing")
    if ledger:
        print(f"ledger: {len(reused)} lab(s) taken from mutants/{LEDGER_FILE} with a spot check, "
              f"{len(reports) - len(reused)} graded in full")
    if json_path:
        data = {
            "mode": "generated" if generated else "hand",
            "threshold": threshold if generated else None,
            "seconds": round(elapsed, 1),
            "jobs": jobs,
            "labs": [r.as_json() for r in reports],
        }
        pathlib.Path(json_path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return 1 if bad else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("labs", nargs="*", metavar="LAB",
                        help="lab folders (default: every phase-*/labs/lab-*/)")
    parser.add_argument("--root", metavar="DIR", help="repository root (default: this repo)")
    parser.add_argument("--generated", action="store_true",
                        help="operator-level mutants of the learner functions, made with ast")
    parser.add_argument("-j", "--jobs", type=int, default=DEFAULT_JOBS, metavar="N",
                        help=f"parallel workers (default {DEFAULT_JOBS})")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, metavar="PCT",
                        help=f"--generated: lowest kill rate per lab (default {DEFAULT_THRESHOLD:g})")
    parser.add_argument("--min-mutants", type=int, default=DEFAULT_MIN_MUTANTS, metavar="N",
                        help=f"hand-written mutants each lab needs (default {DEFAULT_MIN_MUTANTS})")
    parser.add_argument("--max-generated", type=int, default=DEFAULT_MAX_GENERATED, metavar="N",
                        help="run a seeded sample of N when a lab has more generated mutants "
                        f"(default {DEFAULT_MAX_GENERATED})")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="seconds per mutant (default: 4 x the solution's run + 10, >= 20)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--ledger", action="store_true",
                        help=f"take a lab's verdicts from mutants/{LEDGER_FILE} when its "
                        "fingerprint matches, re-grading a seeded sample (what CI runs)")
    parser.add_argument("--update-ledger", action="store_true",
                        help=f"write mutants/{LEDGER_FILE} for every lab graded in full")

