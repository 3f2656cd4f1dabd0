"""NVRTC probe: which builtin / libdevice names compile, and to which div/rcp/ex2 opcodes."""
import re, sys
from cuda.core import Program, ProgramOptions
from runner.build.backends.cuda import _ptx_text
C = {
 "plain_div": "a / b",
 "nvvm_div_full": "__nvvm_div_full(a, b)",
 "nvvm_div_full_ftz": "__nvvm_div_full_ftz(a, b)",
 "builtin_fdividef": "__builtin_fdividef(a, b)",
 "nv_fdividef": None,
 "nvvm_fdividef": "__nvvm_fdividef(a, b)",
 "nvvm_div_rn_f": "__nvvm_div_rn_f(a, b)",
 "nvvm_rcp_rn_f": "__nvvm_rcp_rn_f(b)",
 "nvvm_ex2": "__nvvm_ex2_approx_f(b)",
 "builtin_nvvm_div_full": "__builtin_nvvm_div_full(a, b)",
}
for k, e in C.items():
    if e is None: continue
    src = 'extern "C" __global__ void k(float* o, float a, float b) { o[0] = %s; }' % e
    try:
        p = Program(src, "c++", ProgramOptions(arch="sm_90", std="c++17"))
        p.compile("cubin"); ptx = _ptx_text(p)
        print(k, "OK", sorted(set(re.findall(r"\b(?:div|rcp|ex2)\.[\w.]+", ptx))))
    except Exception as x:
        print(k, "ERR", str(x).splitlines()[-3:][:1])
