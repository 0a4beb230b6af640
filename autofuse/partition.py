"""Legal fusion partitions of an operator DAG: checking, encoding, enumerating.

A *partition* assigns every op of a :class:`Dag` to exactly one group; each group
becomes one fused kernel.  Canonical form (see :func:`canonical`): every group
sorted ascending, groups sorted by their first op.

Legality rules (``violations`` reports each broken rule in words)
-------------------------------------------------------------------
1. *Cover*: every op index ``0..n-1`` is in exactly one group; no empty groups.
   (If this fails, only rule-1 problems are reported: the others need a cover.)
2. *Connected*: every group is connected in the *fusion graph*, the undirected
   graph whose edges are the producer->consumer edges plus the sibling pairs
   (rule 8).  A kernel that is two unrelated islands buys nothing, and the
   decision encoding below can only express connected groups.
3. *Convex*: no path from a group member leaves the group and re-enters it (the
   kernel would have to wait for its own output).
4. *Acyclic*: the group DAG (quotient graph) has no cycle.  Rule 3 is implied by
   rule 4; it is reported separately because its message names the path.
5. An OPAQUE or TUPLE op is alone in its group.
6. A group holds at most one OUT_EWISE_FUSABLE ("complex": GEMM, conv,
   layer_norm, softmax) op.
7. A group holding a complex op holds no other op of kind > INJECTIVE: the
   prologues/epilogues of a complex op are element-wise/broadcast/injective only
   (so no reduction before, after, or beside a complex op).  Groups without a
   complex op may mix ELEMWISE/BROADCAST/INJECTIVE/REDUCTION freely, so several
   reductions chain in one group (softmax/layer-norm style reduce -> ewise ->
   reduce).
8. *Siblings*: ops ``i < j`` are siblings (fusable horizontally) iff they read a
   common graph input name or a common producer op, neither reaches the other,
   and both have kind <= REDUCTION.

Rules 5-7 collapse into a *pairwise* compatibility relation (:func:`_compatible`):
a group obeys them iff every pair of its members is compatible.  That makes them
monotone - once a merge breaks them, every further merge does too - so the
repair and the enumerator can reject such merges on the spot.  Rules 3-4 are not
monotone (merging the middle op of a path can heal a non-convex group), yet
walking the decisions in order never needs an illegal intermediate partition on
the way to a legal one (proof in :func:`enumerate_partitions`), which is what
lets the enumerator prune on them and the greedy repair round-trip.

Decision encoding (what the search samples)
--------------------------------------------
One boolean per fusion-graph pair whose two ops are kind-compatible (pairs that
can never share a group are left out: they would only waste search space):
first edges ``"e{producer}_{consumer}"`` sorted by (consumer, producer), then
siblings ``"s{i}_{j}"`` sorted by (i, j).  True means "fuse".
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

Partition = tuple[tuple[int, ...], ...]


class Kind(enum.IntEnum):
    """TVM's OpPatternKind values (the order matters: smaller fuses more easily)."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    REDUCTION = 3
    OUT_EWISE_FUSABLE = 4
    TUPLE = 7
    OPAQUE = 8


_LONERS = (Kind.TUPLE, Kind.OPAQUE)

# Enumerator state of one group, as bitmasks: (members, blocked, descendants, ancestors).
_Group = tuple[int, int, int, int]


@dataclass(frozen=True)
class Dag:
    """Minimal DAG view: ops in topological order, their kinds and inputs.

    ``preds[i]``: ops whose output op ``i`` reads (all ``< i``);
    ``reads[i]``: names of graph-level inputs (activations/params) op ``i`` reads.
    Lists and plain ints are accepted and normalised to tuples / :class:`Kind`,
    so the instance stays hashable (results are cached per DAG).
    """

    kinds: tuple[Kind, ...]
    preds: tuple[tuple[int, ...], ...]
    reads: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        if not (len(self.kinds) == len(self.preds) == len(self.reads)):
            raise ValueError(
                f"Dag field lengths differ: {len(self.kinds)} kinds, {len(self.preds)} preds, {len(self.reads)} reads"
            )
        kinds = []
        for i, k in enumerate(self.kinds):
            try:
                kinds.append(Kind(k))
            except ValueError:
                raise ValueError(f"op {i} has unknown kind {k!r} (expected one of {[int(x) for x in Kind]})") from None
        for i, ps in enumerate(self.preds):
            for p in ps:
                if not isinstance(p, int) or not 0 <= p < i:
                    raise ValueError(
                        f"op {i} lists predecessor {p!r}; predecessors must be earlier ops (0 <= p < {i}), "
                        "i.e. ops must be in topological order"
                    )
        object.__setattr__(self, "kinds", tuple(kinds))
        object.__setattr__(self, "preds", tuple(tuple(ps) for ps in self.preds))
        object.__setattr__(self, "reads", tuple(tuple(rs) for rs in self.reads))

    @property
    def n(self) -> int:
        """Number of ops."""
        return len(self.kinds)


