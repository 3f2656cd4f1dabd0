"""Reference implementations: what production torch calls for each op.

Each is called twice by the judge: on float64 copies of the inputs for the
verdict (so the whole computation runs in float64), and on the op's own dtype
for the baseline timing (so it is the kernel a user would otherwise run).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Loss per row in float32 (float64 when the logits are float64)."""
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return F.cross_entropy(logits.to(acc), targets, ignore_index=ignore_index, reduction="none")
