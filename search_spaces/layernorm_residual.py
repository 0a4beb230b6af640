"""Residual add followed by LayerNorm over the last axis."""

from __future__ import annotations

import numpy as np
from tvm import relax

from autofuse.space import Space, Tensor

EPS = 1e-5


def define(tiny: bool = False) -> Space:
    m, d = (16, 32) if tiny else (512, 768)

    def forward(x, r, gamma, beta):
        op = relax.op
        return op.nn.layer_norm(op.add(x, r), gamma, beta, axes=[-1], epsilon=EPS)

    def reference(x, r, gamma, beta):
        s = x.astype(np.float64) + r
        mu = s.mean(axis=-1, keepdims=True)
        var = ((s - mu) ** 2).mean(axis=-1, keepdims=True)
        return ((s - mu) / np.sqrt(var + EPS) * gamma + beta).astype(np.float32)

    return Space(
        name="layernorm_residual",
        description="Residual add -> LayerNorm over the last axis",
        activations=(Tensor("x", (m, d)), Tensor("r", (m, d))),
        params=(Tensor("gamma", (d,), init="positive"), Tensor("beta", (d,), scale=0.1)),
        forward=forward,
        reference=reference,
    )
