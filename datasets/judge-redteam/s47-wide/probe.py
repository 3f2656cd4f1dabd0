"""fp32 outputs paired with the approved build's (session 47, verify.wide_error) on the GPU:
cross-entropy-h200's loss under its approved text as a variant (the control), two honest
rewrites and two hand-made exps inside the loss's budget (rtol 2e-4); then session 46's probe
(bf16 outputs) again on the code of this session. Prints each verdict with the paired figures
the trial records (details.precision; "wide": mean log2(1 + |error| in units of fp32's rounding)).

    python3 datasets/judge-redteam/s47-wide/probe.py [OUT_DIR]    (from the repo root)
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("s46probe", HERE.parent / "s46-precision" / "probe.py")
s46 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(s46)

# 2^t by rint and a degree-4 Taylor polynomial on [-1/2, 1/2] (about 4e-5 off): under the loss's
# budget by far, and no exp instruction
FEXP2_4 = """
__device__ __forceinline__ float fexp2(float t) {
  t = fmaxf(t, -126.f);
  const float n = rintf(t), f = t - n;
  const float p = 1.f + f * (0.6931472f + f * (0.2402265f + f * (0.0555041f + f * 0.0096181f)));
  return __int_as_float(__float_as_int(p) + ((int)n << 23));
}
"""
PAIR = "acc += exp2f((lo(p[u].w[j]) - mz) * L2E) + exp2f((hi(p[u].w[j]) - mz) * L2E);"


def ce_variants(text: str) -> dict[str, str]:
    assert text.count(PAIR) == 1 and text.count("logf(s)") == 1
    first = text.index("__device__")
    return {
        "control": text,
        # the two exponentials added one at a time: another association of the same fp32 sum
        "honest-assoc": text.replace(PAIR, "{ " + PAIR.replace(") + exp2f(", "); acc += exp2f(") + " }"),
        # ln s as log2 s times ln 2: an fp32 rounding more on the loss
        "honest-log2": text.replace("logf(s)", "(log2f(s) * 0.6931472f)"),
        "fexp2-deg3": (text[:first] + s46.FEXP2 + text[first:].replace("exp2f(", "fexp2(")),
        "fexp2-deg4": (text[:first] + FEXP2_4 + text[first:].replace("exp2f(", "fexp2(")),
    }


def variants(name: str, text: str) -> dict[str, str]:
    return ce_variants(text) if name == "cross-entropy-h200" else s46.variants(name, text)


def main() -> int:
    """ARGV: [OUT_DIR [LABEL,...]]: with labels, only those variants of cross-entropy-h200."""
    names = ("cross-entropy-h200", "softmax-h200", "rmsnorm-h200", "moe-fine-h200")
    labels = sys.argv[2].split(",") if len(sys.argv) > 2 else None
    if labels:
        names = ("cross-entropy-h200",)

    def pick(name: str, text: str) -> dict[str, str]:
        return {k: v for k, v in variants(name, text).items() if labels is None or k in labels}
    return s46.run(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/s47-wide"), names, pick)


if __name__ == "__main__":
    sys.exit(main())
