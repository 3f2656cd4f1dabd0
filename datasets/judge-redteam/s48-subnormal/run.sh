#!/bin/bash
# Reruns every variant of this folder, one eval at a time (about 5 s each on a 2-core machine):
#   bash datasets/judge-redteam/s48-subnormal/run.sh    (from the repo root)
H=$(cd "$(dirname "$0")" && pwd); P='{"MR":4,"NR":16}'; T=datasets/judge-redteam/s48-subnormal/moe-cpu-tiny.yaml
for s in pipelines/moe-cpu.yaml pipelines/moe-swiglu-cpu.yaml $T; do
  echo "== approved template on $s"; $H/one.sh - "$P" $s
done
for s in pipelines/moe-cpu.yaml pipelines/moe-swiglu-cpu.yaml $T; do
  echo "== v01_dpbf16_daz on $s"; $H/one.sh v01_dpbf16_daz "$P" $s
done
for s in pipelines/moe-cpu.yaml $T; do
  echo "== v02_cvtne_ftz_out on $s"; $H/one.sh v02_cvtne_ftz_out "$P" $s
done
for s in pipelines/moe-cpu.yaml $T; do
  echo "== v03_dpbf16_subnormal_safe on $s"; $H/one.sh v03_dpbf16_subnormal_safe "$P" $s
done
