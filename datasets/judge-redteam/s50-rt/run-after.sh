#!/bin/bash
# after the red team's fixes (ties at the normal minimum, the subnormal stratum only where the
# approved build is within a unit, thin strata pooled apart): what passed, three times, with the
# control and the honest rewrites: bash datasets/judge-redteam/s50-rt/run-after.sh
H=$(cd "$(dirname "$0")" && pwd); P='{"MR":2,"NR":8}'; S=pipelines/moe-swiglu-cpu.yaml
for i in 1 2 3; do
  for v in a00_approved_text h04_sum_reversed d02_sub_cut_below_2m130_at_T1 d03_sub_cut_below_2m128_at_T1 \
           t01_ties_toward_zero; do
    $H/one.sh $v.cpp.j2 "$P"
  done
  for v in a00_approved_text c00_silu_fixed h01_silu_recip h03_silu_expg_form c08_silu_fixed_sub_cut_below_2m130 \
           c09_silu_fixed_sub_cut_below_2m131 d01_sub_cut_at_T1; do
    $H/one.sh $v.cpp.j2 "$P" $S
  done
done