@dataclass(frozen=True)
class Decision:
    """One fuse/don't-fuse choice: an edge ``a -> b`` or a sibling pair ``a < b``."""

    kind: Literal["edge", "sibling"]
    a: int
    b: int

    @property
    def key(self) -> str:
        """Stable parameter name for the search, e.g. ``"e3_5"`` or ``"s2_4"``."""
        return f"{'e' if self.kind == 'edge' else 's'}{self.a}_{self.b}"


# --------------------------------------------------------------------------- public API


def canonical(groups: Iterable[Iterable[int]]) -> Partition:
    """Sort each group and the groups (by first op) so equal partitions compare equal."""
    return tuple(sorted(tuple(sorted(g)) for g in groups))


def unfused(dag: Dag) -> Partition:
    """Every op in its own group (always legal)."""
    return tuple((i,) for i in range(dag.n))


def decisions(dag: Dag) -> list[Decision]:
    """The search's boolean choices, in their stable order (see module docstring)."""
    return list(_index(dag).decisions)


def space_size(dag: Dag) -> int:
    """Size of the raw decision space (most choice vectors map to duplicate partitions)."""
    return 2 ** len(_index(dag).decisions)


def violations(dag: Dag, partition: Sequence[Sequence[int]]) -> list[str]:
    """Human-readable reasons why ``partition`` is illegal; empty means legal."""
    problems = _cover_problems(dag.n, partition)
    if problems:
        return problems
    ix = _index(dag)
    groups = canonical(partition)
    for g in groups:
        mask = _mask(g)
        problems += [f"group {g} {p}" for p in _kind_problems(dag, g)]
        if not _connected(ix, mask):
            problems.append(f"group {g} is not connected in the fusion graph (edges + sibling pairs)")
        path = _escape_path(ix, mask)
        if path is not None:
            problems.append(f"group {g} is not convex: path {_arrow(path)} leaves and re-enters it")
    if not any("not convex" in p for p in problems):  # a non-convex group always closes a cycle too
        cycle = _quotient_cycle(ix, _labels(dag.n, groups))
        if cycle is not None:
            problems.append(f"groups {_arrow([groups[c] for c in cycle])} form a cycle in the group DAG")
    return problems


def is_legal(dag: Dag, partition: Sequence[Sequence[int]]) -> bool:
    """True iff :func:`violations` finds nothing."""
    return not violations(dag, partition)


def choices_for(dag: Dag, partition: Sequence[Sequence[int]]) -> list[bool]:
    """Choice vector of a partition: a decision is True iff both its ops share a group.

    This is the canonical vector: ``partition_from_choices`` maps it back to
    ``partition`` for every legal partition (used to enqueue reference plans).
    """
    problems = _cover_problems(dag.n, partition)
    if problems:
        raise ValueError(f"not a partition of the {dag.n} ops: {problems[0]}")
    label = _labels(dag.n, partition)
    return [label[d.a] == label[d.b] for d in _index(dag).decisions]


