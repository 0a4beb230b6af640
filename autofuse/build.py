"""Build a plan with TVM: outline its groups, fuse each into one PrimFunc, schedule, compile.

The partition is imposed the way FuseOps itself does it: every group becomes a
private Relax function marked ``Primitive``; ``FuseTIR`` then merges each into a
single PrimFunc (intermediates inside a group become local buffers, those between
groups stay real tensors); each PrimFunc is scheduled by ``autofuse.schedule``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi
from tvm import relax, s_tir

from autofuse import fast_math as af_fast_math
from autofuse import winograd
from autofuse.graph import Graph
from autofuse.partition import Partition, canonical, violations
from autofuse.plan import Plan, PlanError
from autofuse.schedule import LoopNest, anchor_index, apply_cpu, apply_cuda, block_nests, resolve_knobs, weight_read
from autofuse.target import Target


class BuildError(Exception):
    """TVM failed to build a (legal) plan."""


@dataclass
class Fused:
    """The outlined + FuseTIR'd module and, per group, its PrimFunc's name."""

    mod: tvm.IRModule
    kernels: list[str]


def partition_of(graph: Graph, plan: Plan) -> Partition:
    """The plan's groups as op indices, checked against the graph and the legality rules."""
    idx = graph.index()
    groups = []
    for g in plan.groups:
        unknown = [o for o in g if o not in idx]
        if unknown:
            raise PlanError(f"plan names op(s) {unknown} that {graph.name} does not have (ops: {', '.join(idx)})")
        groups.append(tuple(sorted(idx[o] for o in g)))
    part = canonical(groups)
    problems = violations(graph.dag(), part)
    if problems:
        raise PlanError(f"illegal partition: {problems[0]}")
    return part


def outline(graph: Graph, partition: Partition) -> Fused:
    """Impose ``partition`` on the graph: one Primitive function per group, then FuseTIR."""
    main = graph.mod["main"]
    calls = {op.name: b for op, b in zip(graph.ops, graph.bindings)}
    op_names = [op.name for op in graph.ops]
    group_of = {op_names[i]: gi for gi, g in enumerate(partition) for i in g}
    consumers = graph.consumers()
    order = _topo_groups(graph, partition, group_of)

    # Every value a group reads from outside: main's params, other groups' outputs, and
    # constants (FuseTIR wants constants as parameters of the Primitive function).
    values: dict[str, relax.Expr] = {t.name: p for t, p in zip(graph.inputs, main.params)}
    op_args: dict[str, list[str]] = {}
    for op in graph.ops:
        op_args[op.name] = list(op.args)
        for key, a in zip(op.args, calls[op.name].value.args[1].fields):
            if key.startswith("const:"):
                values[key] = a

    bb = relax.BlockBuilder(tvm.IRModule({gv: f for gv, f in graph.mod.functions.items() if gv.name_hint != "main"}))
    group_funcs: dict[int, tuple[relax.GlobalVar, list[str], list[str]]] = {}
    for gi in order:
        members = [op_names[i] for i in partition[gi]]
        ext_inputs = list(dict.fromkeys(a for m in members for a in op_args[m] if group_of.get(a) != gi))
        outputs = [m for m in members if m == graph.output or any(group_of[c] != gi for c in consumers[m])]
        params = [relax.Var(f"p{k}", _ty_of(calls, values, n)) for k, n in enumerate(ext_inputs)]
        env: dict[str, relax.Expr] = dict(zip(ext_inputs, params))
        name = f"g{gi}_" + "_".join(calls[m].value.args[0].name_hint for m in members)[:60]
        # a distinct attr per group stops BlockBuilder from merging structurally equal groups,
        # which must stay separate kernels (they may get different schedules)
        with bb.function(name, params, attrs={"Primitive": True, "autofuse.group": gi}, private=True):
            with bb.dataflow():
                for m in members:
                    call = calls[m].value
                    new = relax.call_tir(call.args[0], relax.Tuple([env[a] for a in op_args[m]]), out_ty=calls[m].var.ty)
                    env[m] = bb.emit_output(new) if m in outputs else bb.emit(new)
                ret = env[outputs[0]] if len(outputs) == 1 else relax.Tuple([env[o] for o in outputs])
            gvar = bb.emit_func_output(ret)
        group_funcs[gi] = (gvar, ext_inputs, outputs)

    with bb.function("main", list(main.params), attrs=dict(main.attrs) if main.attrs else None):
        with bb.dataflow():
            env2: dict[str, relax.Expr] = dict(values)
            for gi in order:
                gvar, ext_inputs, outputs = group_funcs[gi]
                call = relax.Call(gvar, [env2[n] for n in ext_inputs])
                if len(outputs) == 1:
                    env2[outputs[0]] = bb.emit_output(call) if outputs[0] == graph.output else bb.emit(call)
                else:
                    tup = bb.emit(call)
                    for k, o in enumerate(outputs):
                        item = relax.TupleGetItem(tup, k)
                        env2[o] = bb.emit_output(item) if o == graph.output else bb.emit(item)
            result = env2[graph.output]
        bb.emit_func_output(result)
    mod = bb.get()
    mod = tvm.transform.Sequential([relax.transform.FuseTIR(), relax.transform.DeadCodeElimination()])(mod)
    kernels = _kernel_names(mod, order, group_funcs)
    return Fused(mod, kernels)


