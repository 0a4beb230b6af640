"""Scaled dot-product attention core: softmax(q @ k^T / 8) @ v, per head."""

from __future__ import annotations

import numpy as np
from tvm import relax

from autofuse.space import Space, Tensor

SCALE = 0.125  # 1/sqrt(64); kept in the tiny variant so the graph is the same


def define(tiny: bool = False) -> Space:
    shape = (2, 16, 8) if tiny else (12, 128, 64)

    def forward(q, k, v):
        op = relax.op
        s = op.multiply(op.matmul(q, op.permute_dims(k, [0, 2, 1])), relax.const(SCALE, "float32"))
        return op.matmul(op.nn.softmax(s, axis=-1), v)

    def reference(q, k, v):
        s = np.einsum("hqd,hkd->hqk", q.astype(np.float64), k.astype(np.float64)) * SCALE
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        p = s / s.sum(axis=-1, keepdims=True)
        return (p @ v.astype(np.float64)).astype(np.float32)

    return Space(
        name="attention",
        description="Attention core softmax(q k^T / 8) v over 12 heads",
        activations=(Tensor("q", shape), Tensor("k", shape), Tensor("v", shape)),
        params=(),
        forward=forward,
        reference=reference,
    )
