"""NumPy reference pieces shared by search spaces (float64 math; the spaces cast back)."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from autofuse.space import Tensor

EPS = 1e-5


def conv3x3_pad1(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """NCHW 3x3 convolution, stride 1, padding 1 (OIHW weights)."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = sliding_window_view(xp, (3, 3), axis=(2, 3))  # n, c, h, w, kh, kw
    return np.einsum("nchwij,ocij->nohw", win, w.astype(np.float64), optimize=True)


def batch_norm_nchw(y: np.ndarray, gamma, beta, mean, var, eps: float = EPS) -> np.ndarray:
    """Inference BatchNorm over axis 1 of an NCHW tensor."""
    c = (slice(None), None, None)
    return (y - mean[c]) / np.sqrt(var[c].astype(np.float64) + eps) * gamma[c] + beta[c]


def bn_params(prefix: str, c: int) -> tuple[Tensor, ...]:
    """gamma, beta, mean, var tensors named ``<prefix>_gamma`` ... (variance and scale kept positive)."""
    return (
        Tensor(f"{prefix}_gamma", (c,), init="positive"),
        Tensor(f"{prefix}_beta", (c,), scale=0.1),
        Tensor(f"{prefix}_mean", (c,), scale=0.1),
        Tensor(f"{prefix}_var", (c,), init="positive"),
    )
