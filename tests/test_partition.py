"""Tests for autofuse.partition: brute-force equivalence on random small DAGs plus hand-made cases."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofuse.partition import (
    Dag,
    Decision,
    Kind,
    Partition,
    canonical,
    choices_for,
    count_partitions,
    decisions,
    enumerate_partitions,
    epilogues_apart,
    is_legal,
    most_fused,
    partition_from_choices,
    space_size,
    unfused,
    violations,
)

E, B, I, R, C, T, O = (Kind.ELEMWISE, Kind.BROADCAST, Kind.INJECTIVE, Kind.REDUCTION,
                       Kind.OUT_EWISE_FUSABLE, Kind.TUPLE, Kind.OPAQUE)  # fmt: skip

# ----------------------------------------------------------------------------- helpers


@st.composite
def dags(draw: st.DrawFn, max_ops: int = 7) -> Dag:
    """Random DAGs: element-wise-heavy kinds, up to 3 preds per op, reads from a small input pool."""
    n = draw(st.integers(1, max_ops))
    kinds = draw(st.lists(st.sampled_from([0, 0, 1, 2, 2, 3, 4, 7, 8]), min_size=n, max_size=n))
    preds = tuple(tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3)))) if i else () for i in range(n))
    reads = tuple(tuple(sorted(draw(st.sets(st.sampled_from(["x", "w", "b"]), max_size=2)))) for _ in range(n))
    return Dag(tuple(kinds), preds, reads)


def set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    """All set partitions of ``items`` (Bell number many)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[first], *part]
        for k in range(len(part)):
            yield [*part[:k], [first, *part[k]], *part[k + 1 :]]


def brute_force(dag: Dag) -> set[Partition]:
    assert dag.n <= 8, "brute force is exponential"
    return {canonical(p) for p in set_partitions(list(range(dag.n))) if is_legal(dag, p)}


def is_true_partition(dag: Dag, p: Partition) -> bool:
    flat = [i for g in p for i in g]
    return sorted(flat) == list(range(dag.n)) and p == canonical(p) and all(p)


def chain(kinds: list[Kind]) -> Dag:
    """op i reads op i-1; op 0 reads input x."""
    return Dag(tuple(kinds), tuple((i - 1,) if i else () for i in range(len(kinds))),
               tuple(("x",) if i == 0 else () for i in range(len(kinds))))  # fmt: skip


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ----------------------------------------------------------------------------- properties


@FAST
@given(dags())
def test_enumeration_equals_brute_force(dag: Dag) -> None:
    listed = list(enumerate_partitions(dag))
    assert len(listed) == len(set(listed)), "a partition was yielded twice"
    assert set(listed) == brute_force(dag)


@FAST
@given(dags())
def test_enumerated_partitions_are_legal_true_partitions(dag: Dag) -> None:
    listed = list(enumerate_partitions(dag))
    assert listed[0] == unfused(dag)
    for p in listed:
        assert is_true_partition(dag, p)
        assert violations(dag, p) == []


@FAST
@given(dags(), st.data())
def test_random_choices_repair_to_a_legal_partition(dag: Dag, data: st.DataObject) -> None:
    n_dec = len(decisions(dag))
    choices = data.draw(st.lists(st.booleans(), min_size=n_dec, max_size=n_dec))
    p, reasons = partition_from_choices(dag, choices)
    assert is_true_partition(dag, p)
    assert violations(dag, p) == []
    # Every chosen decision is either honoured or explained.
    keys_cut = {r.split(" ")[0] for r in reasons}
    honoured = choices_for(dag, p)
    for d, want, got in zip(decisions(dag), choices, honoured):
        if want and not got:
            assert d.key in keys_cut
        if not want:
            assert d.key not in keys_cut


@FAST
@given(dags())
def test_round_trip_every_legal_partition(dag: Dag) -> None:
    for p in brute_force(dag):
        back, reasons = partition_from_choices(dag, choices_for(dag, p))
        assert back == p
        assert reasons == []


@FAST
@given(dags())
def test_legal_groups_are_connected_by_their_own_decisions(dag: Dag) -> None:
    """Why the encoding is complete: a legal group never needs a decision it does not contain."""
    keys = {(d.a, d.b) for d in decisions(dag)}
    for p in enumerate_partitions(dag):
        for g in p:
            seen, todo = {g[0]}, [g[0]]
            while todo:
                x = todo.pop()
                for y in g:
                    if y not in seen and ((x, y) in keys or (y, x) in keys):
                        seen.add(y)
                        todo.append(y)
            assert seen == set(g)


