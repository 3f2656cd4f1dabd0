"""What a CPU kernel's library does, instruction by instruction: its x86-64 machine code
(`objdump -d`, every executable section), sorted into the forbidden actions and counted by
mnemonic against the approved template's library at the same parameters and shape
(`machine.compare`), for variants.

The CPU backend's source rules refuse inline assembly, fast-math flags and options, and the
half types by name; `immintrin.h` is allowed, and with it every intrinsic, under names no
list keeps up with (`_mm_rsqrt_ss` is a 12-bit reciprocal square root; `_mm512_rcp14_ps` a
14-bit reciprocal). The machine code names the instruction whatever the spelling:

- `fast_math`: the approximate reciprocals and square roots (`rcpps`, `rsqrtss`, `vrcp14ps`,
  `vrsqrt28ss`, `vrcpph`, ...), AVX-512ER's `vexp2ps`, the x87's transcendental approximations
  (`fsin`, `f2xm1`, `fyl2x`, ...), and loads of MXCSR (`ldmxcsr`, `fxrstor`, `xrstor`:
  flush-to-zero, denormals-are-zero or the rounding mode set at run time; the x87 control word's
  `fldcw` is GCC's own for an exact `floor` of a `long double`, and the kernel host reads the
  whole control state as each call returns, whatever set it), and AVX-512's embedded rounding
  toward zero or either infinity on arithmetic (`vmulps ...{rz-sae}`: a rounding mode with no
  MXCSR write; session 39's second CPU red team);
- `lower_precision`: AVX-512 FP16 arithmetic (`vaddph`, `vfmadd231sh`, ...; not its
  conversions, moves and comparisons) and AMX tiles on fp16 or fp8 (`tdpfp16ps`); the 8- and
  16-bit integer dot products (`vpdpbusd`, `vpdpwssd`, `pmaddubsw`, `pmaddwd`, AMX `tdpbssd`) are
  `int_narrowing`: lower precision in an op that declares no 8- or 16-bit integer (g++ makes
  them of a plain int16 dot loop).
  bf16 products accumulated in f32 (`vdpbf16ps`, `tdpbf16ps`) and conversions to bf16 or f16
  (`vcvtneps2bf16`, `vcvtps2ph`, AVX-512 FP16's `vcvtss2sh`, `vcvtw2ph`, ...) are `narrowing`: what a bf16 input or output needs (bf16 in,
  f32 out, as the CUDA tensor-core rule allows; storing a bf16 output), and lower precision in
  an op that declares no 16-bit float (an fp32 RMSNorm's sum of squares through `vdpbf16ps`, or
  fp16 arithmetic spelled as conversions around fp32 instructions: session 39's red team).

An instruction objdump cannot decode (`(bad)`) is counted as unreadable and refused beyond the
approved build's count. No waiver: the accurate math functions are libm's, called, not inlined.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from . import machine

UNAVAILABLE = "the judge reads a variant's machine code, and objdump (binutils) was not found"

_LINE = re.compile(r"^\s*[0-9a-f]+:\t(.*)$")
_PREFIXES = {"lock", "rep", "repz", "repe", "repnz", "repne", "notrack", "bnd", "data16", "addr32", "cs", "ds",
             "es", "fs", "gs", "ss", "xacquire", "xrelease"}
_REX = re.compile(r"^rex(\.[wrxb]+)?$", re.I)  # `rex.W`, `rex.WRXB`: objdump spells a redundant REX so
_FAST = re.compile(r"^v?(rcp|rsqrt)(14|28)?(ps|ss|pd|sd|ph|sh|bf16|pbf16)$|^vexp2p[sd]$"
                   r"|^v?ldmxcsr$|^fxrstor(64)?$|^xrstors?(64)?$"
                   # the x87's own approximations of transcendental functions
                   r"|^f(sin|cos|sincos|ptan|patan|2xm1|yl2x|yl2xp1)$")
# rounding a float to 16 bits, and bf16 products: a conversion a bf16 or fp16 output needs, and
# narrowing where the op declares no 16-bit float (`narrowing`, judged by the op's dtypes)
_NARROWING = re.compile(r"^(vcvt\w*2(ph|sh)[xyz]?|vcvtne2?ps2bf16[xyz]?|vdpbf16ps|tdpbf16ps)$")
# dot products of 8- and 16-bit integers: the op's own arithmetic where it declares such integers
_INT_NARROW = re.compile(r"^(v?pmaddubsw|v?pmaddwd|vpdpbu?s?ds?|vpdpbs[su]ds?|vpdpbuuds?|vpdpws?s?ds?"
                         r"|vpdpw[su][su]ds?|tdpb[su][su]d)$")
_NARROW = re.compile(r"^(tdpfp16ps|tcmmi?mfp16ps|tdpbf8ps|tdpbhf8ps|tdphbf8ps|tdphf8ps)$")
# AVX-512 FP16: arithmetic on packed or scalar halves; its conversions, moves, comparisons,
# classifications and broadcasts are exact
_HALF_EXACT = re.compile(r"^v(cvt|mov|cmp|fpclass|comi|ucomi|pbroadcast|perm|blendm|getexp|getmant)")


# AVX-512's embedded rounding on an arithmetic instruction: a rounding mode of its own, with no
# MXCSR write to see (`vmulps zmm0, zmm1, zmm2{rz-sae}`); on a conversion to an integer it is the
# truncation a C cast asks for, and round-to-nearest is the default's
_EMBEDDED_ROUNDING = re.compile(r"\{r[duz]-sae\}")


def classify(op: str, operands: list[str] = ()) -> str | None:
    """The forbidden action of an x86 instruction (an Intel-syntax mnemonic), "unreadable" for
    what objdump could not decode, or None."""
    if op == "(bad)":
        return "unreadable"
    if not op.startswith("vcvt") and _EMBEDDED_ROUNDING.search(op):
        return "fast_math"
    if _FAST.match(op):
        return "fast_math"
    if _NARROW.match(op):
        return "lower_precision"
    if _NARROWING.match(op):
        return "narrowing"
    if _INT_NARROW.match(op):
        return "int_narrowing"
    if op.startswith("v") and (op.endswith("ph") or op.endswith("sh")) and not _HALF_EXACT.match(op):
        return "lower_precision"
    return None


def instructions(text: str) -> list[tuple[str, list[str]]]:
    """(mnemonic, operands) of every instruction of `objdump -d -M intel --no-show-raw-insn`,
    past its prefixes (`lock`, `{vex}`, ...)."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        words = m.group(1).split()
        while words and (words[0].lower() in _PREFIXES or _REX.match(words[0]) or words[0].startswith("{")):
            words = words[1:]
        if not words:
            continue
        if words[0] == "(bad)":
            out.append(("(bad)", []))
            continue
        rest = " ".join(words[1:])
        rounding = _EMBEDDED_ROUNDING.search(rest)  # counted with the mnemonic: `vmulps{rz-sae}`
        out.append((words[0].lower() + (rounding.group(0) if rounding else ""), rest.split(",")))
    return out


def analyze(text: str) -> dict:
    return machine.count(instructions(text), classify, lambda action, op: op)


def compare(cand: dict, base: dict | None, named, waived=frozenset(), narrow_ok: bool = True,
            ints_ok: bool = False) -> tuple[str, str] | None:
    """machine.compare for CPU libraries."""
    return machine.compare(cand, base, named, waived, "machine code", "library", narrow_ok, ints_ok)


def disassemble(lib: str) -> str:
    exe = shutil.which("objdump")
    if exe is None:
        raise RuntimeError(UNAVAILABLE)
    r = subprocess.run([exe, "-d", "-w", "--no-show-raw-insn", "-M", "intel", lib], capture_output=True,
                       text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"objdump -d failed ({r.returncode}): {r.stderr.strip()[:300]}")
    return r.stdout


@lru_cache(maxsize=1)
def _digest() -> str:
    h = hashlib.sha256()
    for mod in (__file__, machine.__file__):
        h.update(Path(mod).read_bytes())
    return h.hexdigest()[:16]


def counts(lib: str) -> dict:
    """analyze() of a built library, kept beside it under this reader's digest."""
    return machine.kept(Path(lib).with_suffix(f".{_digest()}.x86.json"), lambda: analyze(disassemble(lib)))
