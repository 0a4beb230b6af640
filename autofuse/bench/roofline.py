"""The roofline floor: this machine's peak FLOP/s and bandwidth, and a workload's work.

A space's floor is max(FLOPs / peak, bytes / bandwidth), with both peaks measured by the
same command that times the columns (a large SGEMM through the fastest library present; a
large parallel copy, bytes read + written), so the floor moves with the machine's state.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from autofuse.bench.columns import time_python, wait_for_quiet_threads
from autofuse.target import VectorUnit, num_threads
from autofuse.workload import Workload


# How long the TVM kernels that set the peaks are timed; each peak is their fastest run.  The
# machine's speed flips between two levels about every second (NOTES 35): a bench run whose
# copy was timed for 0.2 s within a slow second read 37.8 GB/s, against 66.4 in the run
# before, and put ew_chain's floor above autofuse's own time (0.42x).
PEAK_TIMING_S = 5.0
# Floats the bandwidth copy moves, 256 MiB: larger than any CPU cache, so it reads DRAM.
COPY_FLOATS = 64 << 20
# The peak SGEMM's size, n x n times n x n.
SGEMM_N = 2048


def best_run_s(run: Callable[[], list[float]], seconds: float,
               clock: Callable[[], float] = time.perf_counter) -> float:
    """The fastest of the runs ``run`` returns (seconds each), calling it until ``seconds`` have
    passed on ``clock`` (at least once): a peak is what the machine can do, in its fast
    stretches too."""
    best = math.inf
    t_end = clock() + seconds
    while True:
        best = min(best, *run())
        if clock() >= t_end:
            return best


def machine_peaks(seconds: float = 1.0, peak_timing_s: float = PEAK_TIMING_S) -> dict[str, float]:
    """Peak FLOP/s from a large SGEMM through the fastest of NumPy's BLAS, onnxruntime and a
    TVM kernel on pre-packed weights; bandwidth from a large copy.  The libraries are timed
    for ``seconds``; TVM's kernels, usually the fastest here, for ``peak_timing_s``."""
    n = SGEMM_N
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    a @ b
    times = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(times) < 3:
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    flops = 2 * n**3 / min(times)
    source = "numpy"
    try:  # onnxruntime's MLAS GEMM is often the fastest library present
        import onnx.helper as h
        from onnx import TensorProto

        from autofuse.peers import onnxruntime_session

        g = h.make_graph([h.make_node("MatMul", ["a", "b"], ["c"])], "mm",
                         [h.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in "ab"],
                         [h.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])])
        sess = onnxruntime_session(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), num_threads())
        feed = {"a": a, "b": b}
        sess.run(None, feed)
        wait_for_quiet_threads()  # OpenBLAS's threads spin after NumPy's SGEMM
        ort_best = min(time_python(lambda: sess.run(None, feed), 1.0, 5)) / 1e3
        if 2 * n**3 / ort_best > flops:
            flops, source = 2 * n**3 / ort_best, "onnxruntime"
    except ImportError:
        pass
    # The BLAS libraries present may not know this CPU (OpenBLAS and MLAS ran Zen 5 at half its
    # AVX-512 rate, NOTES 26): a floor that autofuse's own kernels beat would be no floor.
    tvm_flops = _tvm_sgemm_flops(n, peak_timing_s)
    if tvm_flops > flops:
        flops, source = tvm_flops, "TVM packed"
    # Copy bandwidth with as many threads as kernels use (one thread cannot saturate DRAM):
    # each thread copies its own slice; np.copyto releases the GIL.
    from concurrent.futures import ThreadPoolExecutor

    threads = num_threads()
    src = np.ones(COPY_FLOATS, dtype=np.float32)
    dst = np.empty_like(src)
    step = src.size // threads
    chunks = [(dst[i * step:(i + 1) * step], src[i * step:(i + 1) * step]) for i in range(threads)]
    ctimes = []
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(6):
            t = time.perf_counter()
            list(pool.map(lambda c: np.copyto(*c), chunks))
            ctimes.append(time.perf_counter() - t)
    bw = 2 * step * threads * src.itemsize / min(ctimes[1:])
    bw_source = "numpy copy"
    tvm_bw = _tvm_copy_bandwidth(src.size, threads, peak_timing_s)
    if tvm_bw > bw:
        bw, bw_source = tvm_bw, "TVM parallel vectorized copy"
    return {"peak_gflops": flops / 1e9, "peak_source": source, "bandwidth_gbs": bw / 1e9, "bandwidth_source": bw_source,
            "copy_threads": threads, "last_level_cache_bytes": last_level_cache_bytes()}


