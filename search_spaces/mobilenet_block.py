"""MobileNet separable block: bn2(conv1x1(relu6(bn1(dwconv3x3(x))))), no final activation."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from tvm import relax

from autofuse.nn_ref import batch_norm_nchw as _bn, bn_params as _bn_params
from autofuse.space import Space, Tensor

EPS = 1e-5


def define(tiny: bool = False) -> Space:
    cin, cout, hw = (8, 16, 8) if tiny else (32, 64, 112)

    def forward(x, dw, bn1_gamma, bn1_beta, bn1_mean, bn1_var, pw, bn2_gamma, bn2_beta, bn2_mean, bn2_var):
        op = relax.op
        d = op.nn.conv2d(x, dw, padding=(1, 1), groups=cin)  # depthwise
        bn1 = op.nn.batch_norm(d, bn1_gamma, bn1_beta, bn1_mean, bn1_var, axis=1, epsilon=EPS, training=False)
        h = op.clip(relax.TupleGetItem(bn1, 0), 0, 6)  # relu6
        p = op.nn.conv2d(h, pw)  # pointwise 1x1
        bn2 = op.nn.batch_norm(p, bn2_gamma, bn2_beta, bn2_mean, bn2_var, axis=1, epsilon=EPS, training=False)
        return relax.TupleGetItem(bn2, 0)

    def reference(x, dw, bn1_gamma, bn1_beta, bn1_mean, bn1_var, pw, bn2_gamma, bn2_beta, bn2_mean, bn2_var):
        xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        win = sliding_window_view(xp, (3, 3), axis=(2, 3))  # n, c, h, w, kh, kw
        d = np.einsum("nchwij,cij->nchw", win, dw[:, 0].astype(np.float64), optimize=True)
        h = np.clip(_bn(d, bn1_gamma, bn1_beta, bn1_mean, bn1_var), 0.0, 6.0)
        p = np.einsum("nchw,oc->nohw", h, pw[:, :, 0, 0].astype(np.float64), optimize=True)
        return _bn(p, bn2_gamma, bn2_beta, bn2_mean, bn2_var).astype(np.float32)

    return Space(
        name="mobilenet_block",
        description="MobileNet block: depthwise 3x3 -> bn -> relu6 -> pointwise 1x1 -> bn",
        activations=(Tensor("x", (1, cin, hw, hw)),),
        params=(Tensor("dw", (cin, 1, 3, 3), scale=1.0 / 3.0), *_bn_params("bn1", cin),
                Tensor("pw", (cout, cin, 1, 1), scale=1.0 / np.sqrt(cin)), *_bn_params("bn2", cout)),
        forward=forward,
        reference=reference,
    )
