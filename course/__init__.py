"""Tooling for the vLLM Mastery course: the lab loader, the upstream pin,
the citation checker, the lab-contract checker and the book builder.

Run ``python -m course --help`` for the command line.
"""
from course.loader import load_impl

__all__ = ["load_impl"]
