"""Subgraph tasks: cut a model's graph into fusion regions, deduplicate them, stitch plans back.

A *region* is a bounded, convex, single-output subgraph of the model's graph (parameters folded):
one group of TVM's own FuseOps partition (a GEMM/conv with its element-wise epilogue, or an
element-wise/reduction chain), plus the element-wise/injective producer groups whose only consumer
it is when it holds a GEMM/conv (its prologue).  Every region becomes a workload of its own (its ops,
its inputs as activations, the model's constants as constants) whose key is the structural hash of
its graph, so ResNet's repeated blocks are tuned once.  The reference output of a region is its
plain (unfused, unscheduled) TVM build; the whole model is checked against onnxruntime.

The regions partition the model's ops, so the best plan of every region, mapped onto each of its
instances, is a plan for the whole model (``stitch``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

from autofuse.graph import Graph, default_partition
from autofuse.partition import Kind
from autofuse.plan import Plan
from autofuse.space import Space, Tensor
from autofuse.workload import Workload


@dataclass(frozen=True)
class Region:
    """One region instance: op indices in the model graph (ascending), inputs, output, hash."""

    ops: tuple[int, ...]
    inputs: tuple[str, ...]
    output: str
    hash: str = ""


@dataclass
class RegionSet:
    """The regions of a model: every instance, and one workload per distinct hash."""

    model: Workload
    instances: list[Region]
    workloads: dict[str, Workload]  # region hash -> workload (built from its first instance)

    @property
    def distinct(self) -> list[str]:
        return list(self.workloads)

    def count(self, h: str) -> int:
        return sum(r.hash == h for r in self.instances)

    def summary(self) -> list[dict[str, Any]]:
        out = []
        for h, w in self.workloads.items():
            rg = w.graph(True)
            out.append({"hash": h, "instances": self.count(h), "ops": len(rg.ops),
                        "kinds": [op.kind.name.lower() for op in rg.ops],
                        "funcs": [op.func for op in rg.ops], "name": w.name})
        return out


def cut(graph: Graph) -> list[tuple[int, ...]]:
    """Region op sets: FuseOps groups, prologue groups merged into their GEMM/conv consumer,
    groups with more than one escaping value split into single ops."""
    groups = [list(g) for g in default_partition(graph)]
    names = [op.name for op in graph.ops]
    idx = graph.index()
    consumers = graph.consumers()

    def group_of() -> dict[int, int]:
        return {i: gi for gi, g in enumerate(groups) for i in g}

    changed = True
    while changed:
        changed = False
        gof = group_of()
        for gi, g in enumerate(groups):
            if not g or any(graph.ops[i].kind > Kind.INJECTIVE for i in g):
                continue
            outs = {idx[c] for i in g for c in consumers[names[i]] if gof[idx[c]] != gi}
            if graph.output in {names[i] for i in g}:
                continue
            target = {gof[c] for c in outs}
            if len(target) != 1:
                continue
            tgt = target.pop()
            if not any(graph.ops[i].kind == Kind.OUT_EWISE_FUSABLE for i in groups[tgt]):
                continue
            # every value of g must be read only inside g or by the target group (single output kept)
            groups[tgt] = sorted(groups[tgt] + g)
            groups[gi] = []
            changed = True
            break
    regions: list[tuple[int, ...]] = []
    for g in (g for g in groups if g):
        members = set(g)
        escaping = [i for i in g if names[i] == graph.output or any(idx[c] not in members for c in consumers[names[i]])]
        if len(escaping) == 1:
            regions.append(tuple(sorted(g)))
        else:
            regions.extend((i,) for i in sorted(g))
    regions.sort(key=lambda r: r[0])
    return regions


def region_space(graph: Graph, ops: tuple[int, ...], name: str) -> tuple[Space, Region]:
    """A Space whose module is the region's ops as call_tirs (constants kept) on its external inputs."""
    members = [graph.ops[i] for i in ops]
    member_names = {op.name for op in members}
    binding = {op.name: b for op, b in zip(graph.ops, graph.bindings)}
    input_ty: dict[str, Any] = {p.name: p.ty for p in graph.mod["main"].params}
    for op in graph.ops:
        input_ty[op.name] = binding[op.name].var.ty
    ext: list[str] = []
    for op in members:
        for a in op.args:
            if not a.startswith("const:") and a not in member_names and a not in ext:
                ext.append(a)
    outputs = [op.name for op in members if op.name == graph.output
               or any(c not in member_names for c in graph.consumers()[op.name])]
    assert len(outputs) == 1, outputs
    funcs = {op.func for op in members}
    base = tvm.IRModule({gv: f for gv, f in graph.mod.functions.items() if gv.name_hint in funcs})
    bb = relax.BlockBuilder(base)
    params = {n: relax.Var(n, input_ty[n]) for n in ext}
    with bb.function("main", list(params.values())):
        with bb.dataflow():
            env: dict[str, Any] = dict(params)
            for op in members:
                call = binding[op.name].value
                args = [env[a] if not a.startswith("const:") else f for a, f in zip(op.args, call.args[1].fields)]
                expr = relax.call_tir(base.get_global_var(op.func), relax.Tuple(args), out_ty=binding[op.name].var.ty)
                env[op.name] = bb.emit_output(expr, name_hint=op.name) if op.name == outputs[0] else bb.emit(expr, name_hint=op.name)
        bb.emit_func_output(env[outputs[0]])
    mod = bb.get()
    acts = tuple(Tensor(n, tuple(int(d) for d in input_ty[n].shape.values), str(input_ty[n].dtype)) for n in ext)
    space = Space(name=name, activations=acts, params=(), forward=None, reference=_NaiveReference(mod, ext),  # type: ignore[arg-type]
                  description=f"region of {graph.name}: " + " -> ".join(op.func for op in members),
                  rtol=1e-3, atol=1e-4, module=mod, param_values={})
    return space, Region(tuple(ops), tuple(ext), outputs[0])