def partition_from_choices(dag: Dag, choices: Sequence[bool]) -> tuple[Partition, list[str]]:
    """Turn a (possibly contradictory) choice vector into a legal partition.

    Returns the partition and one reason per chosen merge that had to be dropped
    (``"e3_5 cut: ..."``), in decision order.  Two steps:

    1. Fast path: unite the groups of the True decisions in order, skipping a
       union that breaks the kind rules 5-7 (monotone, so rejected for good).  If
       the result is also convex and acyclic, return it: every legal partition
       ``p`` comes back from ``choices_for(p)`` unchanged this way.
    2. Repair: start again from singletons and apply the True decisions in order,
       each only if the whole partition stays legal; retry the postponed ones
       until nothing changes (a merge that is not convex yet may become fine once
       the op in the middle has joined).  Never yields an illegal partition.
       (Step 2 alone would also round-trip ``choices_for``; see
       :func:`enumerate_partitions` for why.)
    """
    ix = _index(dag)
    if len(choices) != len(ix.decisions):
        raise ValueError(f"expected {len(ix.decisions)} choices for this DAG, got {len(choices)}")
    wanted = [pos for pos, want in enumerate(choices) if want]

    uf = _UnionFind(dag.n)
    cut: dict[int, str] = {}  # decision position -> why it was not honoured
    for pos in wanted:
        d = ix.decisions[pos]
        ra, rb = uf.find(d.a), uf.find(d.b)
        if ra == rb:
            continue
        problems = _kind_problems(dag, sorted(uf.members[ra] + uf.members[rb]))
        if problems:
            cut[pos] = f"{d.key} cut: merged group {problems[0]}"
        else:
            uf.union(ra, rb)
    if _quotient_cycle(ix, uf.labels()) is None:
        return uf.partition(), [cut[pos] for pos in sorted(cut)]

    uf, cut = _UnionFind(dag.n), {}
    pending, progress = wanted, True
    while pending and progress:
        progress, postponed = False, []
        for pos in pending:
            d = ix.decisions[pos]
            ra, rb = uf.find(d.a), uf.find(d.b)
            if ra == rb:
                continue
            reason = _merge_problem(dag, ix, uf, ra, rb)
            if reason is None:
                uf.union(ra, rb)
                progress = True
            else:
                postponed.append(pos)
                cut[pos] = f"{d.key} cut: {reason}"
        pending = postponed
    return uf.partition(), [cut[pos] for pos in pending]


def most_fused(dag: Dag) -> Partition:
    """The partition with every decision turned to "fuse", repaired into legality: the
    fewest kernels the rules allow, greedily.  TVM's FuseOps stops earlier on some graphs
    (it fuses element-wise ops after a complex op, never before one: the residual add stays
    out of layer_norm), so this is a partition its default never tries."""
    return partition_from_choices(dag, [True] * len(_index(dag).decisions))[0]


def epilogues_apart(dag: Dag, partition: Sequence[Sequence[int]]) -> Partition:
    """``partition`` with each group that holds one complex op (GEMM, convolution) and ops
    downstream of it cut in two: those ops (the epilogue), and the rest of the group.  A GEMM
    kernel without an epilogue keeps its inner loop to loads and FMAs, and the epilogue is
    one pass over an output that is often still in cache.  A cut that would break a rule
    (an epilogue op that also feeds the rest) leaves that group whole.  ``partition`` is
    legal, so its groups are convex: a descendant of the complex op in its group is reached
    through the group."""
    desc = _index(dag).desc
    parts = [tuple(g) for g in partition]
    for group in list(parts):
        anchors = [i for i in group if dag.kinds[i] == Kind.OUT_EWISE_FUSABLE]
        if len(anchors) != 1:
            continue
        tail = tuple(i for i in group if desc[anchors[0]] >> i & 1)
        if not tail:
            continue
        idx = parts.index(group)
        cut = parts[:idx] + [tuple(i for i in group if i not in tail), tail] + parts[idx + 1:]
        if is_legal(dag, cut):
            parts = cut
    return canonical(parts)


