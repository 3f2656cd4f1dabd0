#!/usr/bin/env bash
# Session 38e's CPU red-team reproducers (moe-cpu), judged by the project's own CLI next to the honest template.
#   cd /work/main && . .venv/bin/activate && bash datasets/judge-redteam/s38e/run.sh [cliff|tail|budget|all]
# cliff (about 70 s): finding A, a kernel fast only at the tuning points T = 1, 4, 16, 64 (the whole
#   work 6 times over elsewhere): pipe eval + pipe compare (12 secret points) of the honest template
#   and of the variant, both at MR=4, NR=16.
# tail (about 40 s): a failed attempt, a data-dependent slow path on ~3 in 8 value sets: per-call
#   times outside the judge (median vs mean), then pipe eval of the honest template and the variant.
# budget (about 10 s): failed attempts, cheaper GEMM arithmetic against verify.GemmBudget.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE"
OUT=${OUT:-/tmp/s38e-out}
mkdir -p "$OUT"
export PYTHONPATH=/work/main${PYTHONPATH:+:$PYTHONPATH}
what=${1:-all}
P='{"MR":4,"NR":16}'
ev() {  # NAME [VARIANT]
  rm -rf "$OUT/$1"
  python -m runner.cli eval moe-cpu.yaml --params "$P" ${2:+--variant $2} --run-dir "$OUT/$1" --json > "$OUT/$1.json" 2> "$OUT/$1.err"
  python -c "import json; v=json.load(open('$OUT/$1.json')); print('$1', v['status'], 'times_us(T=16,1,4,64)', [round(d['time_s']*1e6,1) for d in v.get('shapes') or []], (v.get('reason') or '')[:200])"
}
if [ "$what" = cliff ] || [ "$what" = all ]; then
  for n in honest:"" cliff:moe_cliff.cpp.j2; do
    ev ${n%%:*} ${n#*:}
    timeout 500 python -m runner.cli compare "$OUT/${n%%:*}" --no-compile --no-triton --no-arms --points 12 -q 2>&1 | sed -n '1,24p'
  done
fi
if [ "$what" = tail ] || [ "$what" = all ]; then
  python calls.py 16 2000 ../../../kernel_templates/moe_gemm.cpp.j2:4:16 moe_tail.cpp.j2:4:16
  ev honest_t; ev tail moe_tail.cpp.j2
fi
if [ "$what" = budget ] || [ "$what" = all ]; then
  python budget_sim.py
fi