def _ty_of(calls: dict, values: dict[str, relax.Expr], name: str) -> Any:
    return calls[name].var.ty if name in calls else values[name].ty


def _topo_groups(graph: Graph, partition: Partition, group_of: dict[str, int]) -> list[int]:
    deps: dict[int, set[int]] = {gi: set() for gi in range(len(partition))}
    for op in graph.ops:
        for a in op.args:
            if a in group_of and group_of[a] != group_of[op.name]:
                deps[group_of[op.name]].add(group_of[a])
    order, done = [], set()
    while len(order) < len(partition):
        ready = [g for g in deps if g not in done and deps[g] <= done]
        if not ready:
            raise PlanError("the group graph has a cycle")
        order.append(ready[0])
        done.add(ready[0])
    return order


def _kernel_names(mod: tvm.IRModule, order: list[int], group_funcs: dict) -> list[str]:
    """Name of the PrimFunc FuseTIR made for each group (indexed by group)."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    names_in_order = [
        b.value.args[0].name_hint
        for blk in mod["main"].body.blocks
        for b in blk.bindings
        if isinstance(b.value, relax.Call) and b.value.op.same_as(call_tir)
    ]
    if len(names_in_order) != len(order):
        raise BuildError(f"FuseTIR produced {len(names_in_order)} kernels for {len(order)} groups")
    kernels = [""] * len(order)
    for gi, name in zip(order, names_in_order):
        kernels[gi] = name
    return kernels


def _group_nests(graph: Graph, group: tuple[int, ...]) -> list:
    """(name, loop nest) of every block of the group's fused kernel, in order."""
    return [n for i in group for n in _op_nests(graph, graph.ops[i].func)]


def group_anchor(graph: Graph, group: tuple[int, ...]) -> tuple[int, LoopNest]:
    """The anchor block of a group (index among the fused kernel's blocks) and its loop nest."""
    nests = _group_nests(graph, group)
    if not nests:
        return -1, UNSCHEDULED
    a = anchor_index(nests)
    return a, nests[a][1]


UNSCHEDULED = LoopNest((), ())  # the "loop nest" of a group without blocks: it has no knobs


@dataclass(frozen=True)
class GroupShape:
    """Which blocks a group has besides its anchor: says which knobs matter for it."""

    producers: bool  # blocks before the anchor
    epilogue: bool  # blocks after it
    side_reductions: bool  # reduction blocks other than the anchor (norm / softmax statistics)
    weight: bool  # the anchor reads a bound constant as a GEMM's weight (``pack_weight``)
    winograd: bool  # the anchor is a convolution Winograd can compute (``winograd.eligible``)


def group_shape(graph: Graph, group: tuple[int, ...]) -> GroupShape:
    nests = _group_nests(graph, group)
    a = anchor_index(nests)
    side = any(nest.has_reduction for i, (_, nest) in enumerate(nests) if i != a)
    return GroupShape(a > 0, a < len(nests) - 1, side, _reads_constant_weight(graph, group),
                      a >= 0 and winograd.eligible(graph, anchor_op(graph, group)) is not None)