def enumerate_partitions(dag: Dag, limit: int | None = None) -> Iterator[Partition]:
    """Yield every legal partition exactly once (at most ``limit`` of them).

    Depth-first search over the decisions in order; the first partition yielded
    is :func:`unfused`.  Each leaf is one canonical choice vector (=
    ``choices_for`` of its partition), which makes the output duplicate-free: a
    decision whose ops are already together is forced True, and a False decision
    forbids its two groups from ever merging later.

    A merge is pruned when it breaks the kind rules (monotone), or when the
    partition it yields is not convex and acyclic.  The latter prune is safe
    although rules 3-4 are not monotone, because *on the canonical path of a
    legal partition p every intermediate partition is legal*:

    * while edges are processed (sorted by consumer c), a group is a component of
      p-group G's processed edges.  A path leaving it and re-entering at w <= c
      runs through members of G (G convex) with consumers < w, whose edges are
      processed - so the path never left the component: groups are convex.
      A cycle of intermediate groups would have to stay inside one p-group (else
      p is cyclic) and use only unprocessed edges, all with consumers >= c; ops
      > c are still singletons, so consumers along the cycle strictly increase
      unless they all equal c - impossible for a cycle.
    * once all edges are processed, groups are unions of edge-components of
      p-groups; no DAG edge or path joins two edge-components of a convex G, so
      they stay convex and every group-DAG edge joins different p-groups.

    The same fact makes the greedy repair round-trip ``choices_for``.
    """
    if limit is not None and limit <= 0:
        return
    ix = _index(dag)
    decs = ix.decisions
    # Per group, keyed by its root = its smallest op: bitmasks (members, blocked,
    # descendants, ancestors); ``blocked`` = ops that may never join the group
    # (kind clash, or a False decision between the groups).
    start: dict[int, _Group] = {i: (1 << i, ix.incompatible[i], ix.desc[i], ix.anc[i]) for i in range(dag.n)}
    stack: list[tuple[int, tuple[int, ...], dict[int, _Group]]] = [(0, tuple(range(dag.n)), start)]
    produced = 0
    while stack:
        pos, label, groups = stack.pop()
        if pos == len(decs):
            yield tuple(tuple(_bits(groups[r][0])) for r in sorted(groups))
            produced += 1
            if limit is not None and produced >= limit:
                return
            continue
        d = decs[pos]
        ra, rb = sorted((label[d.a], label[d.b]))
        if ra == rb:  # already together: only True is canonical
            stack.append((pos + 1, label, groups))
            continue
        (ma, ba, da, aa), (mb, bb, db, ab) = groups[ra], groups[rb]
        # True branch (pushed first, so popped after the False branch).
        if not (ba & mb or bb & ma):
            merged = (ma | mb, ba | bb, da | db, aa | ab)
            if not _between(merged) and not _closes_cycle(label, groups, merged):
                fused = dict(groups)
                del fused[rb]
                fused[ra] = merged
                stack.append((pos + 1, tuple(ra if r == rb else r for r in label), fused))
        # False branch: these two groups must never merge.
        apart = dict(groups)
        apart[ra], apart[rb] = (ma, ba | mb, da, aa), (mb, bb | ma, db, ab)
        stack.append((pos + 1, label, apart))


def count_partitions(dag: Dag, cap: int = 100_000) -> tuple[int, bool]:
    """Number of legal partitions, counting at most ``cap``; ``exact`` is False if capped."""
    count = 0
    for _ in enumerate_partitions(dag, limit=cap + 1):
        count += 1
    return (cap, False) if count > cap else (count, True)


# --------------------------------------------------------------------------- internals


@dataclass(frozen=True)
class _Index:
    """Per-DAG derived data (bitmask sets: bit ``j`` set = op ``j`` is in the set)."""

    edges: tuple[tuple[int, int], ...]  # deduplicated (producer, consumer)
    desc: tuple[int, ...]  # strict descendants of each op
    anc: tuple[int, ...]  # strict ancestors of each op
    neighbours: tuple[int, ...]  # fusion-graph neighbours (edges + siblings)
    incompatible: tuple[int, ...]  # ops that may never share a group with this op
    decisions: tuple[Decision, ...]


@functools.lru_cache(maxsize=64)
def _index(dag: Dag) -> _Index:
    """Build (once per DAG) reachability, fusion graph and decision list."""
    n = dag.n
    edges = tuple((p, c) for c in range(n) for p in sorted(set(dag.preds[c])))
    succs: list[list[int]] = [[] for _ in range(n)]
    for p, c in edges:
        succs[p].append(c)
    desc = [0] * n
    for i in reversed(range(n)):
        for s in succs[i]:
            desc[i] |= (1 << s) | desc[s]
    anc = [0] * n
    for i in range(n):
        for p in set(dag.preds[i]):
            anc[i] |= (1 << p) | anc[p]

    siblings = sorted(_sibling_pairs(dag, desc))
    neighbours = [0] * n
    for a, b in list(edges) + siblings:
        neighbours[a] |= 1 << b
        neighbours[b] |= 1 << a
    incompatible = [
        _mask(j for j in range(n) if j != i and not _compatible(dag.kinds[i], dag.kinds[j])) for i in range(n)
    ]
    decs = [Decision("edge", p, c) for p, c in edges if _compatible(dag.kinds[p], dag.kinds[c])]
    decs += [Decision("sibling", a, b) for a, b in siblings]
    return _Index(edges, tuple(desc), tuple(anc), tuple(neighbours), tuple(incompatible), tuple(decs))


