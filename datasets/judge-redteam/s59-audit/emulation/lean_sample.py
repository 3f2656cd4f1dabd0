import torch, statistics, math
from runner.judge import verify
from runner.judge.verify import lean
from tests.test_lean import _trunc_bf16, _gen
n = verify.LEAN_SAMPLE * 2
ref = torch.rand(n, dtype=torch.float64, generator=_gen(3)).add_(0.5)
half = ref.to(torch.bfloat16)
half[: n // 2] = _trunc_bf16(ref[: n // 2])
ms = [lean(half, ref.float(), torch.bfloat16).mean for _ in range(400)]
mu, sd = statistics.mean(ms), statistics.stdev(ms)
out = sum(not (-0.27 < m < -0.23) for m in ms)
z = min(mu + 0.27, -0.23 - mu) / sd
p1 = 0.5 * math.erfc((mu + 0.27) / sd / math.sqrt(2)) + 0.5 * math.erfc((-0.23 - mu) / sd / math.sqrt(2))
print(f"LEAN_SAMPLE={verify.LEAN_SAMPLE} mean {mu:.5f} sd {sd:.5f} outside {out}/400; normal tail per call {p1:.2e}; per test (3 calls) {1-(1-p1)**3:.2e}")