def _anchor_block(graph: Graph, group: tuple[int, ...]) -> tuple[int, int]:
    """(the op owning the group's anchor block, the block's index in that op's PrimFunc)."""
    a, _ = group_anchor(graph, group)
    for i in group:
        n = len(_op_nests(graph, graph.ops[i].func))
        if a < n:
            return i, a
        a -= n
    raise AssertionError("anchor block outside the group")


def anchor_op(graph: Graph, group: tuple[int, ...]) -> int:
    """The op (index) that owns the group's anchor block: names the group's knobs in a search."""
    if group_anchor(graph, group)[0] < 0:
        return group[0]
    return _anchor_block(graph, group)[0]


def _reads_constant_weight(graph: Graph, group: tuple[int, ...]) -> bool:
    """Whether the anchor's GEMM weight (``schedule.weight_read``) is a constant bound in the
    graph: only then can the build repack it once, ahead of time."""
    if group_anchor(graph, group)[0] < 0:
        return False
    i, b = _anchor_block(graph, group)
    op = graph.ops[i]
    func = graph.mod[op.func]
    sch = s_tir.Schedule(func)
    block = sch.get(sch.get_child_blocks(sch.get_sblock("root"))[b])
    params = list(func.params)  # in TVM 0.27 the parameters are the buffers themselves
    found = weight_read(block, params)
    if found is None:
        return False
    pos = next(j for j, p in enumerate(params) if p.same_as(block.reads[found.read].source))
    return pos < len(op.args) and op.args[pos].startswith("const:")


_NEST_CACHE: dict[int, list] = {}


def _op_nests(graph: Graph, func: str) -> list:
    """Block loop nests of an op's PrimFunc, cached by the PrimFunc's structure (an ``id``
    of the module could be reused by another graph once the first is freed)."""
    prim = graph.mod[func]
    key = int(tvm_ffi.structural_hash(prim, map_free_vars=True))
    if key not in _NEST_CACHE:
        _NEST_CACHE[key] = block_nests(prim)
    return _NEST_CACHE[key]


def schedule_module(graph: Graph, plan: Plan, target: Target) -> tvm.IRModule:
    """Outline the plan's partition and schedule every kernel; returns the Relax module to compile."""
    part = partition_of(graph, plan)
    by_first = {tuple(sorted(graph.index()[o] for o in g)): s for g, s in zip(plan.groups, plan.schedules)}
    if target.kind == "cuda":
        return apply_cuda(outline(graph, part).mod, target.tvm())
    knobs_of: dict[int, dict[str, Any]] = {}
    for gi, group in enumerate(part):
        anchor, nest = group_anchor(graph, group)
        if anchor < 0:
            if by_first[group]:
                raise PlanError(f"group {plan.groups[gi]} is an opaque kernel and takes no schedule knobs")
            continue
        knobs_of[gi] = resolve_knobs(nest, by_first[group])
    # a convolution computed by Winograd is another PrimFunc (and weight) in the same place
    algorithms = {anchor_op(graph, part[gi]): k["winograd"] for gi, k in knobs_of.items() if k["winograd"]}
    fused = outline(winograd.substitute(graph, algorithms), part)
    sch = s_tir.Schedule(fused.mod)
    packed = False
    for gi, knobs in knobs_of.items():
        apply_cpu(sch, fused.kernels[gi], group_anchor(graph, part[gi])[0], knobs)
        packed |= knobs["pack_weight"] and not knobs["winograd"]
    return prepack_weights(sch.mod) if packed else sch.mod


def prepack_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """Every block marked as a weight layout rewrite becomes a function of its own, which
    FoldConstant runs once, here, on the constant weight; the kernel then reads the result."""
    passes = [relax.transform.SplitLayoutRewritePreproc(), relax.transform.FoldConstant(),
              relax.transform.DeadCodeElimination()]
    return tvm.transform.Sequential(passes)(mod)