def _sibling_pairs(dag: Dag, desc: Sequence[int]) -> set[tuple[int, int]]:
    """Pairs (i < j) sharing an input name or producer, unordered by paths, both <= REDUCTION."""
    readers: dict[tuple[str, object], list[int]] = {}
    for i in range(dag.n):
        if dag.kinds[i] > Kind.REDUCTION:
            continue
        for name in set(dag.reads[i]):
            readers.setdefault(("input", name), []).append(i)
        for p in set(dag.preds[i]):
            readers.setdefault(("op", p), []).append(i)
    pairs = set()
    for ops in readers.values():
        for x, i in enumerate(ops):
            for j in ops[x + 1 :]:
                if not (desc[i] >> j) & 1:  # i < j, so only i can reach j
                    pairs.add((i, j))
    return pairs


def _compatible(x: Kind, y: Kind) -> bool:
    """May ops of kinds ``x`` and ``y`` share a group?  (Rules 5-7, pairwise.)"""
    if x in _LONERS or y in _LONERS:
        return False
    if x == Kind.OUT_EWISE_FUSABLE:
        return y <= Kind.INJECTIVE
    if y == Kind.OUT_EWISE_FUSABLE:
        return x <= Kind.INJECTIVE
    return True


def _kind_problems(dag: Dag, members: Sequence[int]) -> list[str]:
    """Rule 5-7 breaches of one group, phrased to follow "group ..."."""
    if len(members) < 2:
        return []
    kinds = {i: dag.kinds[i] for i in members}
    problems = [f"fuses {k.name} op {i} with other ops (it must stay alone)" for i, k in kinds.items() if k in _LONERS]
    complex_ops = [i for i, k in kinds.items() if k == Kind.OUT_EWISE_FUSABLE]
    if len(complex_ops) > 1:
        problems.append(
            f"holds {len(complex_ops)} complex (OUT_EWISE_FUSABLE) ops {complex_ops}; at most one is allowed"
        )
    if complex_ops:
        for i, k in kinds.items():
            if k == Kind.REDUCTION:
                problems.append(
                    f"fuses complex op {complex_ops[0]} with REDUCTION op {i}; "
                    "only ELEMWISE/BROADCAST/INJECTIVE ops may join a complex op"
                )
    return problems


def _merge_problem(dag: Dag, ix: _Index, uf: _UnionFind, ra: int, rb: int) -> str | None:
    """Why uniting groups ``ra`` and ``rb`` would make the partition illegal, or None."""
    members = sorted(uf.members[ra] + uf.members[rb])
    problems = _kind_problems(dag, members)
    if problems:
        return f"merged group {problems[0]}"
    path = _escape_path(ix, _mask(members))
    if path is not None:
        return f"merged group would not be convex: path {_arrow(path)} leaves and re-enters it"
    labels = [ra if r == rb else r for r in uf.labels()]
    if _quotient_cycle(ix, labels) is not None:
        return "merged group would close a cycle in the group DAG"
    return None


def _between(group: _Group) -> int:
    """Ops outside the group lying on a path from it back into it."""
    members, _, desc, anc = group
    return desc & anc & ~members


def _escape_path(ix: _Index, members: int) -> list[int] | None:
    """A path that leaves the group and re-enters it (convexity witness), or None."""
    desc = anc = 0
    for i in _bits(members):
        desc |= ix.desc[i]
        anc |= ix.anc[i]
    outside = desc & anc & ~members
    if not outside:
        return None
    v = (outside & -outside).bit_length() - 1
    src = next(i for i in _bits(members) if (ix.desc[i] >> v) & 1)
    dst = next(i for i in _bits(members) if (ix.desc[v] >> i) & 1)
    return _path(ix, src, v) + _path(ix, v, dst)[1:]


