"""``python -m course progress [PHASE ...]``: how far the learner's starters have come.

Each lab's tests run against its ``starter.py`` (``LAB_IMPL=starter``), the file the
learner fills in, and the lab gets one of four verdicts:

* ``done``: every test that ran passed;
* ``in progress``: some tests pass (``k/n`` says how many);
* ``not started``: every test fails by ``NotImplementedError``, as shipped;
* ``broken``: the starter does not import (the first error line is shown), or a
  test fails some other way and none pass.

Results are cached in ``build/progress.json`` under a hash of every file of the
lab folder (``mutants/`` aside), so after the first run only the labs whose files
changed run again. Labs are listed per phase in the recommended order, with totals.
Exit status 0 (progress is not a failure), 2 for a phase that does not exist.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import tempfile

from course import labs as labs_mod
from course import nav
from course.errors import CourseError

CACHE = pathlib.Path("build") / "progress.json"
CACHE_VERSION = 1
VERDICTS = ("done", "in progress", "not started", "broken")


@dataclasses.dataclass
class LabProgress:
    lab: str  # repo-relative path
    verdict: str
    passed: int
    total: int
    detail: str = ""


def lab_hash(lab: pathlib.Path) -> str:
    digest = hashlib.sha256(f"v{CACHE_VERSION}".encode())
    for path in sorted(lab.rglob("*")):
        rel = path.relative_to(lab)
        if not path.is_file() or rel.parts[0] in ("mutants", "__pycache__"):
            continue
        digest.update(rel.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def verdict(outcomes: list[labs_mod.Outcome], collection_error: str | None) -> tuple[str, str]:
    if collection_error is not None:
        return "broken", collection_error
    ran = [o for o in outcomes if o.status != "skipped"]
    passed = [o for o in ran if o.status == "passed"]
    if ran and len(passed) == len(ran):
        return "done", ""
    if passed:
        return "in progress", ""
    not_impl = [o for o in ran if "NotImplementedError" in o.message]
    if ran and len(not_impl) == len(ran):
        return "not started", ""
    other = next((o for o in ran if o not in not_impl), None)
    return "broken", labs_mod._first_error_line(other.message) if other else "no test ran"


def select_phases(root: pathlib.Path, wanted: list[str]) -> list[pathlib.Path]:
    phases = nav.phases(root)
    if not wanted:
        return phases
    chosen = []
    for w in wanted:
        key = w.strip("/").removeprefix("phase-")
        match = [p for p in phases if p.name.removeprefix("phase-").startswith(key.zfill(2))
                 or p.name == w.strip("/")]
        if not match:
            names = ", ".join(p.name[6:8] for p in phases)
            raise CourseError(f"PHASE {w!r}: no such phase (choose from {names})")
        chosen += [p for p in match if p not in chosen]
    return chosen


def grade(root: pathlib.Path, labs: list[pathlib.Path]) -> dict[pathlib.Path, LabProgress]:
    """Run the starters of ``labs`` (two processes, one per core)."""
    results: dict[pathlib.Path, LabProgress] = {}
    runnable = [lab for lab in labs if (lab / "test_lab.py").is_file()]
    halves = [h for h in (runnable[0::2], runnable[1::2]) if h]
    with tempfile.TemporaryDirectory(prefix="course-progress-") as tmp:
        procs = []
        for i, half in enumerate(halves):
            xml = pathlib.Path(tmp) / f"progress-{i}.xml"
            procs.append((labs_mod.run_pytest(root, half, "starter", xml), xml, half))
        for proc, xml, half in procs:
            output, _ = proc.communicate(timeout=labs_mod.PYTEST_TIMEOUT_S)
            if not xml.is_file():
                tail = " | ".join(output.strip().splitlines()[-3:])
                raise CourseError(f"pytest wrote no report: {tail}")
            run = labs_mod.parse_junit(xml, root, half)
            for lab in half:
                outcomes = run.cases.get(lab, [])
                v, detail = verdict(outcomes, run.collection_errors.get(lab))
                ran = [o for o in outcomes if o.status != "skipped"]
                results[lab] = LabProgress(
                    lab.relative_to(root).as_posix(), v,
                    sum(o.status == "passed" for o in ran), len(ran), detail,
                )
    return results


def _load_cache(path: pathlib.Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def progress(root: pathlib.Path, wanted: list[str], use_cache: bool = True):
    phases = select_phases(root, wanted)
    cache_path = root / CACHE
    cache = _load_cache(cache_path) if use_cache else {}
    ordered = [(phase, nav.lab_order(phase)) for phase in phases]
    hashes = {lab: lab_hash(lab) for _, ls in ordered for lab in ls}
    results: dict[pathlib.Path, LabProgress] = {}
    stale = []
    for lab, h in hashes.items():
        entry = cache.get(lab.relative_to(root).as_posix())
        if entry and entry.get("hash") == h:
            results[lab] = LabProgress(**entry["result"])
        else:
            stale.append(lab)
    if stale:
        results.update(grade(root, stale))
        for lab in stale:
            cache[lab.relative_to(root).as_posix()] = {
                "hash": hashes[lab], "result": dataclasses.asdict(results[lab])
            }
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(cache_path)
    return [(phase, [results[lab] for lab in ls if lab in results]) for phase, ls in ordered], len(stale)


def format_report(table) -> list[str]:
    lines = []
    grand = {v: 0 for v in VERDICTS}
    for phase, rows in table:
        lines.append(phase.name)
        for r in rows:
            score = f"{r.passed}/{r.total} tests"
            extra = f"  ({r.detail})" if r.detail else ""
            lines.append(f"  {r.lab.split('/')[-1]:<34} {r.verdict:<12} {score}{extra}")
            grand[r.verdict] += 1
        done = sum(r.verdict == "done" for r in rows)
        lines.append(f"  {done} of {len(rows)} labs done")
        lines.append("")
    total = sum(grand.values())
    lines.append(f"total: {grand['done']} of {total} labs done, "
                 + ", ".join(f"{grand[v]} {v}" for v in VERDICTS[1:]))
    return lines


def main(root: pathlib.Path, wanted: list[str], use_cache: bool = True) -> int:
    table, ran = progress(root, wanted, use_cache)
    for line in format_report(table):
        print(line)
    print(f"({ran} lab{'s' if ran != 1 else ''} graded now, the rest from build/progress.json)")
    return 0
