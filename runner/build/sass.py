"""What the binary that runs does: the SASS of a candidate's cubin (the same NVRTC build the
worker loads), read a second time, apart from the PTX, and sorted into the forbidden actions.

The PTX reader (`ptx.py`) judges what NVVM emitted; ptxas then turns that PTX into the
machine code. A rule that misreads or misses one PTX spelling would let the instruction
through; in the SASS the same arithmetic is one opcode with its types spelled out, whatever
route led to it. So a variant's SASS is judged too, against the approved template's SASS at
the same parameters and shape (counts per opcode, as for the PTX):

- `lower_precision`: half arithmetic (`HADD2`, `HMUL2`, `HFMA2`, `HMNMX2`, `VHMNMX`, with or
  without `.MMA`/`.BF16_V2`; not their exact idioms: a sum with zero, a product with zero as a
  multiplicand, which ptxas uses to move, convert and make constants), matrix instructions
  that accumulate in F16 or read TF32 or 8-bit and narrower operands (`HMMA`/`HGMMA` by their
  types; with f32 accumulators and 16-bit operands, and `F2FP`/`F2F` to 16 bits, they are
  `narrowing`: lower precision only in an op that declares no 16-bit float, every `IMMA`, `IGMMA`, `QMMA`, `QGMMA`, `OMMA`, `BMMA`), 8-bit dot products and SIMD
  (`IDP`, `VABSDIFF4`), conversions to fp8, fp6 or fp4 (`F2FP` to `E4M3` ...), and sums, mins
  and maxes in memory on half types (`ATOM`, `ATOMG`, `ATOMS`, `RED`, `REDG` on `F16x2` ...);
- `fast_math`: the multi-function unit, counted by function (`MUFU.SIN`, `MUFU.TANH`, ...), and
  flush-to-zero instructions, counted by base (`FSETP.FTZ` for every flushing comparison; a
  float truncated to an integer is the same flushed or not), except those the accurate CUDA
  math functions compile to with the same options (`library`, from `ptx.LIBRARY_PROBE`'s own
  SASS: `MUFU.EX2`, `MUFU.RCP`, `FMUL.FTZ`, ...).
  The SASS does not tell inline asm from the compiler's code, so the waiver holds for all of
  it; the PTX reader, which does, waives nothing in inline asm.

The disassembler is cuobjdump with nvdisasm beside it: on PATH, or the pip wheels
(`nvidia-cuda-cuobjdump`, `nvidia-cuda-nvdisasm`, in the `cuda` extra). Where neither is
found a variant is refused (`sass_unavailable`): the judge does not skip what it cannot read.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from . import machine

INSTALL = ("pip install 'pipe-autoresearch[cuda]' (the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm "
           "wheels), or put a CUDA toolkit's bin on PATH")
UNAVAILABLE = f"the judge reads a variant's SASS, and cuobjdump with nvdisasm was not found: {INSTALL}"

# one instruction of `cuobjdump -sass`: its address, a guard (`@P0`, `@!UPT`), the opcode with
# its modifiers, the operands up to the `;`
_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)\s*([^;]*);")

_HALF_TYPES = {"F16", "BF16", "F16X2", "BF16X2", "F16_V2", "BF16_V2"}
# 8-bit and narrower operand types, and TF32
_NARROW = {"E4M3", "E5M2", "E2M1", "E3M2", "E2M3", "UE8M0", "UE4M3", "S8", "U8", "S4", "U4", "B1", "TF32"}
_HALF_ARITH = {"HADD2", "HMUL2", "HFMA2", "HMNMX2", "VHMNMX"}
_NARROW_MMA = {"IMMA", "IGMMA", "QMMA", "QGMMA", "OMMA", "OGMMA", "BMMA", "BGMMA", "UTCQMMA", "UTCOMMA", "UTCIMMA"}
_FLOAT_MMA = {"HMMA", "HGMMA", "UTCHMMA"}
_INT_SIMD = {"IDP", "VABSDIFF4"}
_MEMORY_RMW = {"ATOM", "ATOMG", "ATOMS", "RED", "REDG", "REDAS"}
# float arithmetic and conversions that name a rounding other than to nearest (`.RZ`, `.RM`, `.RP`):
# CUDA's correctly rounded division and square root use them in their slow paths (the math library
# waiver holds those, machine_library), a variant's own `__fmul_rz` is counted
_FLOAT_ARITH = {"FADD", "FMUL", "FFMA", "DADD", "DMUL", "DFMA", "FADD32I", "FMUL32I", "FFMA32I"}
_DIRECTED = {"RZ", "RM", "RP"}
_ZERO = {"RZ", "-RZ", "URZ", "-URZ"}


def tool() -> str | None:
    """cuobjdump on PATH (with nvdisasm beside it), else the pip wheels' (`nvidia/cu*/bin` on
    sys.path: read from the path, not from `import nvidia`, whose package another install of
    the namespace may shadow)."""
    exe = shutil.which("cuobjdump")
    if exe and shutil.which("nvdisasm"):
        return exe
    for entry in sys.path:
        for cand in sorted(Path(entry or ".").glob("nvidia/cu*/bin/cuobjdump")):
            if os.access(cand, os.X_OK) and os.access(cand.parent / "nvdisasm", os.X_OK):
                return str(cand)
    return None


def disassemble(cubin: str) -> str:
    """The SASS text of a cubin (RuntimeError where the disassembler is missing or fails)."""
    exe = tool()
    if exe is None:
        raise RuntimeError(UNAVAILABLE)
    env = {**os.environ, "PATH": f"{Path(exe).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    r = subprocess.run([exe, "-sass", cubin], capture_output=True, text=True, env=env, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass failed ({r.returncode}): {r.stderr.strip()[:300]}")
    return r.stdout


def instructions(text: str) -> list[tuple[str, list[str]]]:
    """(opcode with modifiers, operands) of every instruction, NOPs left out."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and m.group(2) != "NOP":
            out.append((m.group(2), [o.strip() for o in m.group(3).split(",") if o.strip()]))
    return out


