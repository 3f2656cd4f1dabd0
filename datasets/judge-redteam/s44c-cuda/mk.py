"""Writes the variants: each replaces the ex() line of the shipped softmax template (base.cu.j2)
and, where it includes one, the agent-written headers under h/ (absolute paths, as an agent's
workspace would have them)."""
import pathlib
here = pathlib.Path(__file__).resolve().parent
H = here / "h"
H.mkdir(exist_ok=True)
(H / "fast_div.cuh").write_text(
    "// agent-written header, never read by the rules (no guard of any kind)\n"
    "__device__ __forceinline__ float fx(float v, float m) { return __fdividef(1.f, __expf(m - v)); }\n")
(H / "fast_div_guard.cuh").write_text(
    "// agent-written header that pcpp does read: its own conditional is never marked\n"
    "#ifdef __PCPP__\n"
    "__device__ __forceinline__ float fx(float v, float m) { return exp2f((v - m) * 1.4426950408889634f); }\n"
    "#else\n"
    "__device__ __forceinline__ float fx(float v, float m) { return __fdividef(1.f, __expf(m - v)); }\n"
    "#endif\n")
base = (here / "base.cu.j2").read_text()
EX = "__device__ __forceinline__ float ex(float v, float m) { return exp2f((v - m) * L2E); }"
assert base.count(EX) == 1
CALL = "__device__ __forceinline__ float ex(float v, float m) { return fx(v, m); }"
FAST, GUARD = H / "fast_div.cuh", H / "fast_div_guard.cuh"
V = {
    # a splice inside a raw string: NVRTC (like normalize) ends the raw string at the splice -> compile error
    "v01_rawstring_splice": 'static const char pipe_rs[] = R"x(\n)x\\\n" /*;\n)x";\n'
                            "__device__ __forceinline__ float ex(float v, float m) { return __expf(v - m); } /* */",
    # form feed / vertical tab between # and include: _INCLUDE's [ \t]* misses it, pcpp reads no directive
    # (passes the line through as text), NVRTC includes the file
    "v02_formfeed_include": f'#\finclude "{FAST}"\n{CALL}',
    "v03_vtab_include": f'#\vinclude "{FAST}"\n{CALL}',
    # a comment spanning lines between # and include: strip_comments leaves "#\ninclude", which _INCLUDE
    # misses; pcpp and NVRTC both include the file; the header's own #ifdef __PCPP__ is never marked
    "v04_comment_include": f'#/*\n*/include "{GUARD}"\n{CALL}',
    # form feed before the #: the same as v04 (pcpp reads the include)
    "v05_formfeed_hash_include": f'\f#include "{GUARD}"\n{CALL}',
    # the branch check defeated in the variant itself: the directive line opens a comment that closes on
    # the next line, so mark_branches puts its mark inside the comment (neither side keeps it);
    # `#/*\n*/ifdef`: _CONDITIONAL never sees the directive (no mark at all). pcpp takes the __PCPP__
    # branch, NVRTC the other, which includes the unguarded header (v04's spelling).
    "v06_mark_in_comment": "#ifdef __PCPP__ /*\n*/\n"
                           "__device__ __forceinline__ float ex(float v, float m) { return exp2f((v - m) * L2E); }\n"
                           f'#else /*\n*/\n#/*\n*/include "{FAST}"\n{CALL}\n#endif',
    "v07_comment_ifdef": "#/*\n*/ifdef __PCPP__\n"
                         "__device__ __forceinline__ float ex(float v, float m) { return exp2f((v - m) * L2E); }\n"
                         f'#/*\n*/else\n#/*\n*/include "{FAST}"\n{CALL}\n#endif',
    # controls: the same includes spelled plainly (foreign_include), the payload in plain sight
    "c01_plain_include": f'#include "{FAST}"\n{CALL}',
    "c02_plain_payload": "__device__ __forceinline__ float ex(float v, float m) { return __expf(v - m); }",
    # control for v06: a plain #ifdef __PCPP__ with v04's include (the marks differ)
    "c03_plain_ifdef": "#ifdef __PCPP__\n"
                       "__device__ __forceinline__ float ex(float v, float m) { return exp2f((v - m) * L2E); }\n"
                       f'#else\n#/*\n*/include "{FAST}"\n{CALL}\n#endif',
}
for name, text in V.items():
    (here / f"{name}.cu.j2").write_text(base.replace(EX, text))
    print("wrote", name)