@FAST
@given(dags())
def test_most_fused_is_legal_and_no_two_of_its_groups_can_merge(dag: Dag) -> None:
    """The most-fused seed partition is legal, and maximal: merging the two groups of any
    decision it left apart breaks a rule."""
    p = most_fused(dag)
    assert is_true_partition(dag, p) and is_legal(dag, p)
    label = {op: k for k, group in enumerate(p) for op in group}
    for d in decisions(dag):
        ga, gb = label[d.a], label[d.b]
        if ga != gb:
            merged = [g for k, g in enumerate(p) if k not in (ga, gb)] + [p[ga] + p[gb]]
            assert not is_legal(dag, merged), (d, p)


@FAST
@given(dags())
def test_epilogues_apart_of_the_most_fused_partition_refines_it_legally(dag: Dag) -> None:
    """Cutting epilogues off keeps the partition legal and only ever cuts a group in two:
    the ops downstream of its one complex op, and the rest."""
    p = most_fused(dag)
    q = epilogues_apart(dag, p)
    assert is_true_partition(dag, q) and is_legal(dag, q)
    for group in q:
        assert any(set(group) <= set(g) for g in p), (group, p)
    for g in p:
        parts = [h for h in q if set(h) <= set(g)]
        assert len(parts) <= 2
        anchors = [i for i in g if dag.kinds[i] == Kind.OUT_EWISE_FUSABLE]
        if len(parts) == 2:
            tail = next(h for h in parts if anchors[0] not in h)
            assert all(any(a == anchors[0] or a in tail for a in dag.preds[i]) for i in tail)


@FAST
@given(dags(), st.integers(1, 5))
def test_count_and_limit_agree_with_enumeration(dag: Dag, cap: int) -> None:
    total = len(list(enumerate_partitions(dag)))
    count, exact = count_partitions(dag, cap=cap)
    assert (count, exact) == ((total, True) if total <= cap else (cap, False))
    assert len(list(enumerate_partitions(dag, limit=cap))) == min(cap, total)
    assert space_size(dag) == 2 ** len(decisions(dag))


# ----------------------------------------------------------------------------- hand-made DAGs


def test_epilogues_apart_cuts_a_gemm_from_its_epilogue_and_keeps_its_producers() -> None:
    """transpose -> GEMM -> bias -> relu, one group: the GEMM keeps the transpose that feeds
    it, the epilogue becomes a group; a group without a complex op stays whole."""
    dag = Dag((I, C, B, E, E, E), ((), (0,), (1,), (2,), (), (4,)), (("w",), ("x",), ("b",), (), ("x",), ()))
    assert epilogues_apart(dag, [(0, 1, 2, 3), (4, 5)]) == ((0, 1), (2, 3), (4, 5))
    assert epilogues_apart(dag, [(0, 1), (2, 3), (4, 5)]) == ((0, 1), (2, 3), (4, 5))


def test_conv_epilogue_chain_fuses_entirely() -> None:
    # conv -> sub -> div -> mul -> add -> relu, as TVM's FuseOps would fuse it.
    dag = chain([C, B, B, B, B, E])
    assert is_legal(dag, [list(range(6))])
    assert [d.key for d in decisions(dag)] == ["e0_1", "e1_2", "e2_3", "e3_4", "e4_5"]
    assert partition_from_choices(dag, [True] * 5) == (((0, 1, 2, 3, 4, 5),), [])
    assert count_partitions(dag) == (2**5, True)


def test_two_convs_in_one_group_are_illegal_and_cut_by_repair() -> None:
    dag = chain([C, E, C, E])
    problems = violations(dag, [[0, 1, 2, 3]])
    assert any("2 complex" in p for p in problems), problems
    assert is_legal(dag, [[0, 1], [2, 3]])
    p, reasons = partition_from_choices(dag, [True, True, True])
    assert p == ((0, 1), (2, 3))
    assert reasons and reasons[0].startswith("e1_2 cut:") and "complex" in reasons[0]
    assert not is_legal(dag, [[0, 1, 2], [3]])  # conv -> relu -> conv


def test_reduction_rules() -> None:
    # softmax-ish: reduce -> ewise -> reduce -> ewise may share one group ...
    assert is_legal(chain([R, E, R, E]), [[0, 1, 2, 3]])
    # ... but a reduction never shares a group with a complex op, before or after it.
    assert any("REDUCTION" in p for p in violations(chain([C, E, R]), [[0, 1, 2]]))
    assert any("REDUCTION" in p for p in violations(chain([R, E, C]), [[0, 1, 2]]))
    assert is_legal(chain([I, E, C]), [[0, 1, 2]])  # injective prologue is fine
    assert [d.key for d in decisions(chain([C, R]))] == []  # never-fusable edge is no decision


