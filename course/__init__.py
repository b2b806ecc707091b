"""Tooling for the vLLM Mastery course: the lab loader, the upstream pin,
the citation checker, the lab-contract checker and the book builder.

Run ``python -m course --help`` for the command line.
"""
import pathlib

from course.loader import load_impl

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
UPSTREAM = REPO_ROOT / "upstream"  # vLLM at the pin: python -m course upstream

__all__ = ["REPO_ROOT", "UPSTREAM", "load_impl"]
