"""ResNet basic block: relu(bn2(conv(relu(bn1(conv(x, w1))), w2)) + x)."""

from __future__ import annotations

import numpy as np
from tvm import relax

from autofuse.nn_ref import conv3x3_pad1 as _conv3x3_pad1, batch_norm_nchw as _bn, bn_params as _bn_params
from autofuse.space import Space, Tensor

EPS = 1e-5


def define(tiny: bool = False) -> Space:
    c, hw = (8, 8) if tiny else (64, 56)

    def forward(x, w1, bn1_gamma, bn1_beta, bn1_mean, bn1_var, w2, bn2_gamma, bn2_beta, bn2_mean, bn2_var):
        op = relax.op

        def conv_bn(inp, w, g, b, m, v):
            bn = op.nn.batch_norm(op.nn.conv2d(inp, w, padding=(1, 1)), g, b, m, v,
                                  axis=1, epsilon=EPS, training=False)
            return relax.TupleGetItem(bn, 0)

        h = op.nn.relu(conv_bn(x, w1, bn1_gamma, bn1_beta, bn1_mean, bn1_var))
        return op.nn.relu(op.add(conv_bn(h, w2, bn2_gamma, bn2_beta, bn2_mean, bn2_var), x))

    def reference(x, w1, bn1_gamma, bn1_beta, bn1_mean, bn1_var, w2, bn2_gamma, bn2_beta, bn2_mean, bn2_var):
        h = np.maximum(_bn(_conv3x3_pad1(x, w1), bn1_gamma, bn1_beta, bn1_mean, bn1_var), 0.0)
        y = _bn(_conv3x3_pad1(h, w2), bn2_gamma, bn2_beta, bn2_mean, bn2_var) + x
        return np.maximum(y, 0.0).astype(np.float32)

    wscale = 1.0 / np.sqrt(c * 9)
    return Space(
        name="resnet_block",
        description="ResNet basic block: conv-bn-relu-conv-bn + identity -> relu",
        activations=(Tensor("x", (1, c, hw, hw)),),
        params=(Tensor("w1", (c, c, 3, 3), scale=wscale), *_bn_params("bn1", c),
                Tensor("w2", (c, c, 3, 3), scale=wscale), *_bn_params("bn2", c)),
        forward=forward,
        reference=reference,
    )
