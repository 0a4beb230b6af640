"""Schedule space of one fused kernel, and how a knob assignment becomes a TVM schedule.

Every group has an *anchor* block: the block with the largest iteration volume
(GEMM/conv reduction, or the last element-wise/normalizing block).  Knobs shape
the anchor's loop nest and say where every other block of the group goes:

- ``t<i>`` / ``r<j>``: inner tile of spatial loop i / reduction loop j (1 = no inner
  loop; need not divide the extent: TVM then adds a predicate).
  Loop order: spatial outer tiles, reduction outer, reduction inner, spatial inner
  (a register tile for GEMM/conv).
- ``outer_first``: which outer spatial tile loop runs outermost (the others keep their
  order).  For a GEMM, 1 puts the column tiles outside the row tiles, so each column
  strip of the weight stays in cache while all rows use it, instead of the whole weight
  streaming from memory once per row tile.
- ``k_block``: run the first reduction loop in blocks of this many steps, the block loop
  outermost (0 = off).  A GEMM whose operands do not fit the L2 cache then works on one
  ``rows x k_block`` slice of A and ``k_block x columns`` slice of B at a time (the blocking
  of GotoBLAS), adding each block's products to the output; epilogue and producers then run
  at root, after / before the whole reduction.
- ``vector_axis``: the spatial loop whose inner tile runs innermost, the one vectorized
  (default: the last).  Offered for convolutions (four spatial loops and a reduction):
  with the output channels as the vector axis, each step of the reduction loads one
  vector of weights (contiguous with ``pack_weight``) and broadcasts one input value per
  output column, the micro-kernel of direct convolutions in NCHWc libraries (oneDNN, MLAS)
  instead of one vector of input columns and one broadcast weight per channel.
- ``parallel``: how many outer spatial tile loops (in that order) are fused into one
  parallel loop.
- ``vector``: vectorize the innermost spatial loop; ``unroll``: auto-unroll max step.
- ``inline_producers``: inline producers (padding, residual adds) into the anchor's
  reads; otherwise they are computed per tile at ``producer_at`` (materialized
  padded tiles are often much faster than a bounds check in the inner loop).
- ``inline_epilogue``: collapse intermediate epilogue blocks into the last one.
- ``epilogue_at`` / ``producer_at``: outer spatial loop (index) under which the
  remaining consumers / producers are computed; -1 = at root, own loop nest.
- ``pack_weight``: a GEMM whose right operand is a constant weight (``B[k, j]``) reads it
  in a packed layout, ``B[j // t, k, j % t]`` for the inner column tile ``t``: each column
  strip is one contiguous stream instead of one cache line per row of B, rows a page apart
  that share a handful of cache sets.  The repacking runs once, at build time, on the constant
  (``SplitLayoutRewritePreproc`` + ``FoldConstant``).
- ``winograd``: compute the group's 3x3 convolution as Winograd F(m x m, 3 x 3) with output
  tiles of m = 2 or 4 (0 = direct), 2.25x / 4x fewer multiply-adds (``autofuse.winograd``;
  offered where the convolution is stride 1, padding 1, of a constant weight).  Its schedule
  is that algorithm's own; of the knobs above it keeps none, and ``wino_rows`` x ``wino_cols``
  (tiles x output channels) is the register tile of its GEMMs; ``wino_block`` (rows of tiles)
  cuts the image into blocks that one thread each takes through every stage (0: stage after
  stage, each stage in parallel over the whole image).
- ``reduce_vector``: the other reduction blocks of the group (layer-norm and softmax
  statistics, BN batch statistics) keep that many partial sums in one vector
  (``rfactor``), then add them up; 0 = one scalar accumulator (a serial chain of adds).

An assignment either yields a valid schedule or raises ``ScheduleRejected`` with
the reason; no TVM exception escapes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import tvm
from tvm import s_tir, tirx

from autofuse.plan import PlanError
from autofuse.target import VectorUnit, num_threads

BOOL_KNOBS = ("vector", "inline_producers", "inline_epilogue", "pack_weight")
INT_KNOBS = ("parallel", "unroll", "epilogue_at", "producer_at", "reduce_vector", "outer_first", "k_block",
             "vector_axis", "winograd", "wino_rows", "wino_cols", "wino_block")
WINOGRAD_TILES = (2, 4)  # ``winograd``: output tile m of F(m x m, 3 x 3) (0 = direct)
WINOGRAD_ROWS = tuple(range(1, 9))  # ``wino_rows`` x ``wino_cols``: the register tile of its GEMMs
WINOGRAD_COLS = (8, 16, 32)
WINOGRAD_BLOCKS = (0, 1, 2, 4, 7, 14)  # ``wino_block``: rows of tiles one thread takes through every stage
K_BLOCKS = (64, 128, 256, 512)
UNROLL_STEPS = (0, 16, 64, 256)
REDUCE_VECTOR_WIDTHS = (0, 8, 16, 32, 64)
MAX_VECTOR_LANES = 64  # widest vector a secondary block gets (4 AVX-512 registers of floats)
MAX_ACCUMULATORS = 512  # inner spatial tile of a reduction (e.g. 8 x 64 floats = 32 zmm registers)


class ScheduleRejected(Exception):
    """This knob assignment does not give a valid schedule (reason in the message)."""


@dataclass(frozen=True)
class LoopNest:
    """Extents of the anchor block's spatial and reduction loops."""

    spatial: tuple[int, ...]
    reduce: tuple[int, ...]

    @property
    def has_reduction(self) -> bool:
        return bool(self.reduce)