def test_non_convex_group_is_rejected_with_reason() -> None:
    # 0 -> 1 (opaque) -> 2 and 0 -> 2: {0, 2} would wait on its own output through 1.
    dag = Dag((E, O, E), ((), (0,), (0, 1)), (("x",), (), ()))
    problems = violations(dag, [[0, 2], [1]])
    assert len(problems) == 1 and "convex" in problems[0] and "0 -> 1 -> 2" in problems[0]
    assert [d.key for d in decisions(dag)] == ["e0_2"]
    p, reasons = partition_from_choices(dag, [True])
    assert p == unfused(dag)
    assert len(reasons) == 1 and reasons[0].startswith("e0_2 cut:") and "convex" in reasons[0]
    assert list(enumerate_partitions(dag)) == [unfused(dag)]


def test_repair_keeps_requested_groups_when_they_are_legal() -> None:
    # 0 -> 1 -> 2 and 0 -> 2.  Asking for e0_2 and e1_2 (not e0_1) still means "all three together";
    # merging in order alone would first try the non-convex {0, 2} and give up on it.
    dag = Dag((I, R, E), ((), (0,), (0, 1)), ((), (), ("w",)))
    assert [d.key for d in decisions(dag)] == ["e0_1", "e0_2", "e1_2"]
    assert partition_from_choices(dag, [False, True, True]) == (((0, 1, 2),), [])
    # Earlier decisions win: e0_3 and e1_3 are honoured, e2_3 (conv next to the reduction) is cut,
    # although a from-scratch repair would have preferred {1, 2, 3} ({0, 3} alone is not convex).
    dag = Dag((R, E, C, E), ((), (0,), (), (0, 1, 2)), (("b", "w"), (), (), ("x",)))
    assert [d.key for d in decisions(dag)] == ["e0_1", "e0_3", "e1_3", "e2_3"]
    p, reasons = partition_from_choices(dag, [False, True, True, True])
    assert p == ((0, 1, 3), (2,))
    assert len(reasons) == 1 and reasons[0].startswith("e2_3 cut:") and "complex op 2" in reasons[0]


def test_repair_retries_postponed_merges() -> None:
    # 0 (reduction) and 1 feed the conv 2; 3 reads all three.  Asking for e0_3, e1_3, e2_3 is illegal
    # (reduction + conv).  In order: {0, 3} and {1, 3} are not convex yet (paths via 2), {2, 3} is fine;
    # on the retry {1, 2, 3} is legal, while {0, 2, 3} would put the reduction next to the conv.
    dag = Dag((R, I, C, B), ((), (), (0, 1), (0, 1, 2)), (("w",), ("x",), ("x",), ("b",)))
    assert [d.key for d in decisions(dag)] == ["e1_2", "e0_3", "e1_3", "e2_3"]
    p, reasons = partition_from_choices(dag, [False, True, True, True])
    assert p == ((0,), (1, 2, 3))
    assert len(reasons) == 1 and reasons[0].startswith("e0_3 cut:") and "REDUCTION" in reasons[0]


def test_diamond() -> None:
    # 0 -> {1, 2} -> 3, all element-wise; 1 and 2 are siblings through op 0.
    dag = Dag((E, E, E, E), ((), (0,), (0,), (1, 2)), (("x",), (), (), ()))
    assert [d.key for d in decisions(dag)] == ["e0_1", "e0_2", "e1_3", "e2_3", "s1_2"]
    assert is_legal(dag, [[0, 1, 2, 3]])
    assert any("convex" in p for p in violations(dag, [[0, 3], [1], [2]]))
    assert not is_legal(dag, [[0, 1, 3], [2]])  # 0 -> 2 -> 3 escapes
    assert is_legal(dag, [[0], [1, 2], [3]])  # horizontal fusion of the two branches
    parts = set(enumerate_partitions(dag))
    assert parts == brute_force(dag)
    assert ((0, 1, 2, 3),) in parts and ((0, 1, 2), (3,)) in parts
    assert ((0, 3), (1,), (2,)) not in parts


def test_quotient_cycle_between_convex_groups() -> None:
    # a0 -> b1 and b2 -> a3, with {0, 3} and {1, 2} each glued by a shared input: each group convex,
    # yet A -> B -> A.
    dag = Dag((E, E, E, E), ((), (0,), (), (2,)), (("x",), ("y",), ("y",), ("x",)))
    problems = violations(dag, [[0, 3], [1, 2]])
    assert len(problems) == 1 and "cycle" in problems[0], problems
    assert ((0, 3), (1, 2)) not in set(enumerate_partitions(dag))


