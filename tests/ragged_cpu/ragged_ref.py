"""The reference of the ragged test op (tests/ragged_cpu/spec.yaml): each row of x summed
over its first lens[b] elements, as a decode step reads each sequence to its own length."""

import torch


def ragged_sum(x: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    keep = torch.arange(x.shape[1], device=x.device) < lens.to(torch.int64)[:, None]
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=1)