def block_nests(func: tirx.PrimFunc) -> list[tuple[str, LoopNest]]:
    """(name, loop nest) of every block directly under the root, in program order; none for
    a kernel autofuse cannot schedule (it then runs as TVM wrote it: an opaque group)."""
    sch = s_tir.Schedule(func)
    out = []
    try:
        root = sch.get_sblock("root")
    except Exception:  # a hand-written TIR kernel without blocks (TVM's scan/sort): nothing to tile
        return []
    for b in sch.get_child_blocks(root):
        block = sch.get(b)
        spatial, reduce = [], []
        for iv in block.iter_vars:
            ext = int(iv.dom.extent)
            (reduce if int(iv.iter_type) == 2 else spatial).append(ext)
        out.append((block.name_hint, LoopNest(tuple(spatial), tuple(reduce))))
    return out


def anchor_index(nests: list[tuple[str, LoopNest]]) -> int:
    """The block with the largest iteration volume; ties go to the later block."""
    best, best_vol = 0, -1
    for i, (_, nest) in enumerate(nests):
        vol = 1
        for e in nest.spatial + nest.reduce:
            vol *= e
        if vol >= best_vol:
            best, best_vol = i, vol
    return best


def _largest_divisor(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def _sums_input_channels(nest: LoopNest) -> bool:
    """An NCHW convolution whose first reduction runs over input channels (not a depthwise one)."""
    return len(nest.spatial) >= 4 and nest.has_reduction and nest.reduce[0] > 1


def default_knobs(nest: LoopNest) -> dict[str, Any]:
    """Simple rules: vector-width inner tile, a register tile of 8 rows (8 output channels
    for a convolution) when there is a reduction, two outer loops in parallel, epilogue
    inside the tile, statistics reduced 16 lanes at a time."""
    n = len(nest.spatial)
    knobs: dict[str, Any] = {f"t{i}": 1 for i in range(n)}
    knobs.update({f"r{j}": 1 for j in range(len(nest.reduce))})
    if n:
        knobs[f"t{n - 1}"] = _largest_divisor(nest.spatial[-1], 16)
    if _sums_input_channels(nest):
        # NCHW conv over input channels: 8 output channels x 16 columns, so every input
        # vector loaded feeds 8 accumulators (a 4-row tile of one channel feeds one)
        knobs["t1"] = _largest_divisor(nest.spatial[1], 8)
    elif n >= 2 and nest.has_reduction:  # GEMM: 8 rows x 16 columns = 8 vector accumulators,
        knobs[f"t{n - 2}"] = _largest_divisor(nest.spatial[-2], 8)  # enough to hide FMA latency
    knobs.update(
        parallel=min(2, n - 1) if n >= 2 else n,  # keep the innermost tile loop out, so
        # per-row producers (norm statistics) are not recomputed for every column tile
        vector=True, unroll=64, inline_epilogue=True,
        # without a reduction nothing is recomputed by inlining; under one, an inlined producer
        # (padding, GELU) would be recomputed for every column tile
        inline_producers=not nest.has_reduction,
        epilogue_at=n - 1, producer_at=max(-1, n - 2) if n >= 2 else (0 if n else -1),
        reduce_vector=16, outer_first=0, k_block=0, pack_weight=False, vector_axis=max(0, n - 1),
        winograd=0, wino_rows=4, wino_cols=16, wino_block=0,
    )
    if n >= 4 and nest.has_reduction and nest.spatial[2] >= 16:
        # NCHW convolution: image rows outermost and in parallel, padding (or a producer) made
        # once per row for all channels, then every output-channel tile of that row, while
        # the row's inputs are in cache (channels outermost re-read the whole input per tile)
        knobs.update(outer_first=2, parallel=1, producer_at=0)
    return knobs


SEED_TEMPLATES = ("registers", "inline", "wide", "tall", "packed", "wide-packed", "packed-unrolled",
                  "packed-columns", "channels-vector", "winograd", "coarse")
COARSE_CHUNKS = 4  # chunks per thread that a "coarse" parallel loop must give at least


def seed_schedule(nest: LoopNest, template: str, vectors: VectorUnit | None = None) -> dict[str, Any]:
    """Knob overrides of the default schedule that often beat it, measured first by a new
    study: ``inline`` computes producers in their readers; ``wide`` doubles the register
    tile's columns (16 -> 32 accumulators per row); ``tall`` doubles its rows instead (a
    GEMM's 8 -> 16 rows, a convolution's 1 -> 2 image rows under its 8 output channels),
    which fills half of AVX-512's registers where the columns cannot widen (mobilenet_block's
    pointwise convolution, 112 columns: 9% over the default side by side, reached only
    after 3 minutes of mutations, NOTES 41); not for a depthwise convolution, whose rows
    share no input loads and which it made 11% slower; ``packed`` repacks a GEMM's constant
    weight (``pack_weight``; dropped where the group has none); ``wide-packed`` both;
    ``packed-unrolled`` repacks a dense layer's (a 2-D GEMM's) weight and steps its
    reduction 4 at a time (``r0``; gemm_bn's best plans, 6% over ``packed`` side by side,
    were found only after 3 minutes of mutations, NOTES 40); ``packed-columns`` is
    ``packed-unrolled`` with the ``wide`` tile and the column tiles outermost (``outer_first=1``), so
    each packed column strip of the weight stays in cache while every row uses it (mlp_gelu's
    9.4 MB weights: its seeds ran 1.5x slower than the plan a 10-minute job found, and the
    column order alone was 23% of that, side by side on rocketlake, NOTES 50);
    ``channels-vector`` makes a convolution's output channels its vector axis
    (``vector_axis``), 16 at a time, with its weight packed to match; ``winograd`` computes a
    3x3 convolution as Winograd F(4x4, 3x3) in blocks of rows of tiles, one thread each
    (``winograd_block``), its GEMMs' register tile 6 x 32 (``fit_winograd_tile``; dropped
    where the group's convolution cannot be: ``autofuse.winograd.eligible``); ``coarse`` runs
    only a batch-like outer loop in parallel where it alone feeds every thread (``_coarse``);
    ``registers`` is the default schedule alone.  The tiles are sized for AVX-512; with
    ``vectors`` (the target's ``VectorUnit``) each register tile is shrunk to fit the
    target's registers, so ``registers`` differs from the default schedule only where that one does not fit
    (AVX2: its 8 x 16 GEMM tile needs 19 of the 16 ymm registers, and spills)."""
    overrides = _template(nest, template)
    if vectors is None or (template != "registers" and not overrides):
        return overrides
    fitted = fit_register_tile(nest, overrides, vectors)
    if overrides.get("winograd"):
        fitted["wino_rows"], fitted["wino_cols"] = fit_winograd_tile(overrides, vectors)
    return fitted


def fit_winograd_tile(knobs: dict[str, Any], vectors: VectorUnit) -> tuple[int, int]:
    """The Winograd GEMMs' register tile (``wino_rows``, ``wino_cols``) cut to fit the
    register file (:meth:`VectorUnit.fits`: the accumulators, the row each step loads and
    the broadcast element); the columns are halved first, then rows dropped.  AVX-512 (32
    registers of 16 floats) keeps the seed's 6 x 32 (15 registers); AVX2 (16 of 8) gets
    6 x 16 (15).  resnet_block's seed compiled
    for AVX2, side by side (NOTES 43): 1 x 32 (counting accumulators alone) 0.975 ms, 6 x 8
    (three quarters of the file, NOTES 43's first rule) 0.837, 4 x 16 0.743, 6 x 16 0.684.
    On AVX-512 (NOTES 42): 4 x 16 (the knobs' default) 0.546 ms, 8 x 16 0.471, 8 x 32
    0.433, 6 x 32 0.412."""
    rows, cols = knobs["wino_rows"], knobs["wino_cols"]
    while cols > WINOGRAD_COLS[0] and not vectors.fits(rows, cols):
        cols //= 2
    while rows > WINOGRAD_ROWS[0] and not vectors.fits(rows, cols):
        rows -= 1
    return rows, cols


def _template(nest: LoopNest, template: str) -> dict[str, Any]:
    if template == "registers":
        return {}
    if template == "inline":
        return {"inline_producers": True}
    if template == "wide":
        n = len(nest.spatial)
        if n and nest.has_reduction and nest.spatial[-1] % 32 == 0:
            return {f"t{n - 1}": 32}
        return {}
    if template == "tall":
        n = len(nest.spatial)
        gemm = 2 <= n <= 3 and nest.has_reduction
        if not (gemm or _sums_input_channels(nest)):  # a depthwise conv's rows share no loads: 11% slower
            return {}
        rows = default_knobs(nest)[f"t{n - 2}"]
        tile = _largest_divisor(nest.spatial[n - 2], 2 * rows)
        return {f"t{n - 2}": tile} if tile > rows else {}
    if template == "packed":
        return {"pack_weight": True}
    if template == "wide-packed":
        wide = _template(nest, "wide")
        return {**wide, "pack_weight": True} if wide else {}
    if template == "packed-unrolled":
        dense = len(nest.spatial) == 2 and len(nest.reduce) == 1 and nest.reduce[0] % 4 == 0
        return {"pack_weight": True, "r0": 4} if dense else {}
    if template == "packed-columns":
        unrolled = _template(nest, "packed-unrolled")
        return {**unrolled, **_template(nest, "wide"), "outer_first": 1} if unrolled else {}
    if template == "channels-vector":
        if _sums_input_channels(nest) and nest.spatial[1] % 8 == 0:
            return {"vector_axis": 1, "t1": _largest_divisor(nest.spatial[1], 16), "pack_weight": True}
        return {}
    if template == "coarse":
        return _coarse(nest, num_threads())
    if template == "winograd":
        if not (_sums_input_channels(nest) and nest.reduce[1:] == (3, 3)):
            return {}
        return {"winograd": 4, "wino_block": winograd_block(nest, 4, num_threads()), "wino_rows": 6, "wino_cols": 32}
    raise ValueError(f"unknown seed template {template!r}")


def coarse_parallel(nest: LoopNest, threads: int) -> int:
    """The fewest outer loops that give every thread ``COARSE_CHUNKS`` chunks of work (at the
    default tiles), or the default's count where no fewer do."""
    default = default_knobs(nest)
    outer = [-(-ext // default[f"t{i}"]) for i, ext in enumerate(nest.spatial)]
    for p in range(1, default["parallel"]):
        if math.prod(outer[:p]) >= COARSE_CHUNKS * threads:
            return p
    return default["parallel"]


def _coarse(nest: LoopNest, threads: int) -> dict[str, Any]:
    """The ``coarse`` template, for a nest whose outermost loop (attention's heads) already
    gives every thread several chunks: only that loop in parallel, so each thread keeps whole
    slices (a head's keys and values) in its own cache and no index is split across threads;
    a batched GEMM then takes the ``wide`` tile and steps its reduction 4 at a time, a
    reduction-free kernel (softmax's normalization, whose row statistics are its producers)
    takes two rows per tile, two independent chains of adds.  Every later plan of attention's
    10-minute jobs on emeraldrapids had most of these; side by side, aaf2 (``wide``) with them
    ran 5-9% faster than without (NOTES 62)."""
    p = coarse_parallel(nest, threads)
    if p >= default_knobs(nest)["parallel"]:
        return {}
    n = len(nest.spatial)
    out: dict[str, Any] = {"parallel": p}
    if nest.has_reduction:
        out.update(_template(nest, "wide"))
        if len(nest.reduce) == 1 and nest.reduce[0] % 4 == 0:
            out["r0"] = 4
    elif nest.spatial[n - 2] % 2 == 0:
        out[f"t{n - 2}"] = 2
    return out


def winograd_block(nest: LoopNest, m: int, threads: int) -> int:
    """The tallest ``wino_block`` that cuts an NCHW convolution's rows of F(m x m) tiles
    into at least one block per thread (0: none does).  Taller blocks hand fewer rows from
    one block's padding to the next; resnet_block's plan ran 0.556 ms with blocks of 7 rows,
    0.618 with 1 (NOTES 42)."""
    batch, rows = nest.spatial[0], -(-nest.spatial[2] // m)
    fits = [r for r in WINOGRAD_BLOCKS if r and rows % r == 0 and batch * rows // r >= threads]
    return max(fits, default=0)


def fit_register_tile(nest: LoopNest, overrides: dict[str, Any], vectors: VectorUnit) -> dict[str, Any]:
    """``overrides`` with the register tile (the inner spatial tiles of a reduction) cut to fit
    the register file (:meth:`VectorUnit.fits`, its rows being the product of the tiles other
    than the vector axis's): the widest of those shrinks to a smaller divisor of its loop,
    until the tile fits or only the vector axis is left.  A tile that spills its accumulators
    to the stack on every step runs 2-10x slower (NOTES 36).  The same count sizes the
    Winograd tile (:func:`fit_winograd_tile`)."""
    if not nest.has_reduction:
        return overrides
    knobs = {**default_knobs(nest), **overrides}
    axis = knobs["vector_axis"]
    tiles = {i: min(knobs[f"t{i}"], ext) for i, ext in enumerate(nest.spatial)}
    cols = tiles.pop(axis, 1)
    out = dict(overrides)
    while not vectors.fits(math.prod(tiles.values()), cols):
        rows = [i for i, t in tiles.items() if t > 1]
        if not rows:
            break
        i = max(rows, key=lambda a: tiles[a])
        others = math.prod(tiles.values()) // tiles[i]
        cap = max((r for r in range(1, tiles[i]) if vectors.fits(others * r, cols)), default=1)
        tiles[i] = _largest_divisor(nest.spatial[i], cap)
        out[f"t{i}"] = tiles[i]
    return out


def knob_space(nest: LoopNest, overrides: dict[str, Any] | None = None, *, producers: bool = True,
               epilogue: bool = True, side_reductions: bool = True, weight: bool = False,
               winograd: bool = False) -> dict[str, list[Any]]:
    """Candidate values of every knob for this loop nest (what the search samples).

    ``producers`` / ``epilogue`` / ``side_reductions``: whether the group has blocks
    before / after its anchor, and reduction blocks other than the anchor; knobs for
    blocks it does not have are left out of the space.  ``weight``: whether the anchor
    reads a constant weight that ``pack_weight`` can repack.  ``winograd``: whether the
    anchor is a convolution Winograd can compute (``autofuse.winograd.eligible``).
    """
    overrides = overrides or {}
    max_tile = int(overrides.get("max_tile", 64))
    space: dict[str, list[Any]] = {}
    for i, ext in enumerate(nest.spatial):
        cands = {1} | {2**k for k in range(1, 7) if 2**k <= min(ext, max_tile)}
        cands |= {d for d in range(2, min(ext, max_tile) + 1) if ext % d == 0 and d in (3, 6, 7, 12, 14, 24, 28, 48, 56)}
        space[f"t{i}"] = sorted(cands)
    for j, ext in enumerate(nest.reduce):
        space[f"r{j}"] = sorted({1} | {2**k for k in range(1, 5) if 2**k <= ext} | ({ext} if ext <= 16 else set()))
    n = len(nest.spatial)
    space["parallel"] = list(range(0, min(3, n) + 1))
    space["outer_first"] = list(range(max(1, n)))
    space["vector"] = [True, False]
    space["unroll"] = list(overrides.get("unroll", UNROLL_STEPS))
    space["inline_producers"] = [False, True]
    space["inline_epilogue"] = [True, False]
    space["epilogue_at"] = list(range(-1, n))
    space["producer_at"] = list(range(-1, n))
    if not producers:
        del space["inline_producers"], space["producer_at"]
    if not epilogue:
        del space["inline_epilogue"], space["epilogue_at"]
    if side_reductions:
        space["reduce_vector"] = list(REDUCE_VECTOR_WIDTHS)
    if weight:
        space["pack_weight"] = [False, True]
    if winograd:
        space["winograd"] = [0, *WINOGRAD_TILES]
        space["wino_rows"] = list(WINOGRAD_ROWS)
        space["wino_cols"] = list(WINOGRAD_COLS)
        space["wino_block"] = list(WINOGRAD_BLOCKS)
    if n >= 4 and nest.has_reduction:
        space["vector_axis"] = [a for a in range(n) if nest.spatial[a] > 1 or a == n - 1]
    if nest.has_reduction and any(2 * b <= nest.reduce[0] for b in K_BLOCKS):
        space["k_block"] = [0] + [b for b in K_BLOCKS if 2 * b <= nest.reduce[0]]
    for key, value in default_knobs(nest).items():  # the default schedule is always a point of the space
        if key in space and value not in space[key]:
            space[key] = sorted(space[key] + [value], key=lambda v: (isinstance(v, bool), v))
    return space


def resolve_knobs(nest: LoopNest, knobs: dict[str, Any]) -> dict[str, Any]:
    """Defaults filled in, and every given knob checked (unknown name, bad type, out of range)."""
    full = default_knobs(nest)
    for key, value in knobs.items():
        if key not in full:
            raise PlanError(f"unknown knob {key!r} (knobs of this group: {', '.join(full)})")
        if key in BOOL_KNOBS:
            if not isinstance(value, bool):
                raise PlanError(f"knob {key!r} must be true or false, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int):
            raise PlanError(f"knob {key!r} must be an integer, got {value!r}")
        elif key[0] in "tr" and key[1:].isdigit():
            ext = (nest.spatial if key[0] == "t" else nest.reduce)[int(key[1:])]
            if not 1 <= value <= ext:
                raise PlanError(f"tile {key}={value} is out of range 1..{ext} (loop extent {ext})")
        elif key == "vector_axis" and not 0 <= value < max(1, len(nest.spatial)):
            raise PlanError(f"vector_axis={value} is out of range 0..{max(1, len(nest.spatial)) - 1}")
        elif key == "outer_first" and not 0 <= value < max(1, len(nest.spatial)):
            raise PlanError(f"outer_first={value} is out of range 0..{max(1, len(nest.spatial)) - 1}")
        elif key == "parallel" and not 0 <= value <= len(nest.spatial):
            raise PlanError(f"parallel={value} is out of range 0..{len(nest.spatial)}")
        elif key == "unroll" and not 0 <= value <= 4096:
            raise PlanError(f"unroll={value} is out of range 0..4096")
        elif key in ("epilogue_at", "producer_at") and not -1 <= value < len(nest.spatial):
            raise PlanError(f"{key}={value} is out of range -1..{len(nest.spatial) - 1}")
        elif key == "k_block" and value < 0:
            raise PlanError(f"k_block={value} must be 0 (off) or a positive block length")
        elif key == "k_block" and value and not (nest.has_reduction and value <= nest.reduce[0]):
            raise PlanError(f"k_block={value} needs a reduction loop of at least that length "
                            f"(reduction loops: {list(nest.reduce) or 'none'})")
        elif key == "winograd" and value not in (0, *WINOGRAD_TILES):
            raise PlanError(f"winograd={value} must be 0 (direct) or a tile size in {', '.join(map(str, WINOGRAD_TILES))}")
        elif key == "wino_rows" and value not in WINOGRAD_ROWS:
            raise PlanError(f"wino_rows={value} is out of range {WINOGRAD_ROWS[0]}..{WINOGRAD_ROWS[-1]}")
        elif key == "wino_cols" and value not in WINOGRAD_COLS:
            raise PlanError(f"wino_cols={value} must be one of {', '.join(map(str, WINOGRAD_COLS))}")
        elif key == "wino_block" and value not in WINOGRAD_BLOCKS:
            raise PlanError(f"wino_block={value} must be one of {', '.join(map(str, WINOGRAD_BLOCKS))}")
        elif key == "reduce_vector" and value not in REDUCE_VECTOR_WIDTHS:
            raise PlanError(f"reduce_vector={value} must be one of {', '.join(map(str, REDUCE_VECTOR_WIDTHS))}")
        full[key] = value
    return full


def apply_cpu(sch: s_tir.Schedule, kernel: str, anchor: int, knobs: dict[str, Any]) -> None:
    """Schedule ``kernel`` in ``sch`` (in place). ``anchor`` indexes the root's child blocks.
    A group with ``winograd`` on holds a Winograd convolution (``build`` substituted it) and
    gets that algorithm's schedule."""
    try:
        if knobs["winograd"]:
            from autofuse import winograd  # imported here: it imports this module for its steps

            winograd.schedule(sch, kernel, knobs["winograd"], knobs)
        else:
            _apply_cpu(sch, kernel, anchor, knobs)
    except ScheduleRejected:
        raise
    except Exception as e:  # TVM's ScheduleError and friends: this assignment is invalid
        raise ScheduleRejected(_reason(e)) from None


def _reason(e: Exception) -> str:
    text = str(e)
    for line in text.splitlines():
        if line.strip().startswith("Error message:"):
            return line.split(":", 1)[1].strip()
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-1][:300] if lines else type(e).__name__


def _apply_cpu(sch: s_tir.Schedule, kernel: str, anchor_idx: int, k: dict[str, Any]) -> None:
    sch.work_on(kernel)
    root = sch.get_sblock("root")
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(root)]
    anchor_name = names[anchor_idx]
    outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(root)}
    before, after = names[:anchor_idx], names[anchor_idx + 1 :]

    if k["inline_producers"]:
        for name in reversed(before):  # element-wise producers (padding, residual add) into their readers
            try_step(lambda: sch.compute_inline(name))
    if k["inline_epilogue"]:
        for name in after:  # intermediate epilogue blocks collapse into the last one
            if name not in outputs:
                try_step(lambda: sch.compute_inline(name))
    partial_sums = _rfactor_side_reductions(sch, root, anchor_name, k["reduce_vector"])
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(root)]  # rfactor added blocks
    before, after = names[: names.index(anchor_name)], names[names.index(anchor_name) + 1 :]

    anchor = sch.get_sblock(anchor_name)
    loops = sch.get_loops(anchor)
    iters = sch.get(anchor).iter_vars
    if len(loops) != len(iters):
        raise ScheduleRejected(f"anchor block {anchor_name} has a loop nest autofuse cannot tile")
    s_outer, s_inner, r_outer, r_inner = [], [], [], []
    inner_axes = []  # the spatial axis of each loop in s_inner
    blocks = []  # the k_block loop, outermost
    si = ri = 0
    for loop, iv in zip(loops, iters):
        ext = int(iv.dom.extent)
        if int(iv.iter_type) == 2:
            if ri == 0 and 0 < k["k_block"] < ext:
                block_loop, loop = sch.split(loop, [None, k["k_block"]])
                blocks.append(block_loop)
                ext = k["k_block"]
            t, ri = k[f"r{ri}"], ri + 1
            outer, inner = r_outer, r_inner
        else:
            t, si = k[f"t{si}"], si + 1
            outer, inner = s_outer, s_inner
        if t > 1 and inner is s_inner:
            inner_axes.append(si - 1)
        if t <= 1:
            outer.append(loop)
        elif t >= ext:
            inner.append(loop)
        else:
            o, i = sch.split(loop, [None, t])
            outer.append(o)
            inner.append(i)
    if r_outer or r_inner:
        acc = 1
        for loop in s_inner:
            acc *= int(sch.get(loop).extent)
        if acc > MAX_ACCUMULATORS:  # LLVM spends minutes allocating registers for such tiles, to no gain
            raise ScheduleRejected(f"register tile of {acc} accumulators exceeds {MAX_ACCUMULATORS}")
    moved = k["vector_axis"] in inner_axes[:-1]  # not the output's innermost axis: summed in a local tile
    if moved:
        s_inner.append(s_inner.pop(inner_axes.index(k["vector_axis"])))
    if 0 < k["outer_first"] < len(s_outer):
        s_outer.insert(0, s_outer.pop(k["outer_first"]))
    sch.reorder(*(blocks + s_outer + r_outer + r_inner + s_inner))

    p = min(k["parallel"], len(s_outer))
    tile_loops = list(s_outer)
    if p >= 1:
        fused = sch.fuse(*s_outer[:p]) if p > 1 else s_outer[0]
        sch.parallel(fused)
        tile_loops = [fused] + s_outer[p:]
    if k["vector"] and s_inner:
        sch.vectorize(s_inner[-1])
    first = (blocks or tile_loops or r_outer or r_inner or s_inner)[0]
    if k["unroll"]:
        sch.annotate(first, "pragma_auto_unroll_max_step", k["unroll"])
        sch.annotate(first, "pragma_unroll_explicit", 1)

    def at(index: int) -> Any:
        """The tile loop for a knob index over the original spatial outer loops (none under
        a k_block loop: a tile there holds partial sums only)."""
        if index < 0 or not tile_loops or blocks:
            return None
        pos = max(0, index - p + 1) if p >= 1 else index
        return tile_loops[min(pos, len(tile_loops) - 1)]

    placed = {anchor_name}
    if moved:
        if not tile_loops or blocks:  # the local tile needs a tile loop holding whole sums
            raise ScheduleRejected(f"vector_axis={k['vector_axis']} needs an outer tile loop and k_block=0")
        placed.add(_accumulate_locally(sch, anchor, tile_loops[-1], k["vector_axis"]))
    for name in after:
        loop = at(k["epilogue_at"])
        # Only an epilogue fed by the anchor's tile alone may move into the tile: TVM's
        # reverse_compute_at widens the region to a side producer's (e.g. a broadcast
        # statistic at root) and the block would read anchor values not yet computed.
        producers = {sch.get(b).name_hint for b in sch.get_producers(sch.get_sblock(name))}
        if loop is not None and producers and producers <= placed and not _splits_reduction(sch, name, loop):
            placed.add(name)
            sch.reverse_compute_at(name, loop)
            own = loops_below(sch, name, loop)
            if k["vector"] and own:  # never the shared tile loop itself
                try_step(lambda: _vectorize(sch, own[-1]))
        elif name not in partial_sums:
            schedule_at_root(sch, name, k)
    for name in reversed(before):
        loop = at(k["producer_at"])
        # A block that is not a producer of the tile (a horizontally fused sibling, an output of
        # the group, a side input of the epilogue) keeps its own loop nest at root.
        if loop is None or name in outputs or not try_step(lambda: sch.compute_at(name, loop)):
            if name not in partial_sums:
                schedule_at_root(sch, name, k)
    for name in partial_sums:
        _vectorize_partial_sums(sch, name, k)
    if k["pack_weight"]:
        _pack_weight(sch, kernel, anchor, k)
    if blocks or r_outer or r_inner:
        sch.decompose_reduction(anchor, (blocks or r_outer or r_inner)[0])
    racy = [realize.block.name_hint for realize, loops in _realizes(sch.mod[kernel].body)
            if _reduces_over(realize, [l.loop_var for l in loops if l.kind == tirx.ForKind.PARALLEL])]
    if racy:  # a safety net: no schedule above should make one
        raise ScheduleRejected(f"block {racy[0]} would sum over a parallel loop (a data race)")


def _realizes(stmt: Any, loops: tuple[Any, ...] = ()) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    """Every block realize under ``stmt``, with the loops (``tirx.For``) around it, outermost first."""
    if isinstance(stmt, s_tir.SBlockRealize):
        yield stmt, loops
        yield from _realizes(stmt.block.body, loops)
    elif isinstance(stmt, tirx.For):
        yield from _realizes(stmt.body, loops + (stmt,))
    elif isinstance(stmt, tirx.SeqStmt):
        for child in stmt.seq:
            yield from _realizes(child, loops)
    elif isinstance(stmt, tirx.IfThenElse):
        yield from _realizes(stmt.then_case, loops)
        if stmt.else_case is not None:
            yield from _realizes(stmt.else_case, loops)
    elif hasattr(stmt, "body"):  # attributes, lets, allocations
        yield from _realizes(stmt.body, loops)


def _reduces_over(realize: Any, loop_vars: list[Any]) -> bool:
    """Whether one of the block's reduction iterators is bound to one of ``loop_vars``."""
    return any(int(iv.iter_type) == 2 and any(v.same_as(w) for v in tirx.analysis.undefined_vars(value)
                                              for w in loop_vars)
               for iv, value in zip(realize.block.iter_vars, realize.iter_values))


def _splits_reduction(sch: s_tir.Schedule, name: str, loop: Any) -> bool:
    """Whether moving reduction block ``name`` under the tile ``loop`` (reverse_compute_at)
    would bind one of its reduction iterators to that loop or one outside it: each tile would
    add part of every sum, and tiles in parallel race on them.  A Winograd inverse transform
    (summed over the anchor's first axis) placed so gave wrong results in some runs on two
    threads (NOTES 39).  Such an epilogue keeps its own loop nest at root."""
    if not any(int(iv.iter_type) == 2 for iv in sch.get(sch.get_sblock(name)).iter_vars):
        return False
    probe = sch.copy()
    try:
        probe.reverse_compute_at(name, loop)
    except Exception:  # TVM refuses the move: compute_at fails the same way below, as before
        return False
    shared = probe.get(loop)
    loops = [probe.get(l) for l in probe.get_loops(name)]
    outer = [l.loop_var for l in loops[: next(i for i, l in enumerate(loops) if l.same_as(shared)) + 1]]
    return any(_reduces_over(realize, outer) for realize, _ in _realizes(shared) if realize.block.name_hint == name)


def _accumulate_locally(sch: s_tir.Schedule, anchor: Any, tile_loop: Any, axis: int) -> str:
    """The anchor accumulates its tile in a local buffer with ``axis`` innermost (its vector
    axis), written back to the output once per tile: a vector along an axis that is not
    the output's innermost would otherwise be a gather and a scatter per reduction step."""
    write_back = sch.cache_write(anchor, 0, "local")
    sch.reverse_compute_at(write_back, tile_loop)
    ndim = len(sch.get(anchor).writes[0].region)
    sch.transform_layout(anchor, ("write", 0), tirx.IndexMap.from_func(
        lambda *ax: [a for i, a in enumerate(ax) if i != axis] + [ax[axis]], ndim=ndim))
    return sch.get(write_back).name_hint


class WeightRead(NamedTuple):
    """Where a block reads the weight ``pack_weight`` repacks."""

    read: int  # index in ``block.reads``
    axis: int  # the block's spatial axis whose inner tile packs it
    dim: int  # the weight's dimension that axis indexes
    reduced: tuple[bool, ...]  # per weight dimension: indexed by a reduction iterator


def weight_read(block: Any, params: list[Any]) -> WeightRead | None:
    """Where the block reads the operand ``pack_weight`` repacks: a buffer of ``params``
    read at plain iterators, at least one a reduction and one a spatial iterator, but not
    at the first spatial one (a GEMM's rows, a convolution's images: a
    weight is shared by all of them).  A GEMM's ``B[k, j]`` (axis: the columns j), a
    convolution's ``W[c, rc, rh, rw]`` (axis: the output channels c); the axis is the
    innermost spatial iterator that indexes the weight.  None if none."""
    spatial = [iv.var for iv in block.iter_vars if int(iv.iter_type) != 2]
    reduce = [iv.var for iv in block.iter_vars if int(iv.iter_type) == 2]
    if not spatial or not reduce:
        return None

    def used(var: Any, index: list[Any]) -> bool:
        return any(x.same_as(var) for x in index)

    for i, region in enumerate(block.reads):
        if not any(region.source.same_as(p) for p in params):
            continue
        index = [r.min for r in region.region]
        if not all(any(x.same_as(v) for v in spatial + reduce) for x in index):
            continue  # an index that is not a plain iterator (a convolution's input, h + rh)
        axes = [a for a, s in enumerate(spatial) if used(s, index)]
        reduced = tuple(any(x.same_as(r) for r in reduce) for x in index)
        if axes and axes[0] > 0 and any(reduced):
            dim = next(d for d, x in enumerate(index) if x.same_as(spatial[axes[-1]]))
            return WeightRead(i, axes[-1], dim, reduced)
    return None


def _pack_weight(sch: s_tir.Schedule, kernel: str, anchor: Any, k: dict[str, Any]) -> None:
    """Read the anchor's weight through a copy in layout (other spatial axes, c // tile,
    reduction axes, c % tile), c the weight's spatial axis and tile its inner tile (``t<c>``),
    the copy marked as a layout rewrite that the build runs once on the constant (see
    ``build.schedule_module``)."""
    func = sch.mod[kernel]
    block = sch.get(anchor)
    found = weight_read(block, list(func.params))
    if found is None:
        raise ScheduleRejected("pack_weight: the anchor reads no weight indexed by its outputs and its reduction")
    idx, axis, col, is_red = found
    ext = int(block.reads[idx].source.shape[col])
    tile = min(k[f"t{axis}"], ext)
    if tile <= 1 or ext % tile:
        raise ScheduleRejected(f"pack_weight needs an inner tile t{axis} that divides {ext} (it is {tile})")

    def packed(*ax: Any) -> list[Any]:
        lead = [a for i, a in enumerate(ax) if i != col and not is_red[i]]
        red = [a for i, a in enumerate(ax) if is_red[i]]
        return [*lead, ax[col] // tile, *red, ax[col] % tile]

    copy = sch.cache_read(anchor, idx, "global")
    sch.transform_layout(anchor, ("read", idx), tirx.IndexMap.from_func(packed, ndim=len(is_red)))
    sch.annotate(copy, "meta_schedule.layout_rewrite_preproc", True)


def _rfactor_side_reductions(sch: s_tir.Schedule, root: Any, anchor: str, width: int) -> list[str]:
    """Split the innermost reduction loop of every other reduction block by ``width`` and
    rfactor it: a ``<block>_rf`` block accumulates ``width`` independent partial sums (one
    vector register), and the original block adds them up.  Returns the ``_rf`` blocks.
    Blocks at root only, before any compute-at (TVM's rfactor rejects shared loops)."""
    if not width:
        return []
    made = []
    for b in sch.get_child_blocks(root):
        block = sch.get(b)
        if block.name_hint == anchor or not block.iter_vars or int(block.iter_vars[-1].iter_type) != 2:
            continue
        loops = sch.get_loops(b)
        if len(loops) != len(block.iter_vars):
            continue
        ext = int(sch.get(loops[-1]).extent)
        if ext < 2 * width or ext % width:
            continue
        name = block.name_hint
        try:
            _, inner = sch.split(loops[-1], [None, width])
            made.append(sch.get(sch.rfactor(inner, 0)).name_hint)
        except Exception as e:  # a reducer TVM cannot factor (not sum/max/min/prod)
            raise ScheduleRejected(f"reduce_vector={width}: cannot rfactor {name}: {_reason(e)}") from None
    return made


def _vectorize_partial_sums(sch: s_tir.Schedule, name: str, k: dict[str, Any]) -> None:
    """An ``_rf`` block wherever it was placed: its own loops reordered to (other spatial,
    reduction, partial-sum lane), the lane loop vectorized, the init hoisted out."""
    block = sch.get_sblock(name)
    loops = sch.get_loops(block)
    realize = sch.get(loops[-1]).body
    if not isinstance(realize, s_tir.SBlockRealize):
        return
    loop_vars = [sch.get(l).loop_var for l in loops]
    owner = []  # index into loops of the loop each iter var is bound to
    for value in realize.iter_values:
        hits = [i for i, v in enumerate(loop_vars) if v.same_as(value)]
        owner.append(hits[0] if hits else None)
    kinds = [int(iv.iter_type) for iv in realize.block.iter_vars]
    reduce_idx = [o for o, kind in zip(owner, kinds) if kind == 2]
    lane_idx = owner[0]
    if lane_idx is None or None in reduce_idx or not reduce_idx:
        return
    own = [i for i, l in enumerate(loops) if len(sch.get_child_blocks(l)) == 1]  # not tile loops shared
    if lane_idx not in own or any(i not in own for i in reduce_idx) or own != list(range(own[0], len(loops))):
        return
    spatial = [loops[i] for i in own if i != lane_idx and i not in reduce_idx]
    reduce_loops = [loops[i] for i in sorted(reduce_idx)]
    shared = own[0] > 0
    lane = loops[lane_idx]
    sch.reorder(*(spatial + reduce_loops + [lane]))
    if not shared and spatial and k["parallel"]:
        try_step(lambda: sch.parallel(spatial[0]))
    sch.vectorize(lane)
    sch.decompose_reduction(block, reduce_loops[0])


def loops_below(sch: s_tir.Schedule, block: str, loop: Any) -> list[Any]:
    """The block's own loops nested under ``loop`` (after compute-at)."""
    loops = sch.get_loops(block)
    target = sch.get(loop)
    for i, l in enumerate(loops):
        if sch.get(l).same_as(target):
            return loops[i + 1 :]
    return []


def schedule_at_root(sch: s_tir.Schedule, name: str, k: dict[str, Any]) -> None:
    """A block left at root: parallel outer spatial loops, vectorized inner loop."""
    block = sch.get_sblock(name)
    loops = sch.get_loops(block)
    iters = sch.get(block).iter_vars
    if len(loops) != len(iters):
        return
    spatial = [l for l, iv in zip(loops, iters) if int(iv.iter_type) != 2]
    if not spatial:
        return
    lead = [l for l in loops[: len(spatial)] if l in spatial][: max(1, min(2, k["parallel"]))]
    if len(lead) == len(loops) and len(loops) > 1:
        lead = lead[:-1]
    if k["parallel"] and lead:
        try_step(lambda: sch.parallel(sch.fuse(*lead) if len(lead) > 1 else lead[0]))
    if k["vector"] and int(iters[-1].iter_type) != 2 and len(loops) > len(lead):
        try_step(lambda: _vectorize(sch, sch.get_loops(name)[-1]))


def _vectorize(sch: s_tir.Schedule, loop: Any) -> None:
    """Vectorize a secondary block's inner loop, at most ``MAX_VECTOR_LANES`` lanes at a time.
    A whole row (``T.vectorized(3072)``) is one LLVM vector thousands of lanes wide: LLVM
    then spends 10-20 s legalizing it (a GELU epilogue at an outer tile loop timed out that
    way in every mlp_gelu run, NOTES 18), for code no faster than a loop over 4 registers."""
    ext = int(sch.get(loop).extent)
    if ext > MAX_VECTOR_LANES:
        lanes = _vector_lanes(ext)
        if not lanes:
            raise ScheduleRejected(f"no vector width divides {ext}")  # caught by try_step: left scalar
        loop = sch.split(loop, [None, lanes])[1]
    sch.vectorize(loop)


def _vector_lanes(ext: int) -> int:
    """The widest split of ``ext`` into whole vectors: a multiple of 16 floats (one AVX-512
    register) up to ``MAX_VECTOR_LANES`` if one divides it, else the largest divisor in 2..that."""
    divisors = [d for d in range(MAX_VECTOR_LANES, 1, -1) if ext % d == 0]
    return next((d for d in divisors if d % 16 == 0), divisors[0] if divisors else 0)


def try_step(step) -> bool:
    """Best-effort step (inlining, vectorizing a secondary block): skip if TVM says no."""
    try:
        step()
        return True
    except Exception:
        return False


def apply_cuda(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """GPU schedules from TVM's dlight rules (block/thread bindings for every kernel)."""
    from tvm.s_tir import dlight as dl

    with target:
        return dl.ApplyDefaultSchedule(
            dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()
        )(mod)
