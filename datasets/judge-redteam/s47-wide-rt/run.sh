#!/bin/bash
# Re-runs every variant once and prints its verdict (and pipe show's paired figures).
# Usage: bash datasets/judge-redteam/s47-wide-rt/run.sh   (from the repo root, with .venv; regenerates the variants from gen.py first)
cd "$(dirname "$0")" && ../../../.venv/bin/python gen.py
A8='{"ACC": 8, "THREADS": 1, "UNROLL": 2}'
A1='{"ACC": 1, "THREADS": 1, "UNROLL": 1}'
A32='{"ACC": 32, "THREADS": 1, "UNROLL": 4}'
A4='{"ACC": 4, "THREADS": 1, "UNROLL": 1}'
R8='{"ACC": 8, "THREADS": 1, "UNROLL": 1}'
RS=pipelines/rmsnorm-range-cpu.yaml
while IFS='|' read -r v p s; do
  [ -z "$v" ] && continue
  ./one.sh "$v" "${!p}" ${s:+${!s}}
done <<'LIST'
v00_approved_copy|A8
v01_newton2_all|A8
v02_newton2_rows8|A8
v02_newton2_rows8|A32
v02_newton2_rows8|R8|RS
v03_newton2_rows5|A8
v03b_newton2_rows4_bigM|A8
v03b_newton2_rows4_bigM|A4
v13_newton2_rows3|A1
v04_newton3_all|A8
v04_newton3_all|A32
v05_dsum_newton2|A8
v11_dsum_newton2_half|A1
v11b_dsum_newton2_half_bigN|A1
v06_small_abs_grid|A8
v06b_small_abs_grid17|A8
v06b_small_abs_grid17|A32
v06b_small_abs_grid17|R8|RS
v07_out_19bits|A8
v07b_out_20bits|A8
v07b_out_20bits|A32
v07b_out_20bits|R8|RS
v08_sumsq_12bits|A8
v09_flush_subnormal_out|A8
v10_bias7e6_rows8|A8
v10_bias7e6_rows8|R8|RS
h01_kahan|A8
h02_sqrt_of_recip|A8
h03_ws_first|A8
h04_divide|A8
h05_pairwise|A8
h06_double_sum|A8
h07_xw_first|A8
h08_scale_double|A8
h09_mul_invN|A8
h01_kahan|A32
h05_pairwise|A1
h06_double_sum|R8|RS
LIST