def test_opaque_op_stays_alone() -> None:
    dag = chain([E, O, E])
    assert decisions(dag) == []
    problems = violations(dag, [[0, 1], [2]])
    assert any("OPAQUE op 1" in p for p in problems), problems
    assert list(enumerate_partitions(dag)) == [unfused(dag)]
    assert space_size(dag) == 1


def test_siblings_sharing_an_input() -> None:
    # 0 and 1 both read "x"; 2 also reads x but is a conv (no horizontal fusion of complex ops).
    dag = Dag((E, R, C), ((), (), ()), (("x",), ("x",), ("x", "w")))
    assert decisions(dag) == [Decision("sibling", 0, 1)]
    assert decisions(dag)[0].key == "s0_1"
    assert is_legal(dag, [[0, 1], [2]])
    problems = violations(dag, [[0, 2], [1]])
    assert any("not connected" in p for p in problems), problems
    assert set(enumerate_partitions(dag)) == {((0,), (1,), (2,)), ((0, 1), (2,))}


def test_ops_on_one_path_are_not_siblings() -> None:
    dag = Dag((E, E), ((), (0,)), (("x",), ("x",)))
    assert [d.key for d in decisions(dag)] == ["e0_1"]


@pytest.mark.parametrize("n", [1, 2, 5, 10])
def test_elementwise_chain_count(n: int) -> None:
    assert count_partitions(chain([E] * n)) == (2 ** (n - 1), True)


def test_count_cap() -> None:
    assert count_partitions(chain([E] * 20), cap=1000) == (1000, False)
    assert count_partitions(chain([E] * 4), cap=8) == (8, True)


def test_violations_cover_rule() -> None:
    dag = chain([E, E, E])
    assert any("missing" in p for p in violations(dag, [[0, 1]]))
    assert any("2 groups" in p for p in violations(dag, [[0, 1], [1, 2]]))
    assert any("out of range" in p for p in violations(dag, [[0, 1, 2, 3]]))
    with pytest.raises(ValueError):
        choices_for(dag, [[0]])
    with pytest.raises(ValueError):
        partition_from_choices(dag, [True])


def test_canonical() -> None:
    assert canonical([[3, 1], [2], [0, 4]]) == ((0, 4), (1, 3), (2,))


def test_dag_validation() -> None:
    with pytest.raises(ValueError, match="lengths"):
        Dag((E, E), ((),), ((), ()))
    with pytest.raises(ValueError, match="earlier"):
        Dag((E, E), ((), (1,)), ((), ()))
    with pytest.raises(ValueError, match="earlier"):
        Dag((E,), ((-1,),), ((),))
    with pytest.raises(ValueError, match="kind"):
        Dag((5,), ((),), ((),))
    dag = Dag([0, 4], [[], [0]], [["x"], []])  # lists and ints are normalised
    assert dag.kinds == (E, C) and dag.preds == ((), (0,)) and hash(dag)


def test_forty_op_graph_counts_to_cap_quickly() -> None:
    # A transformer-ish block repeated: layernorm (complex) -> 3 matmul branches sharing it, etc.
    kinds: list[Kind] = []
    preds: list[tuple[int, ...]] = []
    reads: list[tuple[str, ...]] = []
    prev = -1
    while len(kinds) < 40:
        base = len(kinds)
        block = [  # (kind, preds relative to base or prev, reads)
            (C, (prev,) if prev >= 0 else (), ("x",) if prev < 0 else ()),
            (C, (base,), ("wq",)), (C, (base,), ("wk",)), (B, (base + 1,), ("bq",)), (B, (base + 2,), ("bk",)),
            (R, (base + 3, base + 4), ()), (E, (base + 5,), ()), (R, (base + 6,), ()), (B, (base + 6, base + 7), ()),
            (E, (base + 8, prev) if prev >= 0 else (base + 8,), ()),
        ]  # fmt: skip
        for k, ps, rs in block:
            kinds.append(k)
            preds.append(tuple(sorted(ps)))
            reads.append(rs)
        prev = len(kinds) - 1
    dag = Dag(tuple(kinds), tuple(preds), tuple(reads))
    assert dag.n == 40
    t0 = time.perf_counter()
    count, exact = count_partitions(dag, cap=100_000)
    elapsed = time.perf_counter() - t0
    assert (count, exact) == (100_000, False)
    assert elapsed < 10, elapsed
    for p in enumerate_partitions(dag, limit=50):
        assert violations(dag, p) == []
        assert partition_from_choices(dag, choices_for(dag, p))[0] == p
