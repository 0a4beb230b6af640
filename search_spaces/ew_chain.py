"""A pure elementwise chain: relu(a + b) * c + d."""

from __future__ import annotations

import numpy as np
from tvm import relax

from autofuse.space import Space, Tensor


def define(tiny: bool = False) -> Space:
    shape = (16, 32) if tiny else (1024, 4096)

    def forward(a, b, c, d):
        op = relax.op
        return op.add(op.multiply(op.nn.relu(op.add(a, b)), c), d)

    def reference(a, b, c, d):
        a, b, c, d = (t.astype(np.float64) for t in (a, b, c, d))
        return (np.maximum(a + b, 0.0) * c + d).astype(np.float32)

    return Space(
        name="ew_chain",
        description="Memory-bound elementwise chain relu(a+b)*c+d",
        activations=tuple(Tensor(n, shape) for n in "abcd"),
        params=(),
        forward=forward,
        reference=reference,
    )
