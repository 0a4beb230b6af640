"""Winograd convolution F(m x m, 3 x 3): another algorithm for a 3x3 stride-1 'same' convolution.

A direct convolution of C -> K channels does 9 C K multiply-adds per output pixel; Winograd
computes each m x m tile of output from an (m+2) x (m+2) tile of input as (m+2)^2 GEMMs
over channels on transformed tiles, 2.25x (m = 2) or 4x (m = 4) fewer multiply-adds, at
the cost of the transforms (additions, no reuse).  On a compute-bound convolution
(conv_bn_relu runs at 92% of the machine's SGEMM peak, direct) it is the only way to go
faster than that peak allows.

Layouts are chosen for CPU vectors (NOTES 40; TVM's own NCHW Winograd strides its tile reads
and writes by m and ran 3-5x slower than a direct plan):

- ``wino_pad``: the image padded once, channels blocked by 8 innermost (``[C/8, H', W', 8]``),
  so every tile read of the input transform is one contiguous vector of 8 channels;
- ``wino_data``: the transformed tiles, ``V[e1, e2, p, c]`` ((e1, e2): the (m+2)^2 transform
  points, p: the tiles), channels innermost: the GEMMs' left operands, row-major; its first
  half, ``wino_data_rows`` (``B^T d``), is computed per tile just before it;
- ``wino_gemm``: ``M[e1, e2, p, k] = sum_c V[e1, e2, p, c] U[e1 (m+2) + e2, c, k]``, output
  channels innermost, register-tiled ``wino_rows`` tiles x ``wino_cols`` channels like any GEMM;
- ``wino_out``: the inverse transform, written NCHW, its first half ``wino_out_rows``
  (``A^T M``) computed per tile; with the group's epilogue (BN, ReLU, a residual add) inlined
  into it, run per tile and 8 output channels at a time.

Stage by stage, each of these runs over the whole image, in parallel on an axis of its own,
so each thread reads what the other threads wrote; with ``wino_block`` the image is cut
into blocks of rows of tiles instead, and one thread takes each block through every stage
(the schedule's two halves: ``_schedule_by_stage``, ``_schedule_blocked``).

The weight's transform ``U = G w G^T`` is computed once, in NumPy, when the plan is built
(it is a constant: Winograd is offered only on the folded graph).  The transforms' sums
are written out term by term (the matrices are constants with many zeros and ones).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir, te, tirx

from autofuse.graph import Graph
from autofuse.plan import PlanError
from autofuse.schedule import ScheduleRejected, loops_below, schedule_at_root, try_step  # the generic scheduler's steps

LANES = 8  # channel block of the padded input and vector width of the transforms
BLOCKS = ("wino_pad", "wino_data_rows", "wino_data", "wino_gemm", "wino_out_rows", "wino_out")


@dataclass(frozen=True)
class Conv:
    """A convolution Winograd can replace: NCHW input, OIHW 3x3 weight, stride 1, padding 1."""

    batch: int
    channels: int
    filters: int
    height: int
    width: int


def eligible(graph: Graph, op_index: int) -> Conv | None:
    """The op's convolution when Winograd can compute it: its PrimFunc is exactly TVM's
    legalization of a float32 3x3 stride-1 pad-1 NCHW conv2d (no dilation, no groups),
    its weight a constant of the graph, and both channel counts multiples of ``LANES``."""
    op = graph.ops[op_index]
    if op.dtype != "float32" or len(op.args) != 2 or not op.args[1].startswith("const:") or len(op.shape) != 4:
        return None
    w_shape, w_dtype = graph.consts[int(op.args[1].split(":")[1])]
    if w_dtype != "float32" or len(w_shape) != 4 or tuple(w_shape[2:]) != (3, 3):
        return None
    n, k, h, w = op.shape
    c = int(w_shape[1])
    if w_shape[0] != k or c % LANES or k % LANES:
        return None
    if not tvm_ffi.structural_equal(_plain(graph.mod[op.func]), _plain(_direct_conv(n, c, k, h, w)), map_free_vars=True):
        return None
    return Conv(n, c, k, h, w)


_DIRECT: dict[tuple[int, ...], tirx.PrimFunc] = {}


def _direct_conv(n: int, c: int, k: int, h: int, w: int) -> tirx.PrimFunc:
    """TVM's legalization of conv2d(x[n, c, h, w], w[k, c, 3, 3], padding=1): what an
    eligible op's PrimFunc must equal."""
    key = (n, c, k, h, w)
    if key not in _DIRECT:
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((n, c, h, w), "float32"))
        wt = relax.Var("w", relax.TensorType((k, c, 3, 3), "float32"))
        with bb.function("main", [x, wt]):
            bb.emit_func_output(bb.emit(relax.op.nn.conv2d(x, wt, padding=(1, 1))))
        mod = relax.transform.LegalizeOps()(bb.get())
        _DIRECT[key] = next(f for gv, f in mod.functions.items() if gv.name_hint != "main")
    return _DIRECT[key]


