#!/bin/bash
# batch 2 (errors of at most a subnormal unit; honest rewrites), twice: bash datasets/judge-redteam/s50-rt/run2.sh
H=$(cd "$(dirname "$0")" && pwd); P='{"MR":2,"NR":8}'; S=pipelines/moe-swiglu-cpu.yaml
for i in 1 2; do
  for v in b05_sub_cut b06_sub_cut_below_2m128 b07_sub_cut_below_2m130 h04_sum_reversed; do
    $H/one.sh $v.cpp.j2 "$P"
  done
  for v in b05_sub_cut b07_sub_cut_below_2m130 c05_silu_fixed_sub_cut c06_silu_fixed_sub_cut_below_2m128 c07_silu_fixed_sub_cut_below_2m129 c08_silu_fixed_sub_cut_below_2m130 h01_silu_recip h02_silu_gu_first h03_silu_expg_form h04_sum_reversed; do
    $H/one.sh $v.cpp.j2 "$P" $S
  done
done
