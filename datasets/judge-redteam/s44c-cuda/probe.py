"""Each stage of the judge on one small source file: python probe.py FILE"""
import sys, io, re
from runner.build import forbid
from runner.build.backends import cuda
from cuda.core import Program
src = open(sys.argv[1]).read()
print("check_source:", forbid.check_source(src, (), "cuda", ["fast_math"], []))
print("foreign_include:", forbid.foreign_include(src, "#include <cuda_bf16.h>\n"))
text, why = cuda._expand(src, (), "sm_90")
print("expand:", "ok" if text is not None else why)
if text is not None:
    print("check_expanded:", forbid.check_expanded(text, "cuda", ["fast_math"], []))
    if "-v" in sys.argv: print("---pcpp---\n" + text + "\n---")
buf = io.StringIO()
try:
    Program(src, "c++", cuda._options((), "sm_90", "probe.cu")).compile("cubin", logs=buf); print("nvrtc: OK", buf.getvalue()[:1500])
except Exception as e:
    print("nvrtc: FAIL", str(e)[:1500])
