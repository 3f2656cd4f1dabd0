#!/bin/bash
# Judges every attempt here twice (draws are secret-seeded): bash datasets/judge-redteam/s50-rt/run.sh
H=$(cd "$(dirname "$0")" && pwd); P='{"MR":2,"NR":8}'; S=pipelines/moe-swiglu-cpu.yaml
for i in 1 2; do
  for v in a00_approved_text b01_sub_top3bits b02_sub_top5bits b03_sub_flush_below_2m130 b04_sub_flush_below_2m132 t01_ties_toward_zero; do
    $H/one.sh $v.cpp.j2 "$P"
  done
  for v in a00_approved_text c00_silu_fixed c01_silu_fixed_top3bits c02_silu_fixed_top2bits c03_silu_fixed_flush_below_2m130 c04_silu_fixed_flush_below_2m129 b01_sub_top3bits b03_sub_flush_below_2m130 t01_ties_toward_zero; do
    $H/one.sh $v.cpp.j2 "$P" $S
  done
done
