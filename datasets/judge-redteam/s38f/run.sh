#!/usr/bin/env bash
# Session 38f's CPU red-team reproducers (after 5584426's cut_slow_at_curve), judged by the
# project's own CLI next to the honest template.
#   cd /work/main && . .venv/bin/activate && bash datasets/judge-redteam/s38f/run.sh [rows|blink|levels|all]
# rows (about 2.5 min): finding A, an rmsnorm variant 4x slow wherever M > 256 and M is not a
#   tuning value (2^18/N or 4): `pipe eval` on rmsnorm-range-cpu (ok), on the same spec with three
#   such sizes named (times against torch eager there, honest and variant), and `pipe compare` of
#   the variant's run (24 secret points: it keeps ranges whose rows reach those sizes; no cut there).
# blink (about 2 min): finding B, a moe-cpu variant 32x slow at T not in {1,4,16,64} during one
#   wall-clock window in eight (__rdtsc, hashed windows of 2^26 cycles): pipe eval + pipe compare (24 secret points) of the honest
#   template and of the variant, then per-call times outside the judge at T = 13 (median vs mean).
# levels (1 s): finding C, cut_slow_at_curve on a table whose pick came through the level chain.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE"
OUT=${OUT:-/tmp/s38f-out}
mkdir -p "$OUT" /tmp/s38f
export PYTHONPATH=/work/main${PYTHONPATH:+:$PYTHONPATH}
what=${1:-all}

if [ "$what" = rows ] || [ "$what" = all ]; then
  P='{"ACC":8,"THREADS":1,"UNROLL":1}'
  echo "== A: slow at rows above 256 that are not a tuning value (rmsnorm-range-cpu at $P)"
  for spec in rmsnorm-range-cpu.yaml rmsnorm-range-cpu-probe.yaml; do
    for v in "" rmsnorm_rowslow.cpp.j2; do
      d=$OUT/rows-$(basename $spec .yaml)-${v:-honest}; rm -rf "$d"
      python -m runner.cli eval $spec --params "$P" ${v:+--variant $v} --run-dir "$d" --json > "$d.json" 2> "$d.err"
      python -c "
import json; v=json.load(open('$d.json')); print('$spec', '${v:-honest}', v['status'], (v.get('reason') or '')[:200])
if 'probe' in '$spec':
    for sh, d in zip(['256x1024 (tune)', '1000x800', '3000x128', '400x4096'], v['shapes'][:4]):
        print('   %-16s kernel %8.1f us  torch eager %8.1f us  kernel/torch %.2f' % (sh, d['time_s']*1e6, d['baseline_s']*1e6, d['time_s']/d['baseline_s']))"
    done
  done
  echo "-- pipe compare on the variant's run folder (no compile/Triton/arms, 24 secret points)"
  timeout 580 python -m runner.cli compare "$OUT/rows-rmsnorm-range-cpu-rmsnorm_rowslow.cpp.j2" --no-compile --no-triton \
    --no-arms -q 2>&1 | sed -n '1,60p'
fi

if [ "$what" = blink ] || [ "$what" = all ]; then
  P='{"MR":4,"NR":16}'
  echo "== B: slow between the tuning points in one clock window of eight (moe-cpu at $P)"
  for n in honest:"" blink:moe_blink.cpp.j2; do
    nm=${n%%:*}; v=${n#*:}; d=$OUT/moe-$nm; rm -rf "$d"
    python -m runner.cli eval moe-cpu.yaml --params "$P" ${v:+--variant $v} --run-dir "$d" --json > "$d.json" 2> "$d.err"
    python -c "import json; v=json.load(open('$d.json')); print('$nm', v['status'], 'times_us(T=16,1,4,64)', [round(d['time_s']*1e6,1) for d in v.get('shapes') or []], (v.get('reason') or '')[:200])"
    timeout 580 python -m runner.cli compare "$d" --no-compile --no-triton --no-arms -q 2>&1 | sed -n '1,36p'
  done
  echo "-- per-call times outside the judge, fresh inputs, T = 13 (30000 calls: many 30 ms windows)"
  python ../s38e/calls.py 13 30000 ../../../kernel_templates/moe_gemm.cpp.j2:4:16 moe_blink.cpp.j2:4:16
fi

if [ "$what" = levels ] || [ "$what" = all ]; then
  echo "== C: a pick through the level chain is never cut"
  python levels_cut.py
fi
