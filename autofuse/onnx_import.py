"""Real models: import an ONNX file as an autofuse workload.

The model goes through ``tvm.relax.frontend.onnx.from_onnx`` (weights kept as
parameters of ``main``, every shape static) and becomes a :class:`~autofuse.space.Space`
that carries the prebuilt Relax module instead of a ``forward`` function; its
weights are the space's parameter values and its reference output comes from
onnxruntime (or ``onnx.reference.ReferenceEvaluator`` when onnxruntime is
missing) on the same inputs.  From there an imported model travels the same road
as a hand-written space: Workload -> graph -> plan -> build -> measure.

Worker processes rebuild a model workload from plain data: the *model spec*
string ``model:{"path": "/abs/model.onnx", "shapes": {...}}`` is accepted by
:func:`autofuse.workload.get_workload` wherever a space name is.

Test models whose weights were stripped by ``benchmarks/make_test_models.py``
(initializers without data, doc_string ``autofuse:stripped:<recipe>``) get
deterministic seeded weights on load.
"""

from __future__ import annotations

import json
import zlib
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from autofuse.space import Space, SpaceError, Tensor

MODEL_PREFIX = "model:"
STRIPPED = "autofuse:stripped"
WEIGHT_SEED = 20261130


class ModelError(SpaceError):
    """The ONNX file cannot be imported (unreadable, unsupported op, symbolic shape, ...): an input error."""


# --------------------------------------------------------------------------- reading
def read_model(path: str | Path) -> Any:
    """Load and check an ONNX file; regenerate stripped test weights."""
    import onnx

    p = Path(path)
    if not p.is_file():
        raise ModelError(f"model file {path} does not exist")
    try:
        model = onnx.load(str(p))
    except Exception as e:  # DecodeError, truncated protobuf, ...
        raise ModelError(f"{path} is not a valid ONNX model (truncated or corrupt file): {_first_line(e)}") from None
    if not model.graph.node:
        raise ModelError(f"{path} is not a valid ONNX model (no graph nodes; truncated or not ONNX?)")
    model = materialize_weights(model)
    check_ops(model, str(path))
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise ModelError(f"{path} is not a valid ONNX model: {_first_line(e)}") from None
    return model


def is_stripped(model: Any) -> bool:
    return any(p.key == "autofuse.stripped_weights" for p in model.metadata_props)


def materialize_weights(model: Any, seed: int = WEIGHT_SEED) -> Any:
    """Fill initializers stripped by make_test_models.py with seeded random values (per-tensor seed)."""
    from onnx import numpy_helper

    for init in model.graph.initializer:
        if not init.doc_string.startswith(STRIPPED):
            continue
        recipe = init.doc_string[len(STRIPPED) + 1:]
        rng = np.random.default_rng([seed, zlib.crc32(init.name.encode())])
        shape = tuple(int(d) for d in init.dims)
        kind, *args = recipe.split(":")
        if kind == "uniform":
            a = rng.uniform(float(args[0]), float(args[1]), shape)
        elif kind == "normal":
            a = rng.standard_normal(shape) * float(args[0])
        else:
            raise ModelError(f"initializer {init.name}: unknown weight recipe {recipe!r}")
        init.CopyFrom(numpy_helper.from_array(a.astype(np.float32), init.name))
    return model


def supported_ops() -> set[str]:
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    return set(_get_convert_map())


def check_ops(model: Any, path: str = "model") -> None:
    """One clear line for the first op the importer does not know."""
    known = supported_ops()
    for i, node in enumerate(model.graph.node):
        if node.op_type not in known or (node.domain not in ("", "ai.onnx")):
            where = node.name or (node.output[0] if node.output else f"#{i}")
            dom = f" (domain {node.domain})" if node.domain not in ("", "ai.onnx") else ""
            raise ModelError(f"{path}: unsupported ONNX op {node.op_type}{dom} at node {where!r}")


def input_shapes(model: Any, shapes: dict[str, tuple[int, ...]] | None, path: str = "model") -> dict[str, tuple[int, ...]]:
    """Static shape of every runtime input; ``shapes`` fixes symbolic dims (a symbolic dim without it is an error)."""
    shapes = dict(shapes or {})
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    names = [i.name for i in inputs]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise ModelError(f"{path}: --shape names unknown input(s) {unknown}; inputs: {names}")
    out = {}
    for inp in inputs:
        tt = inp.type.tensor_type
        if tt.elem_type != 1:
            raise ModelError(f"{path}: input {inp.name!r} is not float32 (elem type {tt.elem_type}); unsupported")
        dims = list(tt.shape.dim)
        if inp.name in shapes:
            given = tuple(int(d) for d in shapes[inp.name])
            if len(given) != len(dims) or any(d.HasField("dim_value") and d.dim_value != g for d, g in zip(dims, given)):
                want = ",".join(d.dim_param or str(d.dim_value) for d in dims)
                raise ModelError(f"{path}: --shape {inp.name}={','.join(map(str, given))} does not fit its shape [{want}]")
            if any(g <= 0 for g in given):
                raise ModelError(f"{path}: --shape {inp.name}: dims must be positive")
            out[inp.name] = given
            continue
        fixed = []
        for axis, d in enumerate(dims):
            if not d.HasField("dim_value") or d.dim_value <= 0:
                sym = d.dim_param or "?"
                raise ModelError(f"{path}: input {inp.name!r} has symbolic dim {sym!r} (axis {axis}); "
                                 f"fix it with --shape {inp.name}=" + ",".join(str(x.dim_value) if x.HasField("dim_value") and x.dim_value > 0 else "N" for x in dims))
            fixed.append(int(d.dim_value))
        out[inp.name] = tuple(fixed)
    if not out:
        raise ModelError(f"{path}: the model has no runtime inputs")
    return out


