#!/bin/bash
# re-runs every variant once (fresh run dirs, secret seeds) and prints verdicts + pipe show's paired line
cd "$(dirname "$0")" && ../../../.venv/bin/python gen.py  # from the repo root: bash datasets/judge-redteam/s47-wide-rt2/run.sh
P8='{"ACC": 8, "THREADS": 1, "UNROLL": 2}'; P32='{"ACC": 32, "THREADS": 1, "UNROLL": 4}'
P1='{"ACC": 1, "THREADS": 1, "UNROLL": 1}'; P2='{"ACC": 2, "THREADS": 1, "UNROLL": 2}'; R8='{"ACC": 8, "THREADS": 1, "UNROLL": 1}'
./one.sh v00_copy "$P8"
./one.sh a01_smallM_out16bits "$P8"
./one.sh a02_smallM_fullbudget "$P8"
./one.sh a02_smallM_fullbudget "$P32"
./one.sh a03_smallM_shortN_fullbudget "$R8" pipelines/rmsnorm-range-cpu.yaml
./one.sh b01_cols8_6ulp "$P8"
./one.sh b02_cols8_6ulp_cols128_16bits "$P8"
./one.sh b02_cols8_6ulp_cols128_16bits "$P32"
./one.sh c01_dsum "$P1"
./one.sh c03_dsum_half_6ulp "$P1"
./one.sh c04_dsum_cols32_16bits_bigN "$P1"
./one.sh c05_dsum_cols16_16bits_bigN "$P1"
./one.sh c05_dsum_cols16_16bits_bigN "$P2"
./one.sh c06_dsum_3of4_6ulp "$P1"
