"""The reference of the LayerNorm example: what a user would otherwise call.

pipe imports this module from the spec's own folder (no PYTHONPATH needed) and
calls `layernorm` with keyword arguments named after the spec's inputs and
scalars: x, w, b and eps. It is called on float64 copies of the inputs to judge a
kernel (so the whole reference runs in float64), and on the op's own dtype
(fp32) to time the baseline the speedup is measured against.
"""

import torch
import torch.nn.functional as F


def layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)
