"""Reference implementations: plain torch, written for clarity, not speed."""

from __future__ import annotations

import torch


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(acc)
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * w.to(acc)
    return y.to(x.dtype)


def softmax(x: torch.Tensor) -> torch.Tensor:
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return torch.softmax(x.to(acc), dim=-1).to(x.dtype)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    loss = torch.nn.functional.cross_entropy(
        logits.to(acc), targets, ignore_index=ignore_index, reduction="none")
    return loss.to(torch.float64 if acc == torch.float64 else torch.float32)
