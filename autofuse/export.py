"""Write built libraries atomically, each with a small JSON sidecar describing it."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import tvm


def sidecar_path(library: str | os.PathLike) -> Path:
    return Path(str(library) + ".json")


def export_library(executable: tvm.runtime.Executable, path: str | os.PathLike, sidecar: dict[str, Any]) -> Path:
    """Export to a temp file in the same directory, then rename: a reader never sees half a library."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        executable.export_library(tmp)
        meta = {**sidecar, "library": path.name, "tvm_version": tvm.__version__}
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)  # library first: a sidecar never describes a library not yet in place
        _atomic_write_text(sidecar_path(path), json.dumps(meta, indent=2, sort_keys=True))
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:  # e.g. disk full: no half-written temp file left next to the library
        Path(tmp).unlink(missing_ok=True)
        raise
