#!/bin/bash
# Reruns every variant here, one eval at a time (5-15 s each on 2 cores): bash datasets/judge-redteam/s48-reach-rt/run.sh (from anywhere)
H=$(cd "$(dirname "$0")" && pwd); cd $H && python3 gen.py
P8='{"ACC":8,"THREADS":1,"UNROLL":2}'; R8='{"ACC":8,"THREADS":1,"UNROLL":1}'; M='{"MR":4,"NR":16}'
R=pipelines/rmsnorm-range-cpu.yaml
# defence 1: the reach / the paired wide test (rmsnorm)
$H/one.sh w01_M1_out16bits.cpp.j2 "$P8"; $H/one.sh w01_M1_out16bits.cpp.j2 "$R8" $R
$H/one.sh w02_M1_fullbudget.cpp.j2 "$P8"; $H/one.sh w02_M1_fullbudget.cpp.j2 "$R8" $R
$H/one.sh w03_rowclusters_16bits.cpp.j2 "$R8" $R
$H/one.sh w04_first8rows_16bits.cpp.j2 "$P8"
$H/one.sh w05_ctl_half_rows_16bits.cpp.j2 "$R8" $R          # control: expected wrong (diff/se 7.9)
# defence 2: subnormal witness rows (moe)
for s in pipelines/moe-cpu.yaml pipelines/moe-swiglu-cpu.yaml datasets/judge-redteam/s48-reach-rt/moe-cpu-tiny.yaml; do
  for v in v01_dpbf16_daz s01_dpbf16_probe1 s02_dpbf16_noxwit_under16; do $H/one.sh $v.cpp.j2 "$M" $s | head -1; done
done
for v in - v03_dpbf16_subnormal_safe.cpp.j2 s01_dpbf16_probe1.cpp.j2; do $H/one.sh $v "$M" pipelines/moe-cpu.yaml | head -1; done