def _plain(func: tirx.PrimFunc) -> tirx.PrimFunc:
    for attr in ("global_symbol", "op_pattern"):
        if func.attrs and attr in func.attrs:
            func = func.without_attr(attr)
    return func


def matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Cook-Toom matrices (A, B, G) of F(m, 3), float64: output ``A^T [(G g G^T) * (B^T d B)] A``.
    TVM's own (topi's interpolation points, chosen for float32 accuracy)."""
    from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

    a, b, g = _cook_toom_convolution(_interpolation_points(m + 2), m, 3)
    return np.asarray(a, np.float64), np.asarray(b, np.float64), np.asarray(g, np.float64)


def transformed_weight(weight: np.ndarray, m: int) -> np.ndarray:
    """``U[e1 * alpha + e2, c, k] = (G w[k, c] G^T)[e1, e2]``, the GEMMs' right operands."""
    _, _, g = matrices(m)
    alpha = m + 2
    u = np.einsum("ea,kcab,fb->efck", g, weight.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape(alpha * alpha, weight.shape[1], weight.shape[0]), dtype=np.float32)


def _combination(coefs: np.ndarray, terms: list[Any]) -> Any:
    """sum(c * t) over the nonzero coefficients, a 1 or -1 without its multiplication."""
    out = None
    for c, t in zip(coefs, terms):
        c = float(c)
        if c == 0.0:
            continue
        term = t if c == 1.0 else -t if c == -1.0 else t * tirx.const(c, "float32")
        out = term if out is None else out + term
    return out if out is not None else tirx.const(0.0, "float32")


def _pick(index: Any, count: int, value: Any) -> Any:
    """``value(index)`` for a loop index in 0..count-1, as a chain of Selects; once the loop
    is unrolled, every Select folds away and each copy keeps only its own sum."""
    expr = value(count - 1)
    for v in range(count - 2, -1, -1):
        expr = tirx.Select(index == v, value(v), expr)
    return expr