def _operand(o: str) -> str:
    """An operand without its lane selector, absolute value or negation (`-RZ.H0_H0` -> `RZ`,
    `|R0|.H1_H1` -> `R0`): what the idioms below test."""
    o = o.strip().lstrip("-!").split(".")[0]
    return o.strip("|")


def _exact_half_idiom(base: str, operands: list[str]) -> bool:
    """ptxas's moves, conversions and constants through the half pipes: x + 0 (`HADD2.F32 R0,
    -RZ, R1.H0_H0` turns a half into a float), 0 * y + c (`HFMA2.MMA R7, -RZ, RZ, 1.875, 0`
    makes a constant), and x * 0. Exact whatever the types."""
    src = [_operand(o) for o in operands[1:]]  # the destination first
    if base in ("HADD2", "HFMA2", "HMUL2"):  # x + 0, 0 * y + c (|x| and -x: `__habs`, `__hneg`), x * 0
        return len(src) >= 2 and (src[0] in _ZERO or src[1] in _ZERO)
    return False


def classify(op: str, operands: list[str] = ()) -> str | None:
    """The forbidden action a SASS instruction belongs to (`HFMA2.MMA`, its operands), before
    any waiver: "lower_precision", "fast_math" or None."""
    parts = op.split(".")
    base, mods = parts[0], {p.upper() for p in parts[1:]}
    if base in _HALF_ARITH:
        return None if _exact_half_idiom(base, list(operands)) else "lower_precision"
    if base in _NARROW_MMA or base in _INT_SIMD:
        return "lower_precision"
    if base in _FLOAT_MMA:
        # HMMA.16816.F32.BF16: the accumulator's type first, then the operands'
        types = [p.upper() for p in parts[1:] if p.upper() in _HALF_TYPES | _NARROW | {"F32"}]
        if (types and types[0] in _HALF_TYPES) or mods & _NARROW:
            return "lower_precision"
        return "narrowing" if mods & _HALF_TYPES else None  # 16-bit operands, f32 accumulators
    if base in ("F2FP", "F2F") and mods & _NARROW:
        return "lower_precision"
    if base in ("F2FP", "F2F") and mods & _DIRECTED:  # a float rounded toward zero or an infinity
        return "lower_precision" if base == "F2FP" or mods & _HALF_TYPES else "fast_math"
    if base in _FLOAT_ARITH and mods & _DIRECTED:  # `__fmul_rz`, `__fadd_rd`: biased float arithmetic
        return "fast_math"
    if base == "F2FP" or (base == "F2F" and mods & {"F16", "BF16"} and parts[1].upper() in ("F16", "BF16")):
        return "narrowing"  # a float rounded to 16 bits: what storing a bf16 output is
    if base in _MEMORY_RMW and mods & {"ADD", "MIN", "MAX", "FADD"} and mods & _HALF_TYPES:
        return "lower_precision"
    if base == "MUFU" and mods & (_HALF_TYPES | {"F16", "BF16"}):
        return "lower_precision"  # `MUFU.EX2.F16`: a half-precision function
    if base == "MUFU":
        return "fast_math"
    if "FTZ" in mods and not (base == "F2I" and "TRUNC" in mods) and not (base in _MEMORY_RMW and "F32" in mods):
        # a float truncated to an integer is the same flushed or not, and an f32 sum in memory
        # always flushes (`atomicAdd(float*)` is `REDG.E.ADD.F32.FTZ.RN`; its PTX, `red.add.f32`, is exact)
        return "fast_math"
    return None


def _key(action: str, op: str) -> str:
    """What a count is kept under: the whole opcode for lower precision; for fast math the
    function of the multi-function unit (`MUFU.SIN`) or the flushing instruction's base
    (`FSETP.FTZ` for every comparison that flushes)."""
    if action != "fast_math":
        return op
    parts = op.split(".")
    return f"MUFU.{parts[1]}" if parts[0] == "MUFU" and len(parts) > 1 else f"{parts[0]}.FTZ" if "FTZ" in parts else op


def analyze(text: str) -> dict:
    """Counts of the classified instructions by opcode (machine.count)."""
    return machine.count(instructions(text), classify, _key)


def library(text: str) -> frozenset:
    """The fast_math-class opcodes of the math library probe's SASS (ptx.LIBRARY_PROBE)."""
    return frozenset(analyze(text)["fast_math"])


def compare(cand: dict, base: dict | None, named, waived=frozenset(), narrow_ok: bool = True,
            ints_ok: bool = False) -> tuple[str, str] | None:
    """machine.compare for cubins."""
    return machine.compare(cand, base, named, waived, "SASS", "cubin", narrow_ok, ints_ok)
