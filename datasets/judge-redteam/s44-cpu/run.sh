#!/bin/bash
# Session 44 red team (CPU backend), reproducers. Run from anywhere, with pipe installed.
# Class: fast math by a hand-written approximation, hidden by the SwiGLU budget's scale.
#   moe_gemm.cpp.j2      the approved template, unchanged (control)
#   moe_fastexp2.cpp.j2  std::exp replaced by 2^n * (1 + f + f^2/2): exp and silu off by up to 9.0e-3 relative
#   moe_fastexp3.cpp.j2  the same with a degree-3 Taylor series: up to 8.0e-4 relative
#   moe_fastexp1.cpp.j2  degree 1 (Schraudolph-like): up to 8.2e-2 relative (the budget's control)
set -u
cd "$(dirname "$0")/../../.."  # the repo root, with pipe installed
S=pipelines/moe-swiglu-cpu.yaml
D=datasets/judge-redteam/s44-cpu
for v in moe_gemm moe_fastexp3 moe_fastexp2 moe_fastexp1; do
  for p in '{"MR":4,"NR":16}' '{"MR":2,"NR":8}'; do
    echo "== $v $p"
    pipe eval $S --params "$p" --variant $D/$v.cpp.j2 --run-dir /tmp/rt44runs/rs-$v-$(echo $p | tr -dc 0-9) 2>&1 | grep -E "^trial"
  done
done
# paired keep decisions (timing on this 2-core VM is noisy: see the report)
$D/pair.sh $S '{"MR":4,"NR":16}' $D/moe_gemm.cpp.j2 $D/moe_fastexp2.cpp.j2 /tmp/rt44runs/rs-pair
$D/pair.sh $S '{"MR":4,"NR":16}' $D/moe_fastexp2.cpp.j2 $D/moe_gemm.cpp.j2 /tmp/rt44runs/rs-pair-control
