"""Named arms of `pipe compare` (op.arms) for the tests: RMSNorm another way, and a wrong one."""

import torch


def rmsnorm_rsqrt(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference's answer by hand: the mean of squares, rsqrt, the weight."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rmsnorm_no_weight(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Wrong: forgets the weight."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
