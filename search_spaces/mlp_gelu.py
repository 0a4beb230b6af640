"""Transformer MLP block: y = gelu_tanh(x @ w1.T + b1) @ w2.T + b2 + x."""

from __future__ import annotations

import numpy as np
from tvm import relax

from autofuse.space import Space, Tensor


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def define(tiny: bool = False) -> Space:
    m, d, h = (32, 32, 64) if tiny else (128, 768, 3072)

    def forward(x, w1, b1, w2, b2):
        op = relax.op
        # x @ w.T as matmul(permute_dims(w)): the form the Relax frontends emit.  With the
        # parameters bound (the default build), FoldConstant folds the transpose into the
        # constant weight and one `matmul` PrimFunc remains.
        h1 = op.add(op.matmul(x, op.permute_dims(w1)), b1)
        g = op.nn.gelu_tanh(h1)
        y = op.add(op.matmul(g, op.permute_dims(w2)), b2)
        return op.add(y, x)

    def reference(x, w1, b1, w2, b2):
        x64 = x.astype(np.float64)
        h1 = x64 @ w1.astype(np.float64).T + b1
        y = _gelu_tanh(h1) @ w2.astype(np.float64).T + b2 + x64
        return y.astype(np.float32)

    return Space(
        name="mlp_gelu",
        description="Transformer MLP: linear -> gelu(tanh) -> linear -> + residual",
        activations=(Tensor("x", (m, d)),),
        params=(
            Tensor("w1", (h, d), scale=1.0 / np.sqrt(d)),
            Tensor("b1", (h,), scale=0.1),
            Tensor("w2", (d, h), scale=1.0 / np.sqrt(h)),
            Tensor("b2", (d,), scale=0.1),
        ),
        forward=forward,
        reference=reference,
    )
