"""Deployment: load the best verified plan of a workload from the plan DB, build it, call it.

::

    from autofuse import deploy
    model = deploy.load("sqlite:///results/autofuse.db", "mlp_gelu", target="llvm")
    y = model(x=x)                  # NumPy in (activations by name), NumPy out
    model.export("mlp.so")          # mlp.so + mlp.so.json sidecar (+ mlp.so.params.npz if unfolded)
    model2 = deploy.load_library("mlp.so")   # no DB, no space files needed

Only plans with a correct (verified) measurement are ever loaded, and a plan is
applied only to the workload whose structural hash it was made for.  A plan
tuned with another TVM or autofuse version, or on another host, loads with a
:class:`StalePlanWarning` (``strict=True``: a :class:`DeployError`).

No pickle and no eval: the sidecar is JSON, parameters are ``.npz`` loaded with
``allow_pickle=False``.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

import autofuse
from autofuse.db import DEFAULT_URL, BestPlan, DBError, PlanDB
from autofuse.export import export_library, sidecar_path
from autofuse.plan import Plan, PlanError
from autofuse.target import Target, TargetError, host_fingerprint, parse_target

__all__ = ["DeployError", "StalePlanWarning", "Model", "load", "load_library", "staleness", "params_path",
           "SIDECAR_FORMAT"]

#: ``format`` value of sidecars written by :meth:`Model.export`.
SIDECAR_FORMAT = "autofuse.deploy/1"
_HOST_KEYS = ("cpu", "cores", "gpu")


class DeployError(Exception):
    """A tuned plan cannot be deployed: none stored, stale (strict), bad inputs, bad library."""


class StalePlanWarning(UserWarning):
    """The plan was tuned with another TVM/autofuse version or on another host."""


def params_path(library: str | os.PathLike) -> Path:
    """Where :meth:`Model.export` puts parameters of a plan that does not fold them."""
    return Path(str(library) + ".params.npz")


def staleness(best: BestPlan) -> list[str]:
    """Why a stored plan may not be the best choice here (empty: tuned here, with these versions).

    Takes anything with ``tvm_version``, ``autofuse_version`` and ``host`` (a ``BestPlan``
    or a leaderboard row); a missing host fingerprint counts as another host."""
    import tvm

    reasons = []
    if best.tvm_version != tvm.__version__:
        reasons.append(f"tuned with TVM {best.tvm_version}, running TVM {tvm.__version__}")
    if best.autofuse_version != autofuse.__version__:
        reasons.append(f"tuned with autofuse {best.autofuse_version}, running autofuse {autofuse.__version__}")
    here = host_fingerprint()
    host = best.host if isinstance(best.host, dict) else {}
    diffs = [
        f"{k} {host.get(k)!r} vs {here.get(k)!r}"
        for k in _HOST_KEYS
        if _norm(host.get(k)) != _norm(here.get(k))
    ]
    if diffs:
        reasons.append("tuned on another host (" + ", ".join(diffs) + ")")
    return reasons


def _norm(v: Any) -> Any:
    return v or None  # "" and None both mean "no GPU"


class Model:
    """A built plan in a Relax VM. Call with activations by name (NumPy), get NumPy back."""

    def __init__(
        self,
        executable: Any,
        target: Target,
        *,
        plan: Plan,
        inputs: list[dict[str, Any]],
        params: list[dict[str, Any]],
        param_values: dict[str, np.ndarray],
        output: dict[str, Any],
        info: dict[str, Any],
    ) -> None:
        import tvm
        from tvm import relax

        self.target = target
        self.plan = plan
        self.info = info
        self._executable = executable
        self._inputs = [dict(i, shape=tuple(i["shape"])) for i in inputs]
        self._params = [dict(p, shape=tuple(p["shape"])) for p in params]
        self._output = dict(output, shape=tuple(output["shape"]))
        self.device = tvm.cpu(0) if target.kind == "llvm" else tvm.cuda(0)
        if not self.device.exist:
            raise DeployError(f"target {target.kind} needs a {target.kind} device, and this machine has none")
        try:
            self.vm = relax.VirtualMachine(executable, self.device)
        except Exception as e:  # noqa: BLE001 - TVM raises many kinds
            raise DeployError(f"cannot start the Relax VM: {_last_line(e)}") from None
        # Unfolded parameters stay resident on the device; they are the trailing inputs of main.
        self._param_tensors = [tvm.runtime.tensor(param_values[p["name"]], self.device) for p in self._params]
        self._param_values = {p["name"]: param_values[p["name"]] for p in self._params}

    # -- description ----------------------------------------------------------
    @property
    def plan_hash(self) -> str:
        return self.plan.hash

    @property
    def input_names(self) -> list[str]:
        """Activation names (what a call takes)."""
        return [i["name"] for i in self._inputs]

    @property
    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {i["name"]: i["shape"] for i in self._inputs}

    @property
    def param_names(self) -> list[str]:
        """Parameters of the workload: baked into the library (folded plans) or passed automatically."""
        return list(self.info.get("param_names", []))

    @property
    def runtime_param_names(self) -> list[str]:
        """Parameters passed at every call (plans with ``fold_params == False``); [] when folded."""
        return [p["name"] for p in self._params]

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self._output["shape"]

    def __repr__(self) -> str:
        return (f"<autofuse Model {self.info.get('workload')} plan {self.plan_hash} "
                f"on {self.target.kind} inputs={self.input_names}>")

    # -- calling --------------------------------------------------------------
    def __call__(self, *args: Any, **acts: Any) -> np.ndarray:
        """``model(x=...)`` (or positional in :attr:`input_names` order) -> NumPy output."""
        import tvm

        if len(args) > len(self._inputs):
            raise DeployError(f"{len(args)} positional inputs given, the model takes {len(self._inputs)} "
                              f"({', '.join(self.input_names)})")
        for spec, value in zip(self._inputs, args):
            if spec["name"] in acts:
                raise DeployError(f"input {spec['name']!r} given both positionally and by name")
            acts[spec["name"]] = value
        names = self.input_names
        unknown = sorted(set(acts) - set(names))
        missing = [n for n in names if n not in acts]
        if unknown or missing:
            parts = []
            if missing:
                parts.append("missing input(s) " + ", ".join(missing))
            if unknown:
                parts.append("unknown input(s) " + ", ".join(unknown))
            raise DeployError("; ".join(parts) + f" (the model takes {', '.join(names)})")
        tensors = [tvm.runtime.tensor(self._check_input(spec, acts[spec["name"]]), self.device) for spec in self._inputs]
        try:
            out = self.vm["main"](*tensors, *self._param_tensors)
        except Exception as e:  # noqa: BLE001
            raise DeployError(f"running the model failed: {_last_line(e)}") from None
        return out.numpy()

    @staticmethod
    def _check_input(spec: dict[str, Any], value: Any) -> np.ndarray:
        name, shape, dtype = spec["name"], spec["shape"], np.dtype(spec["dtype"])
        if isinstance(value, np.ndarray):
            if value.dtype != dtype:
                raise DeployError(f"{name}: dtype {value.dtype}, expected {dtype}")
            arr = value
        else:  # lists / scalars / array-likes: convert to the expected dtype
            try:
                arr = np.asarray(value, dtype=dtype)
            except (TypeError, ValueError) as e:
                raise DeployError(f"{name}: cannot convert to a {dtype} array: {e}") from None
        if arr.shape != shape:
            raise DeployError(f"{name}: shape {arr.shape}, expected {shape}")
        return np.asarray(arr, order="C")  # (ascontiguousarray makes 0-d arrays 1-d)

    # -- export ---------------------------------------------------------------
    def sidecar(self, library: str | os.PathLike = "model.so") -> dict[str, Any]:
        """What :meth:`export` writes next to ``library`` (JSON)."""
        return {
            "format": SIDECAR_FORMAT,
            "plan_hash": self.plan_hash,
            "plan": json.loads(self.plan.to_json()),
            "plan_label": self.plan.label,
            "workload": self.info.get("workload"),
            "workload_hash": self.info.get("workload_hash"),
            "space": self.info.get("space"),
            "tiny": self.info.get("tiny"),
            "target": self.target.spec,
            "inputs": [_io_json(i) for i in self._inputs],
            "params": [_io_json(p) for p in self._params],
            "param_names": self.param_names,
            "params_file": params_path(library).name if self._params else None,
            "output": _io_json(self._output),
            "tuned": {k: self.info.get(k) for k in ("median_ms", "tvm_version", "autofuse_version", "host",
                                                    "measured_at", "label", "kind")},
            "autofuse_version": autofuse.__version__,
        }

    def export(self, path: str | os.PathLike) -> Path:
        """Write the library (atomically) with its JSON sidecar; unfolded parameters go to
        ``PATH.params.npz``.  Returns the library path."""
        path = Path(path)
        meta = self.sidecar(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if self._params:
            _atomic_savez(params_path(path), self._param_values)
        else:
            params_path(path).unlink(missing_ok=True)  # a stale one from an earlier export
        try:
            return export_library(self._executable, path, sidecar=meta)
        except OSError:
            raise
        except Exception as e:  # noqa: BLE001 - the compiler/linker failing
            raise DeployError(f"exporting {path} failed: {_last_line(e)}") from None


# --------------------------------------------------------------------------- #
# from the database
# --------------------------------------------------------------------------- #
def load(
    url: str = DEFAULT_URL,
    name: str = "",
    target: str | dict | Target = "llvm",
    params: Mapping[str, np.ndarray] | None = None,
    tiny: bool = False,
    strict: bool = False,
) -> Model:
    """Build the best verified plan of space ``name`` on ``target`` from the DB at ``url``.

    ``name`` may also be an ONNX model file or the name it was registered under
    (``autofuse import``/``autofuse tune model.onnx``): the plan is the whole-model plan.

    ``params``: parameter values to bind (default: the space's own); they do not change
    the workload, so the tuned plan applies.  Raises :class:`DeployError` when no
    verified plan exists (or, with ``strict``, when it is stale); an unknown space
    name raises ``SpaceError`` and a bad target ``TargetError`` (input errors).
    """
    from autofuse.build import BuildError, build
    from autofuse.schedule import ScheduleRejected
    from autofuse.onnx_import import resolve_space
    from autofuse.workload import Workload

    if not name:
        raise DeployError("no workload name given")
    tgt = target if isinstance(target, Target) else parse_target(target)
    # a space name, an ONNX model path ("model.onnx") or the name a model was registered under
    w = Workload(resolve_space(name, tiny, url), tiny, dict(params) if params else None)
    try:
        db = PlanDB(url, create=False, readonly=True)
    except DBError as e:
        raise DeployError(f"cannot open plan database: {e}") from None
    try:
        best = db.best_plan(w.hash, tgt.spec, host=host_fingerprint())
    except DBError as e:
        raise DeployError(f"cannot read plan database: {e}") from None
    finally:
        db.close()
    tiny_flag = " --tiny" if tiny else ""
    if best is None:
        raise DeployError(
            f"no tuned plan for {w.name} on {tgt.kind} in {db.url}; "
            f"run `autofuse tune {name}{tiny_flag} --target {tgt.kind}` first"
        )
    reasons = staleness(best)
    if reasons:
        msg = f"plan {best.plan_hash} for {w.name} may be stale: " + "; ".join(reasons)
        if strict:
            raise DeployError(msg + f" (retune with `autofuse tune {name}{tiny_flag} --target {tgt.kind}`)")
        warnings.warn(msg, StalePlanWarning, stacklevel=2)
    try:
        plan = Plan.from_json(best.plan_json, label=best.label)
        if not plan.workload:
            raise PlanError("the stored plan names no workload hash")
        w.check_plan(plan)
    except PlanError as e:
        raise DeployError(f"stored plan {best.plan_hash} cannot be applied: {e}") from None
    graph = w.graph(plan.fold_params)
    try:
        executable = build(graph, plan, tgt)
    except (BuildError, PlanError, ScheduleRejected) as e:  # the stored plan no longer builds here
        raise DeployError(f"building plan {best.plan_hash} for {w.name} failed: {e}") from None

    act_names = {t.name for t in w.space.activations}
    inputs = [t.as_dict() for t in graph.inputs if t.name in act_names]
    params_spec = [t.as_dict() for t in graph.inputs if t.name not in act_names]
    out_op = graph.ops[graph.index()[graph.output]]
    info = {
        "workload": w.name,
        "workload_hash": w.hash,
        "space": w.space.name,
        "tiny": tiny,
        "plan_hash": plan.hash,
        "label": best.label,
        "target": tgt.spec,
        "median_ms": best.median_ms,
        "spread_ms": best.spread_ms,
        "kind": best.kind,
        "trials": best.trials,
        "measured_at": best.measured_at,
        "tvm_version": best.tvm_version,
        "autofuse_version": best.autofuse_version,
        "host": best.host,
        "stale": reasons,
        "param_names": [t.name for t in w.space.params],
        "db": db.url,
    }
    return Model(executable, tgt, plan=plan, inputs=inputs, params=params_spec, param_values=w.params,
                 output={"shape": list(out_op.shape), "dtype": out_op.dtype}, info=info)


# --------------------------------------------------------------------------- #
# from an exported library
# --------------------------------------------------------------------------- #
def load_library(path: str | os.PathLike) -> Model:
    """Load a library written by :meth:`Model.export` (reads ``PATH.json``; no DB, no spaces)."""
    import tvm

    path = Path(path)
    side = sidecar_path(path)
    try:
        meta = json.loads(side.read_text())
    except FileNotFoundError:
        raise DeployError(f"{side} is missing: {path} was not exported by autofuse deploy") from None
    except OSError as e:
        raise DeployError(f"cannot read {side}: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise DeployError(f"{side} is corrupt (not valid JSON: {e})") from None
    try:
        parsed = _parse_sidecar(meta)
    except (KeyError, TypeError, ValueError, PlanError, TargetError) as e:
        raise DeployError(f"{side} is corrupt or not an autofuse deploy sidecar: {_describe(e)}") from None
    plan, target, inputs, params, output = parsed
    if plan.hash != meta["plan_hash"]:
        raise DeployError(f"{side} is corrupt: plan hash {meta['plan_hash']} does not match its plan ({plan.hash})")
    if not path.is_file():
        raise DeployError(f"library {path} does not exist")

    values: dict[str, np.ndarray] = {}
    if params:
        ppath = params_path(path)
        try:
            with np.load(ppath, allow_pickle=False) as npz:
                values = {k: npz[k] for k in npz.files}
        except FileNotFoundError:
            raise DeployError(f"{ppath} is missing (the plan takes its parameters at run time)") from None
        except (OSError, ValueError) as e:
            raise DeployError(f"{ppath} is corrupt: {e}") from None
        for p in params:
            v = values.get(p["name"])
            if v is None or tuple(v.shape) != tuple(p["shape"]) or str(v.dtype) != p["dtype"]:
                got = "missing" if v is None else f"{v.dtype}{tuple(v.shape)}"
                raise DeployError(f"{ppath}: parameter {p['name']} is {got}, "
                                  f"expected {p['dtype']}{tuple(p['shape'])}")
    try:
        module = tvm.runtime.load_module(str(path))
    except Exception as e:  # noqa: BLE001
        raise DeployError(f"cannot load library {path}: {_last_line(e)}") from None
    tuned = meta.get("tuned") if isinstance(meta.get("tuned"), dict) else {}
    info = {
        "workload": meta.get("workload"),
        "workload_hash": meta.get("workload_hash"),
        "space": meta.get("space"),
        "tiny": meta.get("tiny"),
        "plan_hash": plan.hash,
        "target": target.spec,
        "library": str(path),
        "built_with_tvm": meta.get("tvm_version"),
        "param_names": list(meta.get("param_names") or [p["name"] for p in params]),
        **{k: tuned.get(k) for k in ("median_ms", "tvm_version", "autofuse_version", "host", "measured_at",
                                     "label", "kind")},
    }
    return Model(module, target, plan=plan, inputs=inputs, params=params, param_values=values,
                 output=output, info=info)


def _parse_sidecar(meta: Any):
    if not isinstance(meta, dict):
        raise TypeError("the sidecar is not a JSON object")
    if meta.get("format") != SIDECAR_FORMAT:
        raise ValueError(f"format {meta.get('format')!r}, expected {SIDECAR_FORMAT!r}")
    if not isinstance(meta["plan_hash"], str):
        raise TypeError("plan_hash must be a string")
    plan = Plan.from_dict(meta["plan"], label=str(meta.get("plan_label") or ""))
    target = parse_target(meta["target"])
    inputs = [_io_spec(i) for i in meta["inputs"]]
    params = [_io_spec(p) for p in (meta.get("params") or [])]
    output = _io_spec(meta["output"], named=False)
    if not inputs:
        raise ValueError("the sidecar lists no inputs")
    return plan, target, inputs, params, output


def _io_spec(d: Any, named: bool = True) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise TypeError(f"tensor description {d!r} is not an object")
    shape = d["shape"]
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise ValueError(f"bad shape {shape!r}")
    dtype = str(np.dtype(d["dtype"]))
    out: dict[str, Any] = {"shape": list(shape), "dtype": dtype}
    if named:
        if not isinstance(d["name"], str) or not d["name"]:
            raise ValueError(f"bad tensor name {d.get('name')!r}")
        out["name"] = d["name"]
    return out


def _io_json(d: dict[str, Any]) -> dict[str, Any]:
    out = {"shape": [int(s) for s in d["shape"]], "dtype": str(d["dtype"])}
    if "name" in d:
        out = {"name": d["name"], **out}
    return out


def _atomic_savez(path: Path, arrays: dict[str, np.ndarray]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _describe(e: BaseException) -> str:
    if isinstance(e, KeyError):
        return f"missing field {e.args[0]!r}"
    return str(e) or type(e).__name__


def _last_line(e: BaseException) -> str:
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else type(e).__name__
