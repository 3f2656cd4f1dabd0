#!/bin/bash
# batch 3, three times: bash datasets/judge-redteam/s50-rt/run3.sh
H=$(cd "$(dirname "$0")" && pwd); P='{"MR":2,"NR":8}'; S=pipelines/moe-swiglu-cpu.yaml
for i in 1 2 3; do
  for v in d01_sub_cut_at_T1 d02_sub_cut_below_2m130_at_T1 d03_sub_cut_below_2m128_at_T1; do
    $H/one.sh $v.cpp.j2 "$P"
  done
  for v in c08_silu_fixed_sub_cut_below_2m130 c09_silu_fixed_sub_cut_below_2m131 d01_sub_cut_at_T1; do
    $H/one.sh $v.cpp.j2 "$P" $S
  done
done
