"""Turn a Space into a Relax module: the one road every workload takes into TVM."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from autofuse.space import Space, SpaceError


def space_to_relax(space: Space) -> tvm.IRModule:
    """A Relax module whose ``main`` takes activations then parameters, in the space's order.

    A space that carries a prebuilt module (an imported model, a model region) returns it."""
    if space.module is not None:
        return space.module
    bb = relax.BlockBuilder()
    args = {t.name: relax.Var(t.name, relax.TensorType(tuple(t.shape), t.dtype)) for t in space.inputs}
    with bb.function("main", list(args.values())):
        with bb.dataflow():
            try:
                out = space.forward(**args)
                gv = bb.emit_output(out)  # shape/type errors of the ops surface here
            except Exception as e:
                msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
                raise SpaceError(f"space {space.name!r}: forward() failed: {type(e).__name__}: {msg}") from e
        bb.emit_func_output(gv)
    return bb.get()


def bind_params(mod: tvm.IRModule, params: dict[str, np.ndarray]) -> tvm.IRModule:
    """Bind parameter arrays as constants of ``main`` (so a plan may fold them)."""
    return relax.transform.BindParams("main", {k: tvm.runtime.tensor(v) for k, v in params.items()})(mod)