def primfunc(conv: Conv, m: int) -> tirx.PrimFunc:
    """``y[n, k, h, w]`` = the convolution of ``x[n, c, h, w]`` by the weight whose transform is
    ``u`` (``transformed_weight``), as the four blocks of ``BLOCKS``."""
    a_m, b_m, _ = matrices(m)
    alpha = m + 2
    n_, c_, k_, h_, w_ = conv.batch, conv.channels, conv.filters, conv.height, conv.width
    tiles_h, tiles_w = -(-h_ // m), -(-w_ // m)
    tiles = n_ * tiles_h * tiles_w
    x = te.placeholder(_i64(n_, c_, h_, w_), "float32", name="x")
    u = te.placeholder(_i64(alpha * alpha, c_, k_), "float32", name="u")
    zero = tirx.const(0.0, "float32")
    padded = te.compute(
        _i64(n_, c_ // LANES, tiles_h * m + 2, tiles_w * m + 2, LANES),
        lambda b, cb, i, j, ci: tirx.if_then_else(
            tirx.all(i >= 1, i <= h_, j >= 1, j <= w_), x[b, cb * LANES + ci, i - 1, j - 1], zero),
        name="wino_pad")

    def tile_of(p: Any) -> tuple[Any, Any, Any]:  # (image, first row, first column) of tile p
        b, t = p // (tiles_h * tiles_w), p % (tiles_h * tiles_w)
        return b, (t // tiles_w) * m, (t % tiles_w) * m

    def rows(e1: Any, s: Any, p: Any, c: Any) -> Any:  # (B^T d)[e1, s]: the rows transformed
        b, row, col = tile_of(p)
        return _pick(e1, alpha, lambda a: _combination(
            b_m[:, a], [padded[b, c // LANES, row + r, col + s, c % LANES] for r in range(alpha)]))

    half = te.compute(_i64(alpha, alpha, tiles, c_), rows, name="wino_data_rows")
    v = te.compute(_i64(alpha, alpha, tiles, c_), lambda e1, e2, p, c: _pick(e2, alpha, lambda b: _combination(
        b_m[:, b], [half[e1, s, p, c] for s in range(alpha)])), name="wino_data")  # (B^T d B)[e1, e2]
    rc = te.reduce_axis(_i64(0, c_), "rc")
    mm = te.compute(_i64(alpha, alpha, tiles, k_),
                    lambda e1, e2, p, k: te.sum(v[e1, e2, p, rc] * u[e1 * alpha + e2, rc, k], axis=rc), name="wino_gemm")
    inverse_rows = te.compute(_i64(m, alpha, tiles, k_), lambda i, e2, p, k: _pick(i, m, lambda oi: _combination(
        a_m[:, oi], [mm[e1, e2, p, k] for e1 in range(alpha)])), name="wino_out_rows")  # (A^T M)[i, e2]

    def output(b: Any, k: Any, i: Any, j: Any) -> Any:  # (A^T M A)[i % m, j % m] of the tile holding (i, j)
        p = b * tiles_h * tiles_w + (i // m) * tiles_w + j // m
        return _pick(j % m, m, lambda oj: _combination(a_m[:, oj], [inverse_rows[i % m, e2, p, k] for e2 in range(alpha)]))

    y = te.compute(_i64(n_, k_, h_, w_), output, name="wino_out")
    return te.create_prim_func([x, u, y])


def _i64(*dims: int) -> tuple[Any, ...]:
    """Shapes as int64, as Relax's legalized PrimFuncs have them (FuseTIR matches buffers exactly)."""
    return tuple(tirx.IntImm("int64", d) for d in dims)


def substitute(graph: Graph, winograd_ops: dict[int, int]) -> Graph:
    """The graph with op ``i`` computed by Winograd F(m, 3) for every ``i: m`` given: its
    PrimFunc replaced, its weight constant replaced by the transformed one.  Op names, the
    partition and every other op stay as they are (``build.outline`` reads ops, bindings and
    their constants, not ``main``).  A PlanError when an op is not ``eligible``."""
    if not winograd_ops:
        return graph
    mod = graph.mod
    ops, bindings, consts = list(graph.ops), list(graph.bindings), list(graph.consts)
    for i, m in sorted(winograd_ops.items()):
        conv = eligible(graph, i)
        if conv is None:
            raise PlanError(f"winograd={m} on op {graph.ops[i].name} ({graph.ops[i].func}): Winograd needs a float32 "
                            "3x3 stride-1 pad-1 NCHW convolution of a constant weight, channels a multiple of 8")
        name = f"conv2d_winograd{m}_{i}"
        bb = relax.BlockBuilder(mod)  # a new module: the graph's own is shared
        gv = bb.add_func(primfunc(conv, m).without_attr("global_symbol"), name)
        mod = bb.get()
        old = bindings[i]
        x_arg, w_arg = old.value.args[1].fields
        u = transformed_weight(w_arg.value.numpy(), m)
        call = relax.call_tir(gv, relax.Tuple([x_arg, relax.const(u)]), out_ty=old.var.ty)
        bindings[i] = relax.VarBinding(old.var, call)
        const_index = int(ops[i].args[1].split(":")[1])
        consts[const_index] = (u.shape, "float32")
        ops[i] = replace(ops[i], func=name)
    return replace(graph, ops=tuple(ops), bindings=tuple(bindings), consts=tuple(consts), mod=mod)


def schedule(sch: s_tir.Schedule, kernel: str, m: int, knobs: dict[str, Any]) -> None:
    """Schedule a fused kernel holding the Winograd blocks (``BLOCKS``) and the group's other
    ops: producers inlined into the padding, the epilogue into the inverse transform; each
    transform run per tile and 8 channels per vector, in two unrolled halves (rows, then
    columns: a few terms each, where one sum over the whole tile had LLVM and TVM's simplifier
    spend seconds on every build); the GEMMs register-tiled ``wino_rows`` x ``wino_cols``,
    the transform points and row tiles in parallel.

    ``wino_block`` = R: the image is cut into blocks of R rows of tiles, and one thread takes
    each block through every stage (``_schedule_blocked``); 0: stage after stage, each in
    parallel on its own axis (``_schedule_by_stage``), so each thread reads tiles the other
    made.  On a 2-vCPU virtual machine the latter ran resnet_block's F(4x4) plan at one of
    two speeds, 0.58 or 0.89 ms, for tens of seconds at a time, while blocks of 7 rows ran
    0.53-0.57 ms throughout (NOTES 42)."""
    sch.work_on(kernel)
    root = sch.get_sblock("root")
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(root)]
    outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(root)}
    for name in reversed(names[:names.index("wino_pad")]):  # producers (a ReLU, a residual add) into the padding
        if name not in outputs:
            try_step(lambda: sch.compute_inline(name))
    for name in names[names.index("wino_out"):]:  # the inverse transform and the epilogue into the group's output
        if name not in outputs:
            try_step(lambda: sch.compute_inline(name))
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(root)]
    final = next(n for n in names if any(r.source.name == "wino_out_rows" for r in sch.get(sch.get_sblock(n)).reads))
    others = [n for n in names[names.index("wino_out_rows") + 1:] if n != final]

    if knobs.get("wino_block", 0):
        _schedule_blocked(sch, final, m, knobs)
    else:
        _schedule_by_stage(sch, final, m, knobs)
    for name in others:  # a second output of the group beside the convolution's
        schedule_at_root(sch, name, {**knobs, "parallel": 1, "vector": True})


def _schedule_by_stage(sch: s_tir.Schedule, final: str, m: int, knobs: dict[str, Any]) -> None:
    """Each stage over the whole image in turn, each in parallel on its own axis: the
    padding by channel blocks and rows, the input transform by tiles, the GEMMs by transform
    points, the inverse transform by rows of tiles."""
    loops = sch.get_loops(sch.get_sblock("wino_pad"))
    sch.parallel(sch.fuse(*loops[:3]))
    sch.vectorize(loops[-1])

    e1, e2, p, c = sch.get_loops(sch.get_sblock("wino_data"))
    c_o, c_i = sch.split(c, [None, LANES])
    sch.reorder(p, c_o, e1, e2, c_i)
    sch.parallel(p)
    _unroll_transform(sch, "wino_data_rows", c_o, (e1, e2, c_i))

    block = sch.get_sblock("wino_gemm")
    e1, e2, p, k, c = sch.get_loops(block)
    _register_tile(sch, block, e1, e2, p, k, c, knobs, parallel=True)

    b, t_i, k_o, t_j, o_i, o_j, k_i = _output_tiles(sch, final, m)
    sch.reorder(b, t_i, k_o, t_j, o_i, o_j, k_i)
    sch.parallel(sch.fuse(b, t_i))
    _unroll_transform(sch, "wino_out_rows", t_j, (o_i, o_j, k_i))


def _output_tiles(sch: s_tir.Schedule, final: str, m: int) -> tuple[Any, ...]:
    """The output's loops split into tiles: (image, row of tiles, 8-channel block, column of
    tiles, row in the tile, column in the tile, channel in the block); the inverse transform
    runs per tile, 8 output channels a vector."""
    b, k, i, j = sch.get_loops(sch.get_sblock(final))
    t_i, o_i = sch.split(i, [None, m])
    t_j, o_j = sch.split(j, [None, m])
    k_o, k_i = sch.split(k, [None, LANES])
    return b, t_i, k_o, t_j, o_i, o_j, k_i


def _register_tile(sch: s_tir.Schedule, block: Any, e1: Any, e2: Any, p: Any, k: Any, c: Any,
                   knobs: dict[str, Any], parallel: bool = False) -> None:
    """The GEMMs' ``wino_rows`` tiles x ``wino_cols`` output channels in registers, summed
    over all input channels, then stored; ``parallel``: the transform points and row tiles
    in parallel."""
    p_o, p_i = sch.split(p, [None, knobs["wino_rows"]])
    k_o, k_i = sch.split(k, [None, min(knobs["wino_cols"], int(sch.get(k).extent))])
    sch.reorder(e1, e2, p_o, k_o, c, p_i, k_i)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, k_o)
    if parallel:
        sch.parallel(sch.fuse(e1, e2, p_o))
    sch.unroll(p_i)
    sch.vectorize(k_i)
    sch.decompose_reduction(block, c)
    sch.vectorize(sch.get_loops(acc)[-1])


def _schedule_blocked(sch: s_tir.Schedule, final: str, m: int, knobs: dict[str, Any]) -> None:
    """Blocks of ``wino_block`` rows of tiles in parallel, each taken through every stage by
    one thread: its rows padded, its tiles transformed, its GEMMs (every transform point in
    turn), its inverse transform.  A thread only reads what it wrote, and a block's
    intermediates are allocated per block (a row of 14 F(4x4) tiles of 64 channels: 129 KB)."""
    rows = knobs["wino_block"]
    b, t_i, k_o, t_j, o_i, o_j, k_i = _output_tiles(sch, final, m)
    if int(sch.get(t_i).extent) % rows:
        raise ScheduleRejected(f"wino_block={rows} does not divide the {int(sch.get(t_i).extent)} rows of tiles")
    t_io, t_ii = sch.split(t_i, [None, rows])
    sch.reorder(b, t_io, t_ii, k_o, t_j, o_i, o_j, k_i)
    blocks = sch.fuse(b, t_io)
    sch.parallel(blocks)
    _unroll_transform(sch, "wino_out_rows", t_j, (o_i, o_j, k_i))
    # producers under their consumers, each once its consumer is in place
    gemm = sch.get_sblock("wino_gemm")
    sch.compute_at(gemm, blocks)
    sch.compute_at(sch.get_sblock("wino_data"), blocks)
    e1, e2, p, c = loops_below(sch, "wino_data", blocks)
    c_o, c_i = sch.split(c, [None, LANES])
    sch.reorder(p, c_o, e1, e2, c_i)
    _unroll_transform(sch, "wino_data_rows", c_o, (e1, e2, c_i))
    sch.compute_at(sch.get_sblock("wino_pad"), blocks)
    sch.vectorize(loops_below(sch, "wino_pad", blocks)[-1])
    _register_tile(sch, gemm, *loops_below(sch, "wino_gemm", blocks), knobs)


def _unroll_transform(sch: s_tir.Schedule, first_half: str, loop: Any, second: tuple[Any, Any, Any]) -> None:
    """The first half of a transform computed under ``loop`` of the second: both halves'
    small loops unrolled (each Select of ``_pick`` then folds to its own sum), the
    channels one vector."""
    sch.compute_at(sch.get_sblock(first_half), loop)
    *small, lanes = loops_below(sch, first_half, loop)
    for l in (*small, *second[:2]):
        if int(sch.get(l).extent) > 1:
            sch.unroll(l)
    sch.vectorize(lanes)
    sch.vectorize(second[2])