# --------------------------------------------------------------------------- model spec
def model_spec(path: str | Path, shapes: dict[str, Any] | None = None, name: str | None = None) -> str:
    """The plain-data identity of a model workload (what a worker process rebuilds it from)."""
    d: dict[str, Any] = {"path": str(Path(path).resolve()),
                         "shapes": {k: [int(x) for x in v] for k, v in sorted((shapes or {}).items())}}
    if name:
        d["name"] = name
    return MODEL_PREFIX + json.dumps(d, sort_keys=True, separators=(",", ":"))


def parse_spec(spec: str) -> tuple[str, dict[str, tuple[int, ...]]]:
    d = json.loads(spec[len(MODEL_PREFIX):])
    return d["path"], {k: tuple(v) for k, v in d.get("shapes", {}).items()}


def is_model_name(name: str) -> bool:
    return name.startswith(MODEL_PREFIX) or name.endswith(".onnx")


def parse_shape_options(items: tuple[str, ...] | list[str]) -> dict[str, tuple[int, ...]]:
    """``--shape input=1,3,224,224`` (repeatable)."""
    out = {}
    for it in items:
        name, sep, dims = it.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            out[name] = tuple(int(x) for x in dims.split(","))
        except ValueError:
            raise ModelError(f"bad --shape {it!r}: use NAME=D0,D1,... e.g. input=1,3,224,224") from None
    return out


# --------------------------------------------------------------------------- the space
def model_space_from_spec(spec: str) -> Space:
    path, shapes = parse_spec(spec)
    return model_space(path, tuple(sorted(shapes.items())), json.loads(spec[len(MODEL_PREFIX):]).get("name"))


@cache
def model_space(path: str, shapes: tuple = (), name: str | None = None) -> Space:
    """The Space of an ONNX model: its Relax module (weights as parameters), values, reference."""
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    model = read_model(path)
    check_ops(model, path)
    shape_dict = input_shapes(model, dict(shapes), path)
    if len(model.graph.output) != 1:
        raise ModelError(f"{path}: the model has {len(model.graph.output)} outputs; autofuse supports one")
    try:
        mod = from_onnx(model, shape_dict={k: list(v) for k, v in shape_dict.items()}, keep_params_in_input=True)
    except Exception as e:  # the frontend raises many kinds
        raise ModelError(f"{path}: ONNX import failed: {_last_line(e)}") from None
    try:
        mod = split_to_slices(mod)
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"{path}: rewriting Split failed: {_last_line(e)}") from None
    main = mod["main"]
    num_input = int(main.attrs["num_input"])
    values = list(main.attrs["params"]) if "params" in main.attrs else []
    params = list(main.params)
    if len(params) - num_input != len(values):
        raise ModelError(f"{path}: importer returned {len(values)} weights for {len(params) - num_input} parameters")
    for p in params:
        if p.ty.shape is None or any(not isinstance(d, tvm.tirx.IntImm) for d in p.ty.shape.values):
            raise ModelError(f"{path}: input {p.name!r} has no static shape after import")
    ret = main.body.body.ty if hasattr(main.body.body, "ty") else None
    if ret is not None and not hasattr(ret, "shape"):
        raise ModelError(f"{path}: the model returns a tuple; autofuse supports one tensor output")

    def tensor(p: Any) -> Tensor:
        return Tensor(p.name, tuple(int(d) for d in p.ty.shape.values), str(p.ty.dtype))

    acts = tuple(tensor(p) for p in params[:num_input])
    weights = tuple(tensor(p) for p in params[num_input:])
    param_values = {t.name: np.asarray(v.numpy(), order="C") for t, v in zip(weights, values)}
    mod = tvm.IRModule({gv: (f.without_attr("params") if gv.name_hint == "main" else f) for gv, f in mod.functions.items()})

    onnx_inputs = list(shape_dict)  # ONNX names in main's order (from_onnx keeps graph order)
    relax_to_onnx = {t.name: o for t, o in zip(acts, onnx_inputs)}
    reference = _Reference(model.SerializeToString(), relax_to_onnx)
    check = reference(**{t.name: t.random(np.random.default_rng(1)) for t in acts})  # Space.random_activations(1)
    scale = float(np.max(np.abs(check))) or 1.0
    return Space(
        name=name or Path(path).stem,
        activations=acts,
        params=weights,
        forward=None,  # type: ignore[arg-type]
        reference=reference,
        description=f"ONNX model {path}",
        rtol=1e-3,
        atol=1e-3 * scale,  # fp32 summation order over deep nets: errors scale with the output's magnitude
        module=mod,
        param_values=param_values,
        source={"path": str(Path(path).resolve()), "shapes": {k: list(v) for k, v in shape_dict.items()}},
    )


