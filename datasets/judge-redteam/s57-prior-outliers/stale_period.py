"""How often a kernel that samples 8 positions i, i+65536 of its output (before writing) finds them equal:
the judge's stale values (tiled with period 65536) vs a user's stale memory (another tensor's values)."""
import secrets
import torch
from runner.judge.verify import stale_values

def periodic(p):
    f = p.reshape(-1)
    if f.numel() <= 65536:
        return False
    idx = [secrets.randbelow(f.numel() - 65536) for _ in range(8)]
    return all(bool(f[i] == f[i + 65536]) for i in idx)

like = torch.empty(512, 4096)
hits = sum(periodic(stale_values(like)) for _ in range(200))
user = sum(periodic(torch.randn(512, 4096)) for _ in range(200))  # an old activation left in the memory
print(f"judge's stale values flagged periodic: {hits}/200; a user's stale memory: {user}/200")