def _path(ix: _Index, src: int, dst: int) -> list[int]:
    """Some directed path src -> ... -> dst (dst must be reachable)."""
    path = [src]
    while path[-1] != dst:
        here = path[-1]
        path.append(next(c for p, c in ix.edges if p == here and (c == dst or (ix.desc[c] >> dst) & 1)))
    return path


def _connected(ix: _Index, members: int) -> bool:
    """Is the group connected in the fusion graph (edges + siblings)?"""
    seen = frontier = members & -members
    while frontier:
        reach = 0
        for i in _bits(frontier):
            reach |= ix.neighbours[i]
        frontier = reach & members & ~seen
        seen |= frontier
    return seen == members


def _quotient_cycle(ix: _Index, label: Sequence[int]) -> list[int] | None:
    """Labels of groups on a cycle of the group DAG (first repeated at the end), or None."""
    preds: dict[int, set[int]] = {r: set() for r in label}
    succs: dict[int, set[int]] = {r: set() for r in label}
    for p, c in ix.edges:
        gp, gc = label[p], label[c]
        if gp != gc:
            preds[gc].add(gp)
            succs[gp].add(gc)
    indeg = {g: len(ps) for g, ps in preds.items()}
    ready = [g for g, k in indeg.items() if k == 0]
    while ready:
        g = ready.pop()
        del indeg[g]
        for s in succs[g]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if not indeg:
        return None
    # Every leftover group has a leftover predecessor: walk backwards until a repeat.
    walk, seen = [next(iter(indeg))], set()
    while walk[-1] not in seen:
        seen.add(walk[-1])
        walk.append(next(p for p in preds[walk[-1]] if p in indeg))
    cycle = walk[walk.index(walk[-1]) :]
    return cycle[::-1]


def _closes_cycle(label: Sequence[int], groups: dict[int, _Group], merged: _Group) -> bool:
    """Does the (convex) merged group lie on a group-DAG cycle?  The other groups form an acyclic DAG.

    Walk the groups reachable from it: a cycle exists iff one of them reaches back.
    Their descendants are added wholesale - safe, since none reaches the group.
    """
    members, desc = merged[0], merged[2]
    todo, done = desc & ~members, members
    while todo:
        v = (todo & -todo).bit_length() - 1
        g_members, _, g_desc, _ = groups[label[v]]
        if g_desc & members:
            return True
        done |= g_members
        todo = (todo | g_members | g_desc) & ~done
    return False


class _UnionFind:
    """Tiny union-find keeping member lists, enough for the repair's few merges."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))
        self.members: dict[int, list[int]] = {i: [i] for i in range(n)}

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, ra: int, rb: int) -> None:
        if len(self.members[ra]) < len(self.members[rb]):
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.members[ra] += self.members.pop(rb)

    def labels(self) -> list[int]:
        return [self.find(i) for i in range(len(self.parent))]

    def partition(self) -> Partition:
        return canonical(self.members.values())


def _cover_problems(n: int, partition: Sequence[Sequence[int]]) -> list[str]:
    """Rule 1: every op exactly once, nothing out of range, no empty group."""
    problems: list[str] = []
    seen: dict[int, int] = {}
    for g in partition:
        if not g:
            problems.append("partition has an empty group")
        for i in g:
            if not isinstance(i, int) or not 0 <= i < n:
                problems.append(f"op index {i!r} is out of range (the DAG has {n} ops)")
            else:
                seen[i] = seen.get(i, 0) + 1
    problems += [f"op {i} appears in {k} groups" for i, k in sorted(seen.items()) if k > 1]
    problems += [f"op {i} is missing from the partition" for i in range(n) if i not in seen]
    return problems


def _labels(n: int, partition: Sequence[Sequence[int]]) -> list[int]:
    """Group index of each op (the partition must be a cover)."""
    label = [0] * n
    for gi, g in enumerate(partition):
        for i in g:
            label[i] = gi
    return label


def _mask(ops: Iterable[int]) -> int:
    m = 0
    for i in ops:
        m |= 1 << i
    return m


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _arrow(items: Sequence[object]) -> str:
    return " -> ".join(str(x) for x in items)