class _NaiveReference:
    """A region's reference: its plain TVM build (LegalizeOps kernels, no fusion, no schedule)."""

    def __init__(self, mod: tvm.IRModule, names: list[str]):
        self.mod, self.names, self._vm = mod, names, None

    def __call__(self, **arrays: np.ndarray) -> np.ndarray:
        if self._vm is None:
            self._vm = relax.VirtualMachine(tvm.compile(self.mod, tvm.target.Target("llvm")), tvm.cpu())
        out = self._vm["main"](*[tvm.runtime.tensor(arrays[n], tvm.cpu()) for n in self.names])
        return out.numpy().astype(np.float64)


def model_regions(model: Workload) -> RegionSet:
    """Cut (cached on the workload) and deduplicate by structural hash."""
    cached = getattr(model, "_regions", None)
    if cached is not None:
        return cached
    g = model.graph(True)
    instances: list[Region] = []
    workloads: dict[str, Workload] = {}
    for ops in cut(g):
        space, reg = region_space(g, ops, f"{model.name}#r")
        w = Workload(space)
        h = w.hash
        shape_sig = [(op.kind, op.shape) for op in w.graph(True).ops]
        if h in workloads and [(op.kind, op.shape) for op in workloads[h].graph(True).ops] != shape_sig:
            h = f"{h}.{len(instances)}"  # same hash, other op order: keep apart (stitching maps by position)
        if h not in workloads:
            object.__setattr__(space, "name", f"{model.name}#{h}")
            workloads[h] = w
        instances.append(Region(reg.ops, reg.inputs, reg.output, h))
    rs = RegionSet(model, instances, workloads)
    model._regions = rs  # type: ignore[attr-defined]
    return rs


def structure(w: Workload) -> tuple:
    """A region's shape-free structure: each op's kernel kind (PrimFunc name without its
    numeric suffix) and fusion kind, and where each argument comes from (an earlier op by
    position, an input, a constant).  Regions of one structure differ only in shapes (a
    ResNet stage's blocks, MobileNet's many conv-BN-activation layers), so a plan of one
    maps onto another op by op (``PlanSpace.params_like``)."""
    g = w.graph(True)
    idx = g.index()
    inputs = [t.name for t in g.inputs]
    out = []
    for op in g.ops:
        args = tuple(("op", idx[a]) if a in idx else ("const",) if a.startswith("const:") else ("in", inputs.index(a))
                     for a in op.args)
        out.append((op.func.rstrip("0123456789"), op.kind.name, args))
    return tuple(out)


def region_workload(model: Workload, h: str) -> Workload:
    rs = model_regions(model)
    if h not in rs.workloads:
        from autofuse.space import SpaceError

        raise SpaceError(f"{model.name} has no region {h}")
    return rs.workloads[h]


def stitch(rs: RegionSet, plans: dict[str, Plan], label: str = "stitched") -> Plan:
    """One plan for the whole model (parameters folded): every instance gets its region's plan
    (a region without one gets its default plan), op names mapped by position.  The model
    compiles as one unit, so ``fast_math`` is on when any region's plan has it (the stitched
    plan is measured and checked as a whole afterwards)."""
    g = rs.model.graph(True)
    groups: list[tuple[str, ...]] = []
    schedules: list[dict[str, Any]] = []
    for inst in rs.instances:
        rw = rs.workloads[inst.hash]
        plan = plans.get(inst.hash) or rw.reference_plan("default")
        rep_ops = [op.name for op in rw.graph(True).ops]
        pos = {n: k for k, n in enumerate(rep_ops)}
        for grp, sched in zip(plan.groups, plan.schedules):
            groups.append(tuple(g.ops[inst.ops[pos[o]]].name for o in grp))
            schedules.append(dict(sched))
    fast = any(p.fast_math for p in plans.values())
    return Plan(tuple(groups), tuple(schedules), True, rs.model.hash, label, fast)