def compile_module(mod: tvm.IRModule, target: Target, fast_math: bool = False,
                   reuse_kernels: bool = False) -> tvm.runtime.Executable:
    """tvm.compile, with TVM's failures turned into BuildError (``fast_math``: the plan's flag).
    ``reuse_kernels`` (CPU targets): compile each kernel as a module of its own and reuse
    the ones this process compiled before (``_compile_reusing_kernels``)."""
    try:
        with af_fast_math.enabled(fast_math):
            if reuse_kernels and target.kind == "llvm":
                ex = _compile_reusing_kernels(mod, target, fast_math)
            else:
                ex = tvm.compile(mod, target.tvm())
    except Exception as e:
        raise BuildError(f"TVM build failed: {_last_line(e)}") from None
    if target.kind == "cuda" and not any(m.kind == "cuda" for m in _imports(ex)):
        raise BuildError("the CUDA build has no device module: some kernel was left unscheduled")
    return ex


def build(graph: Graph, plan: Plan, target: Target, reuse_kernels: bool = False) -> tvm.runtime.Executable:
    """Plan -> scheduled module -> executable (a Relax VM executable).  ``reuse_kernels``: see
    ``compile_module``; a tuning loop's worker sets it, a one-off build need not."""
    return compile_module(schedule_module(graph, plan, target), target, plan.fast_math, reuse_kernels)


# Kernels this process compiled, by (structural hash of the scheduled PrimFunc, target,
# fast math): (the PrimFunc, its runtime module), least recently used first.  About 2 MB
# each (an LLVM module and its JIT-linked code); a search's hits are mostly the best
# plan's kernels, which every mutation of it shares, so a short list is enough.
KERNELS_KEPT = 64
_KERNELS: OrderedDict[tuple[int, str, bool], tuple[Any, Any]] = OrderedDict()


def _compile_reusing_kernels(mod: tvm.IRModule, target: Target, fast_math: bool) -> tvm.runtime.Executable:
    """tvm.compile's steps for a CPU target (``relax.vm_build.build``: the default Relax
    pipeline, VM code generation, linking), except that each kernel is a runtime module
    of its own, kept in ``_KERNELS`` and linked again into any later executable that has
    the same kernel.  A mutation changes one group of a plan: compiling and JIT-linking
    the kernels it shares with its parent (LLVM's code generation, then its JIT on the
    first call) took 0.25-0.3 s of an attention candidate's 0.6 s (results/NOTES.md 60)."""
    tgt = target.tvm()
    with tgt:
        lowered = relax.get_pipeline("default")(mod)
    attrs = dict(lowered.attrs) if lowered.attrs else {}
    if attrs.get("external_mods") or attrs.get("const_name_to_constant"):
        return tvm.compile(mod, tgt)  # BYOC output, which autofuse never makes: TVM's own way
    builder = relax.ExecBuilder()
    rest = relax.vm_build._vmcodegen(builder, lowered, "bytecode")
    libs = [_kernel_module(gv, f, rest.attrs, target, tgt, fast_math)
            for gv, f in rest.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    if not libs:
        return tvm.compile(mod, tgt)
    # VMLink imports the first module and then the others into the new executable and
    # leaves the cached modules themselves unchanged (tests/test_build.py checks this)
    linked = tvm.get_global_func("relax.VMLink")(builder, tgt, libs[0], libs[1:], {})
    return relax.vm_build.VMExecutable(linked)


def _kernel_module(gv: Any, func: Any, attrs: Any, target: Target, tgt: Any, fast_math: bool) -> Any:
    """The runtime module of one scheduled kernel: from ``_KERNELS`` when this process
    compiled the same PrimFunc (structurally equal, not only of equal hash) before."""
    key = (int(tvm_ffi.structural_hash(func)), target.spec_json, fast_math)
    hit = _KERNELS.get(key)
    if hit is not None and tvm_ffi.structural_equal(hit[0], func):
        _KERNELS.move_to_end(key)
        return hit[1]
    lib = tvm.tirx.build(tvm.IRModule({gv: func}, attrs=attrs), target=tgt, pipeline="default")
    _KERNELS[key] = (func, lib)
    while len(_KERNELS) > KERNELS_KEPT:
        _KERNELS.popitem(last=False)
    return lib


def _imports(ex: Any) -> list:
    """Every module imported (transitively) by the executable: host llvm, cuda, ..."""
    found, todo = [], list(getattr(ex.mod, "imports", []))
    while todo:
        m = todo.pop()
        found.append(m)
        todo.extend(m.imports)
    return found


def _last_line(e: Exception) -> str:
    lines = [l for l in str(e).strip().splitlines() if l.strip()]
    return lines[-1][:300] if lines else type(e).__name__
