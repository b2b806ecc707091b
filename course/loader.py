"""The one way a lab's tests get the code under test.

Every ``test_lab.py`` starts with::

    from course import load_impl
    impl = load_impl(__file__)

``impl`` is the lab's ``solution.py`` by default and its ``starter.py`` when the
environment variable ``LAB_IMPL=starter`` is set. Modules are imported by file
path under a name unique to the lab folder, so seventy folders that all hold a
``starter.py`` never collide in ``sys.modules``.

Tools that grade another version of a lab's code in place (``python -m course
mutants`` and ``python -m course progress``) set ``LAB_IMPL_FILE`` to that file:
it is loaded instead of ``solution.py`` / ``starter.py``. Run one lab's tests
at a time with it.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import sys
from types import ModuleType

ALLOWED_IMPLS = ("solution", "starter")
ENV_VAR = "LAB_IMPL"
FILE_ENV_VAR = "LAB_IMPL_FILE"


class LabImplError(ValueError):
    """LAB_IMPL holds a value other than the allowed ones."""


def selected_impl() -> str:
    """The implementation LAB_IMPL asks for; 'solution' when unset."""
    value = os.environ.get(ENV_VAR, "").strip() or "solution"
    if value not in ALLOWED_IMPLS:
        raise LabImplError(
            f"{ENV_VAR}={value!r} is not allowed: use one of {', '.join(ALLOWED_IMPLS)}"
        )
    return value


def _module_name(path: pathlib.Path) -> str:
    slug = re.sub(r"\W", "_", str(path.with_suffix("")))
    return f"_course_lab_{slug}"


def import_path(path: str | os.PathLike[str]) -> ModuleType:
    """Import one Python file by path, under a name derived from its full path."""
    path = pathlib.Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no such lab file: {path}")
    name = _module_name(path)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_impl(test_file: str | os.PathLike[str], impl: str | None = None) -> ModuleType:
    """Load ``solution.py`` or ``starter.py`` from the folder of ``test_file``.

    ``impl`` overrides LAB_IMPL (the contract checker uses it).
    """
    which = impl if impl is not None else selected_impl()
    if which not in ALLOWED_IMPLS:
        raise LabImplError(f"impl={which!r} is not allowed: use one of {', '.join(ALLOWED_IMPLS)}")
    override = os.environ.get(FILE_ENV_VAR, "").strip()
    if impl is None and override:
        path = pathlib.Path(override)
        if not path.is_file():
            raise LabImplError(f"{FILE_ENV_VAR}={override!r} is not a file")
        return import_path(path)
    return import_path(pathlib.Path(test_file).resolve().parent / f"{which}.py")
