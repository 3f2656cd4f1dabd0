#!/usr/bin/env bash
# Reproduces every verdict of README.md (one pipe command at a time; ~3 minutes on 2 cores).
set -u
cd /work/main && . .venv/bin/activate
D=datasets/judge-redteam/s39b-cpu
R=/tmp/rt39c
S='{"ACC":1,"THREADS":1,"UNROLL":1}'   # rmsnorm-cpu's search.start
ev() {  # name spec params [variant]
  local name=$1 spec=$2 params=$3 var=${4:-}
  rm -rf "$R/$name"
  echo "== $name: pipe eval $spec --params '$params' ${var:+--variant $var} --run-dir $R/$name"
  pipe eval "$spec" --params "$params" ${var:+--variant "$var"} --run-dir "$R/$name" 2>&1 | grep -E "^trial|^  shape|kept"
}
ev y1  pipelines/rmsnorm-cpu.yaml "$S" $D/y1_rmsnorm_mremap_rodata_exec.cpp.j2
ev y1p pipelines/rmsnorm-cpu.yaml "$S" $D/y1p_rmsnorm_mremap_proof.cpp.j2
ev y2  pipelines/rmsnorm-cpu.yaml "$S" $D/y2_rmsnorm_avx512_embedded_rz.cpp.j2
ev y3  pipelines/rmsnorm-cpu.yaml "$S" $D/y3_rmsnorm_ftz_daz_unless_tiny.cpp.j2
ev y3p pipelines/rmsnorm-cpu.yaml "$S" $D/y3p_rmsnorm_ftz_proof.cpp.j2
ev y3c pipelines/rmsnorm-cpu.yaml "$S" $D/y3c_rmsnorm_ftz_daz_always_control.cpp.j2
ev y4_acc32 pipelines/rmsnorm-cpu.yaml '{"ACC":32,"THREADS":1,"UNROLL":1}' $D/y4_rmsnorm_mxcsr_round_to_zero_restored.cpp.j2
ev y4_acc1  pipelines/rmsnorm-cpu.yaml "$S" $D/y4_rmsnorm_mxcsr_round_to_zero_restored.cpp.j2
# honest threads under the new filter (a copy of rmsnorm-cpu whose THREADS space has 2)
ev h1_template_threads2 $D/rmsnorm-cpu-threads.yaml '{"ACC":8,"THREADS":2,"UNROLL":1}'
ev h2_fp2_threads2 $D/rmsnorm-cpu-threads.yaml '{"ACC":1,"THREADS":2,"UNROLL":1}' datasets/judge-redteam/s39-cpu/fp2_rmsnorm_avx512_lambda_thread.cpp.j2
# static read + in-process run under the host's two filters (the library pipe built is g++ BASE_FLAGS of best/kernel.cpp)
for n in y1 y2; do
  g++ -O3 -march=native -std=c++17 -shared -fPIC -pthread $R/$n/best/kernel.cpp -o $R/$n.so
  echo "== evidence $n"; python $D/evidence.py $R/$n.so
done
# moe-cpu: reduced-precision accumulation spelled as integer bit operations (all `wrong`: the GEMM budget holds)
for v in m1_moe_bf16_accumulator m2_moe_tf32_accumulator m3_moe_16bit_mantissa_accumulator; do
  ev $v pipelines/moe-cpu.yaml '{"MR":1,"NR":4}' $D/$v.cpp.j2
done