def last_level_cache_bytes(cache_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The size of the CPU's largest cache, as Linux reports it (None where it does not).  The
    bandwidth is a ``COPY_FLOATS`` copy's, from DRAM; a workload whose bytes fit in this cache stays
    there between repeats and can run below the roofline (layernorm_residual's 4.7 MB)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = []
    for f in cache_dir.glob("index*/size"):
        try:
            text = f.read_text().strip().upper()
            sizes.append(int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text))
        except (OSError, ValueError):
            continue
    return max(sizes, default=None)


@dataclass
class PeakKernel:
    """A kernel that sets one of the machine's peaks, built and ready to time: the parallel
    copy (bandwidth) or the packed SGEMM (FLOP/s).  The bench times it again back to back
    with autofuse's plan, so that plan and floor share the host's speed level."""

    term: str  # the work it does at its peak rate: "bytes" (moved) or "flops"
    work: float  # bytes read + written, or FLOPs, per run
    name: str
    run_s: Callable[[int, float], list[float]]  # (repeats, min_repeat_ms) -> seconds per run of each repeat

    def peak_rate(self, seconds: float) -> float:
        """Work per second of its fastest run in ``seconds`` (``best_run_s``)."""
        return self.work / best_run_s(lambda: self.run_s(5, 0), seconds)


def copy_kernel(n: int, threads: int) -> PeakKernel:
    """A parallel, vectorized TVM copy of n floats (bytes read + written)."""
    import tvm
    from tvm import s_tir, te

    a = te.placeholder((n,), "float32", name="A")
    b = te.compute((n,), lambda i: a[i], name="B")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    (i,) = sch.get_loops("B")
    outer, inner = sch.split(i, [threads * 64, None])
    sch.parallel(outer)
    _, vec = sch.split(inner, [None, 16])
    sch.vectorize(vec)
    rt = tvm.compile(sch.mod, tvm.target.Target({"kind": "llvm"})).jit()
    ta = tvm.runtime.tensor(np.ones(n, "float32"))
    tb = tvm.runtime.tensor(np.zeros(n, "float32"))
    return PeakKernel("bytes", 2.0 * n * 4, f"TVM parallel vectorized copy, {n * 4 >> 20} MiB",
                      _timer(rt, [ta, tb]))


def _timer(rt: Any, args: list[Any]) -> Callable[[int, float], list[float]]:
    import tvm

    def run_s(repeats: int, min_repeat_ms: float) -> list[float]:
        f = rt.time_evaluator("main", tvm.cpu(), number=1, repeat=repeats, min_repeat_ms=int(min_repeat_ms))
        return list(f(*args).results)

    return run_s


def _tvm_copy_bandwidth(n: int, threads: int, seconds: float) -> float:
    """Bytes read + written per second by ``copy_kernel``, its fastest run in ``seconds``."""
    return copy_kernel(n, threads).peak_rate(seconds)


def sgemm_register_tile(vectors: VectorUnit | None) -> tuple[int, int]:
    """(rows, columns) of the peak SGEMM's register tile: two vectors wide, as many rows as
    half the register file holds (AVX-512: 8 x 32; AVX2: 4 x 16, whose 8 x 32 tile spills
    and ran 2x slower, NOTES 36)."""
    if vectors is None:
        return 8, 32
    cols = 2 * vectors.lanes
    return max(1, vectors.lanes * vectors.registers // 2 // cols), cols  # half the file: the peak as measured since NOTES 36


def sgemm_kernel(n: int) -> PeakKernel | None:
    """An n^3 SGEMM compiled by TVM for this CPU: B pre-packed in column strips (as
    ``pack_weight`` lays out a weight), a register tile sized to the CPU's vector registers,
    strips in parallel.  None if its result is wrong (then it is no peak at all)."""
    import tvm
    from tvm import s_tir, te

    from autofuse.target import parse_target, vector_unit

    target = parse_target("llvm")
    rows, cols = sgemm_register_tile(vector_unit(target))

    a = te.placeholder((n, n), "float32", name="A")
    b = te.placeholder((n // cols, n, cols), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[j // cols, k, j % cols], axis=k), name="C")
    sch = s_tir.Schedule(te.create_prim_func([a, b, c]))
    i, j, kk = sch.get_loops("C")
    io, ii = sch.split(i, [None, rows])
    jo, ji = sch.split(j, [None, cols])
    sch.reorder(jo, io, kk, ii, ji)
    sch.parallel(jo)
    sch.vectorize(ji)
    sch.decompose_reduction(sch.get_sblock("C"), kk)
    rt = tvm.compile(sch.mod, target.tvm()).jit()
    rng = np.random.default_rng(0)
    a_np, b_np = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    packed = np.ascontiguousarray(b_np.reshape(n, n // cols, cols).transpose(1, 0, 2))
    args = [tvm.runtime.tensor(x) for x in (a_np, packed, np.zeros((n, n), "float32"))]
    rt(*args)
    if not np.allclose(args[2].numpy()[:rows], a_np[:rows] @ b_np, rtol=1e-3, atol=1e-3 * np.sqrt(n)):
        return None
    return PeakKernel("flops", 2.0 * n**3, f"TVM packed SGEMM {n}^3", _timer(rt, args))


def _tvm_sgemm_flops(n: int, seconds: float) -> float:
    """FLOP/s of ``sgemm_kernel``, its fastest run in ``seconds``; 0 if its result is wrong."""
    k = sgemm_kernel(n)
    return 0.0 if k is None else k.peak_rate(seconds)


def work_of(w: Workload) -> dict[str, float]:
    """FLOPs of the computation and the bytes a perfectly fused kernel must move."""
    from autofuse.schedule import block_nests

    g = w.graph(True)
    flops = 0.0
    for op in g.ops:
        for _, nest in block_nests(g.mod[op.func]):
            spatial = math.prod(nest.spatial) if nest.spatial else 1
            flops += 2.0 * spatial * math.prod(nest.reduce) if nest.reduce else spatial
    nbytes = sum(4 * math.prod(t.shape) for t in g.inputs)  # activations
    nbytes += sum(4 * math.prod(shape) for shape, _ in g.consts)  # parameters (folded)
    nbytes += 4 * math.prod(g.ops[g.index()[g.output]].shape)  # output
    return {"flops": flops, "bytes": float(nbytes)}


def roofline_ms(work: dict[str, float], peaks: dict[str, float]) -> float:
    """max(compute time at peak FLOP/s, time to move the bytes at peak bandwidth), in ms."""
    return max(work["flops"] / (peaks["peak_gflops"] * 1e9), work["bytes"] / (peaks["bandwidth_gbs"] * 1e9)) * 1e3


def roofline_term(work: dict[str, float], peaks: dict[str, float]) -> str:
    """Which of the two bounds sets the floor: "flops" (compute-bound) or "bytes"."""
    return "flops" if work["flops"] / peaks["peak_gflops"] >= work["bytes"] / peaks["bandwidth_gbs"] else "bytes"


def peak_kernel(term: str) -> PeakKernel | None:
    """The kernel that measured the peak of ``term`` (the fastest source the peaks found may
    be a library instead; TVM's were the fastest on every report since NOTES 26)."""
    return sgemm_kernel(SGEMM_N) if term == "flops" else copy_kernel(COPY_FLOATS, num_threads())
