"""autofuse's graph: a thin, hashable view over a legalized Relax module.

Every workload, hand-written space or imported model, becomes a Relax module;
``lower`` legalizes it so that each op is one ``call_tir`` of a PrimFunc whose
``op_pattern`` attribute is its fusion kind.  ``Graph`` lists those ops in
topological order with their kinds, shapes and inputs, and carries the module
itself so that later stages build from it rather than from a second op library.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir.expr import Constant

from autofuse.fast_math import uses_transcendentals
from autofuse.partition import Dag, Kind, Partition
from autofuse.space import Space, SpaceError, Tensor


class GraphError(Exception):
    """The Relax module cannot be viewed as an autofuse graph (unsupported construct)."""


_PREPARE = [
    relax.backend.DispatchSortScan(),  # sort/scan/top-k (no LegalizeOps rule) -> opaque TIR kernels
    relax.transform.DecomposeOpsForInference(),  # batch_norm -> subtract/divide/multiply/add
    relax.transform.CanonicalizeBindings(),  # drops the batch_norm tuple so epilogues can fuse
    relax.transform.DeadCodeElimination(),
    relax.transform.LegalizeOps(),  # every op -> call_tir of a PrimFunc
    relax.transform.AnnotateTIROpPattern(),  # op_pattern attr = fusion kind
]
_FOLD = [relax.transform.FoldConstant(), relax.transform.DeadCodeElimination()]


def lower(mod: tvm.IRModule, fold: bool) -> tvm.IRModule:
    """Legalize and annotate; with ``fold`` also fold parameter-only subexpressions."""
    passes = _PREPARE + (_FOLD if fold else [relax.transform.DeadCodeElimination()])
    with tvm.target.Target({"kind": "llvm"}):  # DispatchSortScan picks kernels by target; the CPU ones
        return tvm.transform.Sequential(passes)(mod)


@dataclass(frozen=True)
class Op:
    """One ``call_tir``: ``name`` is its Relax binding, ``func`` its PrimFunc."""

    name: str
    func: str
    kind: Kind
    args: tuple[str, ...]  # op names, graph input names, or "const:<i>"
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Graph:
    """A DAG of ops in topological order, with the Relax module it came from."""

    name: str
    inputs: tuple[Tensor, ...]  # runtime inputs of main, in order
    ops: tuple[Op, ...]
    output: str
    consts: tuple[tuple[tuple[int, ...], str], ...]  # shape/dtype of each bound constant
    mod: tvm.IRModule = field(compare=False, hash=False, repr=False)
    bindings: tuple[Any, ...] = field(compare=False, hash=False, repr=False, default=())  # Relax binding per op

    # -- views -----------------------------------------------------------
    def index(self) -> dict[str, int]:
        return {op.name: i for i, op in enumerate(self.ops)}

    def dag(self) -> Dag:
        """The minimal view the partition enumerator needs."""
        idx = self.index()
        preds, reads = [], []
        for op in self.ops:
            preds.append(tuple(sorted({idx[a] for a in op.args if a in idx})))
            reads.append(tuple(sorted({a for a in op.args if a not in idx})))
        return Dag(tuple(op.kind for op in self.ops), tuple(preds), tuple(reads))

    def consumers(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {op.name: [] for op in self.ops}
        for op in self.ops:
            for a in op.args:
                if a in out and op.name not in out[a]:
                    out[a].append(op.name)
        return out

    @cached_property
    def uses_transcendentals(self) -> bool:
        """Whether some op calls exp/tanh/sigmoid/erf: only then can a plan's ``fast_math`` matter."""
        return uses_transcendentals([self.mod[f] for f in dict.fromkeys(op.func for op in self.ops)])

    def describe(self) -> list[dict[str, Any]]:
        return [
            {"name": op.name, "op": op.func, "kind": op.kind.name.lower(), "inputs": list(op.args), "shape": list(op.shape)}
            for op in self.ops
        ]

    # -- identity --------------------------------------------------------
    def structural_hash(self) -> str:
        """Workload key: independent of tensor names and of definition order.

        Each op is hashed Merkle-style from its PrimFunc's structure, kind, shape
        and the hashes of its arguments (inputs by position, constants by shape).
        """
        pos = {t.name: i for i, t in enumerate(self.inputs)}
        memo: dict[str, str] = {}

        def h(*parts: Any) -> str:
            return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

        for op in self.ops:
            func_hash = str(tvm_ffi.structural_hash(_strip_attrs(self.mod[op.func]), map_free_vars=True))
            args = []
            for a in op.args:
                if a in memo:
                    args.append(memo[a])
                elif a in pos:
                    t = self.inputs[pos[a]]
                    args.append(h("input", pos[a], list(t.shape), t.dtype))
                else:
                    shape, dtype = self.consts[int(a.split(":")[1])]
                    args.append(h("const", list(shape), dtype))
            memo[op.name] = h("op", func_hash, int(op.kind), list(op.shape), op.dtype, args)
        sig = [(list(t.shape), t.dtype) for t in self.inputs]
        return h("graph", sig, memo[self.output])[:16]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "inputs": [t.as_dict() for t in self.inputs],
            "ops": self.describe(),
            "output": self.output,
        }


