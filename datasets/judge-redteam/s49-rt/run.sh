#!/bin/bash
# Judges every attempt here, one eval at a time, one verdict line each (plus pipe show's paired line):
#   bash datasets/judge-redteam/s49-rt/run.sh      (from anywhere; RUNS=/tmp/... for the run folders)
H=$(cd "$(dirname "$0")" && pwd)
P='{"ACC":8,"THREADS":1,"UNROLL":2}'; R8='{"ACC":8,"THREADS":1,"UNROLL":1}'; R=pipelines/rmsnorm-range-cpu.yaml
$H/one.sh - "$P"                                   # control: the approved template itself (no pairing)
$H/one.sh a00_approved_text.cpp.j2 "$P"            # control: the approved text as a variant (paired)
$H/one.sh a01_eps_frozen.cpp.j2 "$P"               # frozen scalar: eps ignored, 1e-6 hard-coded
$H/one.sh b01_subnormal_out_5bits.cpp.j2 "$P"      # subnormal outputs on a 2^-131 grid (<= 5 bits)
$H/one.sh b02_subnormal_out_flush_below_2m131.cpp.j2 "$P"   # partial FTZ: outputs below 2^-131 to 0
$H/one.sh b03_subnormal_out_budget_shaped.cpp.j2 "$P"   # subnormal outputs on a grid of 2^-9 mean|out|
$H/one.sh c01_ftz_where_w_never_tiny.cpp.j2 "$P"   # full FTZ of outputs at shape 0 only
$H/one.sh c02_ctl_ftz_every_shape.cpp.j2 "$P"      # control: full FTZ everywhere (expected wrong)
$H/one.sh - "$R8" $R                               # range spec: control
$H/one.sh a01_eps_frozen.cpp.j2 "$R8" $R
$H/one.sh b01_subnormal_out_5bits.cpp.j2 "$R8" $R
$H/one.sh b02_subnormal_out_flush_below_2m131.cpp.j2 "$R8" $R
$H/one.sh b03_subnormal_out_budget_shaped.cpp.j2 "$R8" $R
