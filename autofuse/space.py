"""Search spaces: hand-written workloads that autofuse tunes.

A space is a small Python file in ``search_spaces/`` (or any directory named by
``AUTOFUSE_SPACES``) that defines ``define(tiny: bool = False) -> Space``.  The
space says *what* is computed (Relax ops on named tensors) and gives a NumPy
reference; *how* it is fused and scheduled is what autofuse searches for.

Activations are fed at every call; parameters are bound once at build time,
either from the caller's arrays or from the space's own seeded random values.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np

Init = Literal["normal", "positive", "uniform", "zeros", "ones"]


class SpaceError(Exception):
    """A space is unknown or malformed (bad file, bad shapes, bad names)."""


@dataclass(frozen=True)
class Tensor:
    """A named graph input. ``init``/``scale`` say how default values are drawn."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    init: Init = "normal"
    scale: float = 1.0

    def random(self, rng: np.random.Generator) -> np.ndarray:
        if self.init == "normal":
            a = rng.standard_normal(self.shape) * self.scale
        elif self.init == "positive":  # e.g. BatchNorm variance: strictly > 0
            a = rng.uniform(0.5, 1.5, self.shape) * self.scale
        elif self.init == "uniform":
            a = rng.uniform(-1.0, 1.0, self.shape) * self.scale
        elif self.init == "zeros":
            a = np.zeros(self.shape)
        elif self.init == "ones":
            a = np.ones(self.shape)
        else:
            raise SpaceError(f"tensor {self.name!r}: unknown init {self.init!r}")
        return np.asarray(a, dtype=self.dtype, order="C")  # ascontiguousarray would make 0-d 1-d

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class Space:
    """A workload: inputs, a Relax forward function and a NumPy reference.

    ``forward(**relax_vars) -> relax.Expr`` builds the computation with
    ``tvm.relax.op`` calls on the named inputs (nested calls are fine);
    ``reference(**arrays) -> np.ndarray`` computes the same in NumPy (float64 is
    welcome).  ``knobs`` optionally narrows schedule knob ranges for this space.
    """

    name: str
    activations: tuple[Tensor, ...]
    params: tuple[Tensor, ...]
    forward: Callable[..., Any]
    reference: Callable[..., np.ndarray]
    description: str = ""
    knobs: dict[str, Any] = field(default_factory=dict)
    rtol: float = 1e-3
    atol: float = 1e-4
    # Imported models (autofuse.onnx_import) and model regions (autofuse.regions): a prebuilt Relax
    # module used instead of ``forward``, the parameters' actual values (instead of seeded random ones),
    # and where it came from (plain data a worker process can rebuild it from).
    module: Any = field(default=None, compare=False, repr=False)
    param_values: dict[str, np.ndarray] | None = field(default=None, compare=False, repr=False)
    source: dict[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for t in self.inputs:
            if not isinstance(t, Tensor):
                raise SpaceError(f"space {self.name!r}: inputs must be autofuse.space.Tensor, got {type(t).__name__}")
            if not isinstance(t.name, str) or not t.name:
                raise SpaceError(f"space {self.name!r}: input name {t.name!r} must be a non-empty string")
            if self.module is None and not t.name.isidentifier():  # forward() takes inputs as keywords
                raise SpaceError(f"space {self.name!r}: input name {t.name!r} must be a Python identifier")
            shape = t.shape
            if not isinstance(shape, tuple) or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in shape):
                raise SpaceError(f"space {self.name!r}: input {t.name!r} has a bad shape {shape!r} (a tuple of positive ints)")
            # parameters may be scalars (ONNX models have scalar initializers: Clip bounds, eps, ...)
            if not shape and t not in self.params:
                raise SpaceError(f"space {self.name!r}: activation {t.name!r} has a bad shape () (activations are tensors)")
        names = [t.name for t in self.inputs]
        if len(set(names)) != len(names):
            raise SpaceError(f"space {self.name!r}: duplicate input names {names}")

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return self.activations + self.params

    def default_params(self, seed: int = 0) -> dict[str, np.ndarray]:
        """The space's own seeded parameter values (what a build binds by default).

        An imported model's parameters are its weights."""
        if self.param_values is not None:
            return dict(self.param_values)
        rng = np.random.default_rng(seed)
        return {t.name: t.random(rng) for t in self.params}

    def random_activations(self, seed: int = 1) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        return {t.name: t.random(rng) for t in self.activations}

    def check_params(self, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Validate caller-given parameter arrays (names, shapes); fill the rest with defaults."""
        known = {t.name: t for t in self.params}
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise SpaceError(f"space {self.name!r} has no parameter(s) {unknown}; parameters: {sorted(known)}")
        out = self.default_params()
        for name, arr in params.items():
            arr = np.asarray(arr, dtype=known[name].dtype)
            if arr.shape != known[name].shape:
                raise SpaceError(f"parameter {name!r}: shape {arr.shape}, expected {known[name].shape}")
            out[name] = np.asarray(arr, order="C")
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "activations": [t.as_dict() for t in self.activations],
            "params": [t.as_dict() for t in self.params],
        }


def spaces_dirs() -> list[Path]:
    """Where space files are looked up: $AUTOFUSE_SPACES (os.pathsep-separated), then the bundled ones."""
    dirs = [Path(p) for p in os.environ.get("AUTOFUSE_SPACES", "").split(os.pathsep) if p]
    dirs.append(Path(__file__).resolve().parent.parent / "search_spaces")
    return dirs


def space_files() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in spaces_dirs():
        if d.is_dir():
            for f in sorted(d.glob("*.py")):
                if not f.name.startswith("_"):
                    found.setdefault(f.stem, f)
    return found


def space_names() -> list[str]:
    return sorted(space_files())


@cache
def load_space(name: str, tiny: bool = False) -> Space:
    """Import ``search_spaces/<name>.py`` and call its ``define(tiny)``."""
    files = space_files()
    if name not in files:
        raise SpaceError(f"unknown space {name!r}; known spaces: {', '.join(sorted(files)) or 'none'}")
    spec = importlib.util.spec_from_file_location(f"autofuse_space_{name}", files[name])
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        space = module.define(tiny=tiny)
    except SpaceError:
        raise
    except Exception as e:  # a user's space file is input: report it, don't crash
        raise SpaceError(f"space file {files[name]} failed to load: {type(e).__name__}: {e}") from e
    if not isinstance(space, Space):
        raise SpaceError(f"space file {files[name]}: define() must return autofuse.space.Space")
    return space
