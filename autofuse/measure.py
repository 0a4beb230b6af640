"""Verified measurement: check a built plan against the reference, then time it.

The output is poisoned first: one call on NaN inputs leaves NaN in every buffer
the VM's pooled allocator will hand out again, so a kernel that skips writing
part of its output cannot pass by reusing an earlier correct result.  Only a
correct result is timed; a wrong one is reported as wrong.
"""

from __future__ import annotations

import ctypes
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from autofuse.target import Target


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's initial threshold, kept from then on


def steady_allocations() -> bool:
    """Keep glibc serving every large buffer (weights, activations, intermediates) from fresh
    pages, as it does in a new process.  glibc raises its mmap threshold each time a large
    block is freed, up to 32 MiB, so a process that has built and freed a few dozen plans
    serves them from its fragmented heap instead: there gemm_bn's plans ran 1.6-1.9x slower
    than the same plans built early in the process, and a tuning worker's side-by-side
    comparisons measured the age of each build, not the plan (nine "wins" in a row that
    ended 1.34x slower than where they began, results/NOTES.md 62).  Setting the threshold
    turns that adjustment off.  Every process that times plans calls this first.  Returns
    whether it could (False where the C library has no ``mallopt``: not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


@dataclass(frozen=True)
class TimingConfig:
    """Warm-up calls, then ``repeats`` timings of ``number`` calls each, every
    repeat lasting at least ``min_repeat_ms``; optional CPU cache flush between repeats.

    ``cutoff_ms``: when the first warm-up call and the call after it both take longer than
    this, the faster of the two is the only timing taken.  A job sets it to a multiple of
    its best time so far: a candidate that much slower cannot become the best, and timing
    it precisely would cost seconds.  One slow call alone is not enough: on a shared
    machine another process can slow one call tenfold, and resnet_block's best seed was once
    discarded so (results/NOTES.md 28)."""

    repeats: int = 10
    number: int = 1
    min_repeat_ms: int = 50
    warmup: int = 2
    cache_flush: bool = False
    cutoff_ms: float | None = None


QUICK = TimingConfig(repeats=3, number=1, min_repeat_ms=1, warmup=1)


@dataclass
class Measurement:
    correct: bool
    max_rel_err: float | None
    median_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    std_ms: float | None = None
    repeats: int = 0
    error: str | None = None
    samples_ms: list[float] = field(default_factory=list)

    @property
    def spread_ms(self) -> float | None:
        return None if self.max_ms is None else self.max_ms - self.min_ms

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["spread_ms"] = self.spread_ms
        return d


def compare(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> tuple[bool, float]:
    """(within tolerance, normwise relative error). NaN/inf never pass."""
    if actual.shape != expected.shape:
        return False, math.inf
    a = actual.astype(np.float64)
    if not np.all(np.isfinite(a)):
        return False, math.inf
    ok = bool(np.all(np.abs(a - expected) <= atol + rtol * np.abs(expected)))
    scale = float(np.max(np.abs(expected))) or 1.0
    return ok, float(np.max(np.abs(a - expected)) / scale)


class Session:
    """A built plan loaded in a Relax VM on a device, with its inputs resident."""

    def __init__(self, executable: tvm.runtime.Executable, target: Target):
        self.device = tvm.cpu(0) if target.kind == "llvm" else tvm.cuda(0)
        self.vm = relax.VirtualMachine(executable, self.device)

    def to_device(self, arrays: list[np.ndarray]) -> list[tvm.runtime.Tensor]:
        return [tvm.runtime.tensor(a, self.device) for a in arrays]

    def __call__(self, args: list[tvm.runtime.Tensor]) -> np.ndarray:
        return self.vm["main"](*args).numpy()

    def check(self, inputs: list[np.ndarray], expected: np.ndarray, rtol: float, atol: float) -> tuple[bool, float]:
        poison = self.to_device([np.full_like(a, np.nan) for a in inputs])
        self(poison)
        out = self(self.to_device(inputs))
        return compare(out, expected, rtol, atol)

    def _call_ms(self, args: list[tvm.runtime.Tensor]) -> float:
        """One call's milliseconds: the plan's kernels, not the copy of its output into NumPy.
        Every process that times plans serves large buffers from fresh pages
        (``steady_allocations``), so that copy page-faults on each call: 0.8 ms for
        layernorm_residual's 3 MB output against its 0.066 ms plan, and every candidate of
        that space read over the cutoff and was timed once, at 10x its time (NOTES 65)."""
        t0 = time.perf_counter()
        self.vm["main"](*args)
        self.device.sync()
        return (time.perf_counter() - t0) * 1e3

    def time(self, inputs: list[np.ndarray], cfg: TimingConfig) -> list[float]:
        """Per-call milliseconds of each repeat, after warm-up."""
        args = self.to_device(inputs)
        for i in range(cfg.warmup):
            first_ms = self._call_ms(args)
            if i == 0 and cfg.cutoff_ms is not None and first_ms > cfg.cutoff_ms:
                again_ms = self._call_ms(args)
                if again_ms > cfg.cutoff_ms:
                    return [min(first_ms, again_ms)]
        self.vm.save_function("main", "main_timed", *args)  # no per-call argument conversion
        kwargs: dict[str, Any] = dict(number=cfg.number, repeat=cfg.repeats, min_repeat_ms=cfg.min_repeat_ms)
        if cfg.cache_flush:
            kwargs["f_preproc"] = "cache_flush_cpu_non_first_arg"
        res = self.vm.time_evaluator("main_timed", self.device, **kwargs)()
        return [float(r) * 1e3 for r in res.results]


def summarize(samples_ms: list[float], correct: bool, err: float) -> Measurement:
    return Measurement(
        correct=correct,
        max_rel_err=err,
        median_ms=statistics.median(samples_ms),
        min_ms=min(samples_ms),
        max_ms=max(samples_ms),
        std_ms=statistics.pstdev(samples_ms) if len(samples_ms) > 1 else 0.0,
        repeats=len(samples_ms),
        samples_ms=samples_ms,
    )


def measure(session: Session, inputs: list[np.ndarray], expected: np.ndarray, rtol: float, atol: float,
            cfg: TimingConfig, timing_inputs: list[np.ndarray] | None = None) -> Measurement:
    """Check first; time only a correct result.

    Time on ``timing_inputs`` (other data than the check's) when a process measures
    many candidates: the VM's pooled allocator is process-wide, so what a candidate's
    timed runs leave in its buffers is what the next candidate finds in any part of
    its output it fails to write.  Timed on the check's own inputs, that leftover is
    the correct answer, and a kernel writing only part of its output passed the check
    (caught by the "wrong" fault injection); timed on other data, it is a wrong one.
    """
    correct, err = session.check(inputs, expected, rtol, atol)
    if not correct:
        return Measurement(False, err, error=f"wrong result: relative error {err:.3g} exceeds rtol={rtol}, atol={atol}")
    return summarize(session.time(inputs if timing_inputs is None else timing_inputs, cfg), True, err)
