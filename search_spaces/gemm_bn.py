"""Linear layer followed by BatchNorm1d (inference) and ReLU."""

from __future__ import annotations

import numpy as np
from tvm import relax

from autofuse.space import Space, Tensor

EPS = 1e-5


def define(tiny: bool = False) -> Space:
    m, k, n = (16, 32, 32) if tiny else (256, 1024, 1024)

    def forward(x, w, b, gamma, beta, mean, var):
        op = relax.op
        # x @ w.T as matmul(permute_dims(w)); the transpose folds away once params are bound.
        y = op.add(op.matmul(x, op.permute_dims(w)), b)
        bn = op.nn.batch_norm(y, gamma, beta, mean, var, axis=1, epsilon=EPS, training=False)
        return op.nn.relu(relax.TupleGetItem(bn, 0))

    def reference(x, w, b, gamma, beta, mean, var):
        y = x.astype(np.float64) @ w.astype(np.float64).T + b
        y = (y - mean) / np.sqrt(var.astype(np.float64) + EPS) * gamma + beta
        return np.maximum(y, 0.0).astype(np.float32)

    return Space(
        name="gemm_bn",
        description="Linear (x w^T + b) -> BatchNorm1d (inference) -> ReLU",
        activations=(Tensor("x", (m, k)),),
        params=(
            Tensor("w", (n, k), scale=1.0 / np.sqrt(k)),
            Tensor("b", (n,), scale=0.1),
            Tensor("gamma", (n,), init="positive"),
            Tensor("beta", (n,), scale=0.1),
            Tensor("mean", (n,), scale=0.1),
            Tensor("var", (n,), init="positive"),
        ),
        forward=forward,
        reference=reference,
    )