def _strip_attrs(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """PrimFunc without attrs that carry names (global_symbol), so hashes ignore naming."""
    return func.without_attr("global_symbol") if func.attrs and "global_symbol" in func.attrs else func


def from_relax(mod: tvm.IRModule, name: str, inputs: tuple[Tensor, ...]) -> Graph:
    """View a lowered module's ``main`` as a Graph (every binding must be a call_tir)."""
    main = mod["main"]
    input_names = [p.name for p in main.params]
    by_name = {t.name: t for t in inputs}
    graph_inputs = tuple(by_name[n] for n in input_names)
    call_tir = tvm.ir.Op.get("relax.call_tir")
    ops: list[Op] = []
    bindings: list[Any] = []
    consts: list[tuple[tuple[int, ...], str]] = []
    names: dict[Any, str] = {p: p.name for p in main.params}  # Relax Var -> unique tensor name
    taken = set(input_names)
    for block in main.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not isinstance(binding, relax.VarBinding) or not (isinstance(value, relax.Call) and value.op.same_as(call_tir)):
                raise GraphError(f"{name}: binding {binding.var.name} is not a single TIR op ({type(value).__name__}); unsupported")
            gv = value.args[0]
            func = mod[gv]
            kind = Kind(int(func.attrs["op_pattern"])) if func.attrs and "op_pattern" in func.attrs else Kind.OPAQUE
            args = []
            for a in value.args[1].fields:
                if isinstance(a, relax.Var):
                    if a not in names:
                        raise GraphError(f"{name}: {binding.var.name} reads unknown value {a.name}")
                    args.append(names[a])
                elif isinstance(a, Constant):
                    consts.append((tuple(int(d) for d in a.value.shape), str(a.value.dtype)))
                    args.append(f"const:{len(consts) - 1}")
                else:
                    raise GraphError(f"{name}: {binding.var.name} has an argument of unsupported type {type(a).__name__}")
            op_name = binding.var.name
            k = 1
            while op_name in taken:  # Relax allows equal names on distinct vars
                op_name, k = f"{binding.var.name}_{k}", k + 1
            taken.add(op_name)
            names[binding.var] = op_name
            ty = binding.var.ty
            if isinstance(ty, relax.TupleType):
                raise GraphError(f"{name}: op {gv.name_hint} ({binding.var.name}) returns {len(ty.fields)} tensors; "
                                 "autofuse supports ops with one output (Split is rewritten into slices)")
            if not isinstance(ty, relax.TensorType) or ty.shape is None:
                raise GraphError(f"{name}: {binding.var.name} has no static tensor shape")
            shape = tuple(int(d) for d in ty.shape.values)
            ops.append(Op(op_name, gv.name_hint, kind, tuple(args), shape, str(ty.dtype)))
            bindings.append(binding)
    if not ops:
        raise GraphError(f"{name}: the graph has no ops")
    body = main.body.body
    if not isinstance(body, relax.Var) or body not in names or body in main.params:
        raise GraphError(f"{name}: the graph must return one tensor computed by an op")
    return Graph(name, graph_inputs, tuple(ops), names[body], tuple(consts), mod, tuple(bindings))


def space_graph(space: Space, fold: bool, params: dict | None = None) -> Graph:
    """The graph of a space. ``fold``: parameters bound as constants and folded;
    otherwise parameters stay runtime inputs of ``main``."""
    from autofuse.relax_module import bind_params, space_to_relax

    mod = space_to_relax(space)
    inputs = space.inputs
    if fold:
        mod = bind_params(mod, params if params is not None else space.default_params())
        inputs = space.activations
    try:
        lowered = lower(mod, fold)
    except Exception as e:  # TVM raises for ill-typed graphs
        raise SpaceError(f"space {space.name!r} does not lower: {str(e).strip().splitlines()[-1]}") from e
    return from_relax(lowered, space.name, inputs)


def default_partition(graph: Graph) -> Partition:
    """The partition TVM's own FuseOps chooses for this graph, mapped back to our ops.

    Ops are matched by (PrimFunc name, argument identities); constants match by
    position-free marker, which is unambiguous for the graphs we build.
    """
    from autofuse.partition import canonical

    fused = relax.transform.FuseOps(fuse_opt_level=2)(graph.mod)
    idx = graph.index()
    call_tir = tvm.ir.Op.get("relax.call_tir")
    # Constants are matched by identity (FuseOps passes the same Constant objects on) and, failing
    # that, position-free: models have several ops that differ only in a constant (x*c1, x*c2).
    exact: dict[tuple, str] = {}
    masked: dict[tuple, list[str]] = {}
    for op, b in zip(graph.ops, graph.bindings):
        ids = tuple(f"const#{a.__hash__()}" if isinstance(a, Constant) else n
                    for n, a in zip(op.args, b.value.args[1].fields))
        exact[(op.func, ids)] = op.name
        masked.setdefault((op.func, _mask_consts(op.args)), []).append(op.name)
    taken: set[str] = set()

    def arg_ids(call: relax.Call, env: dict[Any, Any]) -> tuple[str, ...]:
        return tuple(env[a] if isinstance(a, relax.Var) else (f"const#{a.__hash__()}" if isinstance(a, Constant) else "const")
                     for a in call.args[1].fields)

    def match(call: relax.Call, env: dict[Any, Any]) -> str:
        ids = arg_ids(call, env)
        name = exact.get((call.args[0].name_hint, ids))
        if name is None or name in taken:
            key = (call.args[0].name_hint, tuple("const" if i.startswith("const") else i for i in ids))
            free = [n for n in masked.get(key, []) if n not in taken]
            if not free:
                raise GraphError(f"{graph.name}: cannot map FuseOps output {key} back to the graph")
            name = free[0]
        taken.add(name)
        return name

    env: dict[Any, Any] = {p: p.name for p in fused["main"].params}  # Relax Var -> op/input name
    groups: list[list[int]] = []
    for binding in (b for blk in fused["main"].body.blocks for b in blk.bindings):
        value = binding.value
        if isinstance(value, relax.Call) and value.op.same_as(call_tir):
            env[binding.var] = match(value, env)
            groups.append([idx[env[binding.var]]])
        elif isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar):
            func = fused[value.op]
            local = {p: (env[a] if isinstance(a, relax.Var) else f"const#{a.__hash__()}") for p, a in zip(func.params, value.args)}
            members = []
            for b in (b for blk in func.body.blocks for b in blk.bindings):
                local[b.var] = match(b.value, local)
                members.append(idx[local[b.var]])
            groups.append(members)
            ret = func.body.body
            env[binding.var] = local[ret] if isinstance(ret, relax.Var) else tuple(local[f] for f in ret.fields)
        elif isinstance(value, relax.TupleGetItem):
            env[binding.var] = env[value.tuple_value][value.index]
        else:
            raise GraphError(f"{graph.name}: unexpected {type(value).__name__} in FuseOps output")
    return canonical(groups)


def _mask_consts(args: tuple[str, ...]) -> tuple[str, ...]:
    return tuple("const" if a.startswith("const:") else a for a in args)
