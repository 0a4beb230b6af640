"""Conv 3x3 (pad 1) -> BatchNorm (inference) -> ReLU, NCHW."""

from __future__ import annotations

import numpy as np
from tvm import relax

from autofuse.nn_ref import conv3x3_pad1 as _conv3x3_pad1, batch_norm_nchw as _bn
from autofuse.space import Space, Tensor

EPS = 1e-5


def define(tiny: bool = False) -> Space:
    c, hw = (8, 8) if tiny else (64, 56)

    def forward(x, w, gamma, beta, mean, var):
        op = relax.op
        y = op.nn.conv2d(x, w, padding=(1, 1))
        bn = op.nn.batch_norm(y, gamma, beta, mean, var, axis=1, epsilon=EPS, training=False)
        return op.nn.relu(relax.TupleGetItem(bn, 0))

    def reference(x, w, gamma, beta, mean, var):
        y = _bn(_conv3x3_pad1(x, w), gamma, beta, mean, var)
        return np.maximum(y, 0.0).astype(np.float32)

    return Space(
        name="conv_bn_relu",
        description="Conv2d 3x3 pad 1 -> BatchNorm (inference) -> ReLU",
        activations=(Tensor("x", (1, c, hw, hw)),),
        params=(
            Tensor("w", (c, c, 3, 3), scale=1.0 / np.sqrt(c * 9)),
            Tensor("gamma", (c,), init="positive"),
            Tensor("beta", (c,), scale=0.1),
            Tensor("mean", (c,), scale=0.1),
            Tensor("var", (c,), init="positive"),
        ),
        forward=forward,
        reference=reference,
    )