class _Reference:
    """The model's output by onnxruntime (fallback: onnx.reference), float64."""

    def __init__(self, model_bytes: bytes, relax_to_onnx: dict[str, str]):
        self.model_bytes = model_bytes
        self.relax_to_onnx = relax_to_onnx
        self._sess: Any = None

    def __call__(self, **arrays: np.ndarray) -> np.ndarray:
        feeds = {o: np.asarray(arrays[r], dtype=np.float32) for r, o in self.relax_to_onnx.items()}
        if self._sess is None:
            try:
                import onnxruntime as ort

                opts = ort.SessionOptions()
                opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
                opts.intra_op_num_threads = 1
                sess = ort.InferenceSession(self.model_bytes, opts, providers=["CPUExecutionProvider"])
                self._sess = lambda f: sess.run(None, f)[0]
            except ImportError:
                import onnx
                from onnx.reference import ReferenceEvaluator

                ev = ReferenceEvaluator(onnx.load_from_string(self.model_bytes))
                self._sess = lambda f: ev.run(None, f)[0]
        return np.asarray(self._sess(feeds), dtype=np.float64)


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return (s.splitlines()[0] if s else type(e).__name__)[:300]


def _last_line(e: BaseException) -> str:
    lines = [l for l in str(e).strip().splitlines() if l.strip()]
    return lines[-1][:300] if lines else type(e).__name__


# --------------------------------------------------------------------------- by name
def registered_model(db_url: str, name: str) -> tuple[str, dict[str, tuple[int, ...]]] | None:
    """(path, shapes) of a model registered under ``name`` by ``autofuse import``/``tune`` (None: not one)."""
    from sqlalchemy import select

    from autofuse.db import DBError, PlanDB, af_workloads

    try:
        db = PlanDB(db_url, create=False, readonly=True)
    except DBError:
        return None
    try:
        with db.engine.connect() as c:
            rows = c.execute(select(af_workloads.c.graph_json).where(af_workloads.c.name == name)).fetchall()
    finally:
        db.close()
    for (text,) in reversed(rows):
        try:
            src = json.loads(text).get("model_source")
        except ValueError:
            continue
        if src:
            return src["path"], {k: tuple(v) for k, v in src.get("shapes", {}).items()}
    return None


def resolve_space(name: str, tiny: bool = False, db_url: str | None = None) -> Space:
    """A space by name, an ONNX model by path or spec, or a model registered in the DB by name."""
    from autofuse.space import load_space

    if name.startswith(MODEL_PREFIX):
        return model_space_from_spec(name)
    if name.endswith(".onnx"):
        return model_space(str(Path(name).resolve()))
    try:
        return load_space(name, tiny)
    except SpaceError:
        found = registered_model(db_url, name) if db_url else None
        if found is None:
            raise
        path, shapes = found
        return model_space(path, tuple(sorted(shapes.items())), name)


def split_to_slices(mod: Any) -> Any:
    """``split(x)[i]`` -> ``strided_slice(x, ...)``: autofuse's graph has one tensor per op, and a
    Split's tuple output would otherwise be an opaque tuple binding."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    split_op = tvm.ir.Op.get("relax.split")

    @mutator
    class _Rewrite(PyExprMutator):
        def visit_tuple_getitem_(self, op):  # noqa: N802 - TVM's visitor name
            new = super().visit_tuple_getitem_(op)
            tup = new.tuple_value
            call = self.lookup_binding(tup) if isinstance(tup, relax.Var) else tup
            if not (isinstance(call, relax.Call) and call.op.same_as(split_op)):
                return new
            x = call.args[0]
            axis = int(call.attrs.axis)
            shape = [int(d) for d in x.ty.shape.values]
            axis = axis % len(shape)
            ios = call.attrs.indices_or_sections
            if isinstance(ios, (int, tvm.tirx.IntImm)):
                n = int(ios)
                bounds = [shape[axis] * k // n for k in range(n + 1)]
            else:
                bounds = [0] + [int(i) for i in ios] + [shape[axis]]
            i = int(new.index)
            return relax.op.strided_slice(x, axes=[axis], begin=[bounds[i]], end=[bounds[i + 1]])

    rw = _Rewrite()
    out = tvm.IRModule(dict(mod.functions))
    for gv, f in mod.functions.items():
        if isinstance(f, relax.Function):
            out[gv] = rw.visit_expr(f)
    return tvm.transform.Sequential([relax.transform.Normalize(), relax.transform.DeadCodeElimination()])(out)
