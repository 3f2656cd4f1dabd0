"""What a CUDA candidate's compiled code does, instruction by instruction: the PTX that
NVRTC emitted for it (the same compile that made its cubin), sorted into the forbidden
actions.

Source rules read the spelling; a macro, a second instruction inside one inline-asm
string, or a C++ operator on bf16 types reaches the same instructions without the
spelling. So the judge also counts, in the PTX, the instructions of each forbidden class:

- `fast_math`: approximate instructions (`ex2.approx`, `lg2.approx`, `sin.approx`,
  `cos.approx`, `rcp.approx`, `rsqrt.approx`, `sqrt.approx`, `tanh.approx`, `div.approx`,
  `div.full`) and flush-to-zero (`.ftz`) arithmetic;
- `lower_precision`: arithmetic in f16/bf16 (`add`, `sub`, `mul`, `fma`, `min`, `max`, ...
  on `.f16`, `.bf16`, `.f16x2`, `.bf16x2`), TF32 (`cvt.rna.tf32.f32`, `mma ... .tf32`),
  matrix instructions that accumulate in half precision or read 8-bit and narrower operands
  (fp8, fp6, fp4, int8, int4), conversions of floats to fp8, fp6 or fp4, and atomic or bulk sums
  (`red`, `atom`, `cp.reduce.async.bulk`) in f16/bf16. Conversions, loads, stores and
  moves of 16-bit data are not arithmetic, and `mma`/`wgmma` with f32 accumulators is
  bf16-in/fp32-accumulate, which is allowed;
- external functions: device-side launches and streams (`cudaLaunchDevice`,
  `cudaGetParameterBuffer`, `cudaStream*`, `cudaGraph*`) are `side_streams`, device-side
  synchronizes `host_sync`, capture queries `disable_cuda_graphs`, and any other
  `.extern .func` but `vprintf` and `__assertfail` is `library_calls`.

Whatever the spec names, a variant may also declare no module-scope device data the approved
template's build lacks (`device_state`): a `__device__` or `__managed__` variable (PTX `.global`
data) outlives the call, so a kernel could count its calls, keep last call's inputs or
outputs, or learn which calls the judge checks, and answer the next call from that; nor may it
use the shared memory sm_90 reserves in each block (`%reserved_smem_offset_*`) where the approved
build does not. A `.global` declared inside a function or an inline asm string's braces counts
as module data too (it lives as long as the module), and so does more `cvta.const` than the
approved build has: a store through that generic address changes constant memory for every
later launch; likewise more `cvta.param` (a `__grid_constant__` parameter's generic address:
a replayed graph keeps its node's parameter memory, and a store there outlives the call). Constants read only as constants are not such data; what a launch leaves in shared memory and in its threads' local
frames outlives it too, and the judge overwrites both ahead of every call of a candidate
(`backends/cuda.Runtime.scrub`).

Counts are kept apart for the compiler's own code and for inline asm (NVVM marks it
`// begin inline asm` ... `// end inline asm`; the bf16 operators of cuda_bf16.h are inline
asm too). `compare` judges what a variant adds over the approved template's build at the
same parameters and shape. The accurate CUDA math functions themselves use some
approximate instructions (`expf` is a range reduction around `ex2.approx.ftz.f32`,
`exp2f` is `ex2.approx.f32`, `rsqrtf` is `rsqrt.approx.f32`): `library_opcodes` compiles
them once per toolchain and options, and those opcodes are not counted against the
compiler's own code (an honest variant may call `expf` more often or where the template
called `exp2f`); in inline asm nothing is waived.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter

_HALF = {"f16", "bf16", "f16x2", "bf16x2"}
_ARITH = {"add", "sub", "mul", "fma", "mad", "div", "rcp", "sqrt", "rsqrt", "ex2", "lg2", "tanh", "sin", "cos",
          "min", "max", "neg", "abs", "cvt"}
_EXACT_HALF = {"neg", "abs", "cvt"}  # exact on half types (cvt is a conversion, not arithmetic)
_APPROX_BASES = {"ex2", "lg2", "sin", "cos", "rcp", "rsqrt", "sqrt", "tanh", "div"}
_MMA = {"mma", "wmma", "wgmma", "tcgen05"}
_TYPES = {"f16", "bf16", "f16x2", "bf16x2", "tf32", "f32", "f64", "e4m3", "e5m2", "s8", "u8", "s4", "u4", "b1",
          "s32"}

ALLOWED_EXTERN = ("vprintf", "__assertfail")
UNREADABLE = "PTX the judge cannot read: a spelling its reader does not take is refused, not skipped"
UNJUDGED = "an instruction the judge sorts into no forbidden action, beyond the approved template's use of it"
DEVICE_STATE = ("state that outlives a call: module-scope device data (a __device__ or __managed__ variable) "
                "that the approved template's build does not declare")

# 8-bit and narrower types: an MMA that reads them, or a conversion that rounds to them, computes
# in less than any op here declares (bf16 at the least)
_NARROW = {"e4m3", "e5m2", "e4m3x2", "e5m2x2", "e4m3x4", "e5m2x4", "e2m1", "e2m1x2", "e2m1x4", "e3m2", "e3m2x2",
           "e3m2x4", "e2m3", "e2m3x2", "e2m3x4", "s8", "u8", "s4", "u4", "b1", "ue8m0", "ue8m0x2"}
_NARROW_FLOAT = {t for t in _NARROW if t[0] == "e" or t.startswith("ue")}  # fp8, fp6, fp4 and the scale type
_NARROW_INT = {"s8", "u8", "s4", "u4", "b1"}
# rounding modifiers other than to nearest (`.rn`, `.rna`): toward zero, minus and plus infinity,
# stochastic; the integer roundings of a float (`.rzi`, `.rmi`) are other words and stay allowed
_DIRECTED = {"rz", "rm", "rp", "rs"}
_REDUCE = {"atom", "red"}  # read-modify-write arithmetic in memory
_WIDE = {"f32", "f64", "u32", "s32", "u64", "s64", "b32", "b64", "acc::f32"}
# SIMD and dot-product arithmetic on 8- and 16-bit integers (`__vadd4`, `__dp4a`, ...)
_INT_SIMD = {"dp4a", "dp2a", "vadd2", "vadd4", "vsub2", "vsub4", "vabsdiff2", "vabsdiff4", "vavrg2", "vavrg4",
             "vmax2", "vmax4", "vmin2", "vmin4", "vset2", "vset4"}
# instructions the judge does not sort into an action: a variant may have no more of them than the
# approved template's build, whatever the spec names (a list of what to refuse missed
# `multimem`, typeless tensor sums and video SIMD: session 38's third red team); the scalar video
# instructions among them work on 32 bits, or on bytes and halves picked by selectors (`.b0`)
_UNJUDGED = {"multimem", "tensormap", "tcgen05", "alloca", "stacksave", "stackrestore", "brkpt", "pmevent",
             "suld", "sust", "sured", "suq", "clusterlaunchcontrol", "istypeof",
             "vadd", "vsub", "vabsdiff", "vmin", "vmax", "vshl", "vshr", "vmad", "vset"}


def _is_float(t: str) -> bool:
    return t[0] == "f" or t.startswith(("bf16", "e", "ue", "tf32"))


def classify(opcode: str) -> str | None:
    """The forbidden action an instruction (opcode with its modifiers, `ex2.approx.f32`) belongs to."""
    parts = opcode.lower().split(".")
    base, mods = parts[0], parts[1:]
    ms = set(mods)
    if base in _INT_SIMD or (base == "sad" and ms & {"u16", "s16"}):  # 8- and 16-bit integer math: quantised
        return "lower_precision"
    if base == "multimem":  # a sum across devices' memory in a half type (or an unnamed one)
        return "lower_precision" if "add" in ms and (ms & _HALF or not ms & _WIDE) else "unjudged"
    if base == "cp" and "reduce" in ms and "add" in ms and not ms & (_HALF | _WIDE):
        return "lower_precision"  # a tensor bulk sum takes its type from the tensor map: not known here
    if base in _UNJUDGED:
        return "unjudged"
    if base == "wmma" and ms & {"load", "store"}:
        return None  # a fragment moved: its type is the data's, not an accumulator's
    if base in _MMA:
        if "tf32" in ms or ms & _NARROW:  # TF32 or 8-bit (and narrower) operands
            return "lower_precision"
        types = [p for p in mods if p in _TYPES]
        if types and types[0] in _HALF:  # D, the accumulator, comes first
            return "lower_precision"
        return None
    if "tf32" in ms:
        return "lower_precision"
    if base == "cvt":
        types = [p for p in mods if p in _TYPES or p in _NARROW]
        if types and types[0] in _NARROW_FLOAT:  # the destination comes first: a float rounded to fp8, fp6, fp4
            return "lower_precision"
        if len(types) > 1 and types[0] in _NARROW_INT and _is_float(types[1]):
            return "lower_precision"  # a float quantised to an 8-bit (or narrower) integer
        if ms & _DIRECTED and types and _is_float(types[0]):
            # a float rounded toward zero or an infinity (or stochastically) to a float: a bias the
            # rounding to nearest the op's types imply does not have (`__float2bfloat16_rz`)
            return "lower_precision" if types[0] in _HALF else "fast_math"
    if (base in _REDUCE or (base == "cp" and "reduce" in ms)) and "add" in ms and ms & _HALF:
        return "lower_precision"  # sums accumulated in f16/bf16 in memory (atomics, bulk reductions)
    if base in _ARITH and ms & _HALF and base not in _EXACT_HALF:
        return "lower_precision"
    if base in _APPROX_BASES and ("approx" in ms or (base == "div" and "full" in ms)):
        return "fast_math"
    if base in _ARITH and ms & _DIRECTED and ms & {"f32", "f64"}:
        return "fast_math"  # float arithmetic rounded toward zero or an infinity (`__fmul_rz`, `__fadd_rd`)
    if "ftz" in ms and base in _ARITH | {"setp", "testp", "set", "slct", "selp"}:
        return "fast_math"
    return None


def classify_extern(name: str) -> str | None:
    if name in ALLOWED_EXTERN:
        return None
    if re.match(r"cuda(Device|Stream|Event)Synchronize", name):
        return "host_sync"
    if re.match(r"cudaStream(IsCapturing|GetCaptureInfo)|cudaThreadExchangeStreamCaptureMode", name):
        return "disable_cuda_graphs"
    if re.match(r"cuda(Launch|GetParameterBuffer|Stream|Graph|Event)", name):
        return "side_streams"
    return "library_calls"


_MARK = re.compile(r"^\s*//\s*(begin|end) inline asm\s*$")
# the shared memory sm_90 reserves in each block: a kernel that reads or writes it could keep
# state there from one launch to the next (the scrub writes it too, since session 30)
_RESERVED_SMEM = re.compile(r"%reserved_smem_offset_\w+")
# what tells one call from another without memory: the time (`%globaltimer` is the host's clock,
# set at device attach: a kernel right only before a date passes every check the judge makes,
# which all come before the export ships it), the clock counters, the performance counters, the
# launch's sequence number (`%gridid`), and the device it runs on (`%nsmid`: the judge's H100 and
# H200 have 132 SMs, an H100 PCIe 114, an H20 78, a MIG slice fewer; `%envreg`: the driver's).
# Counted against the approved build's reads, as `cvta.param` is (session 56's red team).
_TELLS = "%clocks and device registers"
_TELL_REGS = re.compile(r"%(?:globaltimer(?:_lo|_hi)?|clock(?:64|_hi)?|pm\d+(?:_64)?|gridid|nsmid|nwarpid|envreg\d+)"
                        r"(?![\w$])")


def declared_globals(ptx: str) -> list[str]:
    """The names of every `.global` variable the PTX declares, wherever and however it is
    spelled: at module scope, in a function body, inside an inline asm string's braces, split
    over lines, with or without a space before its type (`.global.u32 n`). Read over the whole
    text, not line by line (session 30's second red team kept counters past a rule that read one
    line at a time and wanted a space after `.global`). `.global` as an instruction's state space
    (`ld.global`, `cvta.to.global`) follows a letter, and a parameter's `.ptr .global` is no
    variable."""
    text = _strip_ptx_comments(ptx)
    names = []
    for m in re.finditer(r"(?<![\w$.%])\.global(?![\w$])", text):
        if text[:m.start()].rstrip().endswith(".ptr"):
            continue
        ident = re.search(r"(?<![.\w$%])([A-Za-z_$][\w$]*)", text[m.end():m.end() + 400])
        if ident:
            names.append(ident.group(1))
    return names


# constant memory made writable: `cvta.const` gives a generic address of constant data, through
# which a store changes it for every later launch (session 30, H200: a counter kept so)
_CVTA_CONST = "%cvta.const"
# `generic(sym)` in a declaration's initializer: the loader writes the generic address of module
# data (a `__constant__` array, say) into memory the kernel reads, as `cvta.const` would compute
# it (session 39's red team kept a call counter in constant memory so)
_GENERIC_INIT = "%generic() initializers"
# a kernel's parameters made writable: `cvta.param` gives a generic address of a parameter
# (`__grid_constant__`), and a replayed CUDA graph keeps a node's parameter memory from one
# replay to the next: a mark stored there outlived every call (session 36, H200)
_CVTA_PARAM = "%cvta.param"
# statements the reader cannot read as an instruction of PTX's (an opcode it does not know, text
# left over between the opcode and the operands) or directives inline asm has no use for: counted
# against the approved build's, so that a spelling the reader misses is refused, never skipped
_UNREADABLE = "%unreadable statements"
_ASM_DIRECTIVE = re.compile(r"^\.reg(?=[\s.])")  # `.reg .b8 r;` and `.reg.b8 r;` (cuda_bf16.h writes both)
# PTX's instructions (ISA 8.x and 9.0), by their first word
OPCODES = frozenset("""
abs activemask add addc alloca and applypriority atom bar barrier bfe bfi bfind bmsk bra brev brkpt brx call
clusterlaunchcontrol clz cnot copysign cos cp createpolicy cvt cvta discard div dp2a dp4a elect ex2 exit fence fma
fns getctarank griddepcontrol isspacep istypeof ld ldmatrix ldu lg2 lop3 mad mad24 madc mapa match max mbarrier
membar min mma mov movmatrix mul mul24 multimem nanosleep neg not or pmevent popc prefetch prefetchu prmt rcp red
redux rem ret rsqrt sad selp set setmaxnreg setp shf shfl shl shr sin slct sqrt st stackrestore stacksave stmatrix
sub subc suld suq sured sust szext tanh tcgen05 tensormap testp tex tld4 trap txq vabsdiff vabsdiff2 vabsdiff4
vadd vadd2 vadd4 vavrg2 vavrg4 vmad vmax vmax2 vmax4 vmin vmin2 vmin4 vote vset vset2 vset4 vshl vshr vsub vsub2
vsub4 wgmma wmma xor
""".split())


def _read(statement: str) -> tuple[str | None, bool]:
    """(the opcode with its modifiers as one word, whether that is the statement's whole first
    word): past a guard, what follows the opcode is whitespace then operands, or nothing
    (`ret`), never more of the word (`::` in a modifier the reader stopped at, session 38's
    second red team)."""
    rest = _GUARD.sub("", statement.strip())
    m = _OPCODE.match(rest)
    if not m:
        return None, False
    tail = rest[m.end():]
    return m.group(1) + re.sub(r"\s+", "", m.group(2)), not tail or tail[0] in " ({["


# (CPU backend) bytes of a library's load-time function tables beyond the toolchain's: code run
# as the worker loads it (backends/cpu.load_time_bytes); counted like cvta.const
LOAD_TIME = "%load-time tables"
# the data entries judged by their count against the approved build's, with the reason given
# machine code the compiler did not make a function of, in a CPU library (backends/cpu._elf_state):
# an executable section of its own, a data object in one, an indirect function; each named under
# "FOREIGN_CODE: what" beside the count
FOREIGN_CODE = "%foreign code"
FOREIGN = ("machine code the compiler did not make from the source: bytes placed in an executable section "
           "(a section attribute, an array called through a pointer) or an indirect function's resolver")
_COUNTED = {
    _UNREADABLE: ("{n} statements the judge cannot read as PTX instructions (an opcode it does not know, a "
                  "modifier it cannot parse, a directive inside inline asm other than `.reg`) vs {b} in the approved "
                  "template's build: spell inline asm as plain PTX"),
    _GENERIC_INIT: ("'generic(...)' in the initializers of the PTX's declarations: {n} vs {b} in the approved "
                    "template's build; the generic address of module data, written by the loader, lets a store "
                    "change that data for every later launch"),
    _CVTA_CONST: ("'cvta.const' in the PTX: {n} vs {b} in the approved template's build; a generic address of "
                  "constant memory lets a store change it for every later launch"),
    _CVTA_PARAM: ("'cvta.param' in the PTX: {n} vs {b} in the approved template's build; a generic address of a "
                  "kernel parameter lets a store keep a value in the launch's parameter memory, which a replayed "
                  "CUDA graph keeps from call to call"),
    _TELLS: ("reads of the clocks or of device registers (%globaltimer, %clock64, %gridid, %nsmid, %envreg, ...) "
             "in the PTX: {n} vs {b} in the approved template's build; the time, a launch's number or the device's "
             "size tell a user's call from the judge's (a kernel right only before a date, or only on 132 SMs, "
             "passes every check)"),
    FOREIGN_CODE: ("{n} pieces of foreign code in the library ({what}) vs {b} in the approved template's build"),
    LOAD_TIME: ("{n} bytes of load-time function tables in the library vs {b} in the approved template's build: a "
                "global object with a constructor or destructor, or a section attribute, runs code as the worker "
                "loads the library, outside every call"),
}
# a function declared or defined (a directive statement, whitespace collapsed): its name follows
# `.func` and the return parameters' parentheses, if any
_FUNC = re.compile(r"\.func(?![\w$])\s*(?:\([^)]*\)\s*)?([A-Za-z_$%][\w$%]*)")
_EXTERN_WORD = re.compile(r"\.extern(?![\w$])")
# ptxas reads an instruction as tokens: a guard `@p`, `@!p`, `@ !p`; the opcode, and each of its
# modifiers as `.word`, with any whitespace, newlines included, between them (`ex2 .approx.f32`
# and `ex2\n.approx.f32` assemble to the same instruction as `ex2.approx.f32`: session 38's red
# team passed fast math, fp8 MMA and constant-memory writes so)
_GUARD = re.compile(r"^@\s*!?\s*%?[\w$]+\s*")
_OPCODE = re.compile(r"^([a-z][a-z0-9_]*)((?:\s*\.\s*[a-z0-9_]+(?:::[a-z0-9_]+)*)*)", re.I)
# comments and string literals, left to right as ptxas reads them (a `/*` inside a `//` comment
# opens nothing; a block comment left open runs to the end)
_LEX = re.compile(r'//[^\n]*|/\*.*?(?:\*/|\Z)|"(?:\\.|[^"\\\n])*"', re.S)


def _asm_lines(lines: list[str]) -> list[bool]:
    """Which lines lie inside inline asm. A region runs from a `begin` mark to the last `end`
    mark before the next `begin`, so an asm string that writes its own `// end inline asm`
    line cannot end its region early."""
    marks = [(i, m.group(1)) for i, ln in enumerate(lines) if (m := _MARK.match(ln))]
    inside = [False] * len(lines)
    begins = [k for k, (_, kind) in enumerate(marks) if kind == "begin"]
    for b, k in enumerate(begins):  # each begin's region: to the last end before the next begin
        after = begins[b + 1] if b + 1 < len(begins) else len(marks)
        ends = [marks[e][0] for e in range(k + 1, after) if marks[e][1] == "end"]
        stop = ends[-1] if ends else (marks[after][0] if after < len(marks) else len(lines))
        for j in range(marks[k][0], stop):
            inside[j] = True
    return inside


def _strip_ptx_comments(text: str) -> str:
    """The text with its comments blanked (a block comment leaves its newlines, so lines keep
    their numbers) and its string literals kept, read left to right as ptxas reads them."""
    def blank(m):
        t = m.group(0)
        if t.startswith('"'):
            return t
        return "\n" * t.count("\n") + " " if t.startswith("/*") else ""
    return _LEX.sub(blank, text)


# directives that end at their line (no `;`): a debug location, the module's header, a kernel's
# launch bounds; any other directive ends at `;`, or at the `{` of a body (a declaration with
# an initializer, `= {...}`, at its `;`)
_LINE_DIRECTIVES = frozenset({".loc", ".file", ".version", ".target", ".address_size", ".maxntid", ".reqntid",
                              ".minnctapersm", ".maxnctapersm", ".maxnreg", ".noreturn", ".explicitcluster",
                              ".reqnctapercluster", ".maxclusterrank", ".pragma"})
_LABEL = re.compile(r"[%$A-Za-z_][\w$%]*\s*:(?!:)")  # `$L__BB0_2:`, `%pipe:`, never `::`
_SKIP = re.compile(r"[\s{};]+")  # whitespace, scope braces, empty statements
_DIRECTIVE = re.compile(r"\.\w+")
_CALL = re.compile(r"call(?:\s*\.\s*\w+)*\s*(?:\([^)]*\)\s*,\s*)?([A-Za-z_$%][\w$%]*)")


def _pieces(text: str):
    """(start, end, statement) of comment-free PTX, read as ptxas reads it: scope braces and
    labels (PTX's identifiers, `%` and `$` included) between statements; an instruction runs to
    its `;` across newlines and braces (`{%r1, %r2}` operands); a directive to its `;`, its
    body's `{`, or its line's end where it has no `;` (_LINE_DIRECTIVES: a `.loc` hid the
    instruction after it from a reader that split at `;` alone, session 38's second red team).
    Whitespace is collapsed; directives start with a dot."""
    i, n = 0, len(text)
    while i < n:
        m = _SKIP.match(text, i) or _LABEL.match(text, i)
        if m:
            i = m.end()
            continue
        if text[i] == ".":
            name = m.group(0) if (m := _DIRECTIVE.match(text, i)) else "."
            semi = text.find(";", i)
            semi = n if semi < 0 else semi
            if name in _LINE_DIRECTIVES:
                nl = text.find("\n", i)
                j = min(semi, n if nl < 0 else nl)
            else:  # to its `;`, or its body's `{` or its block's `}` (an initializer's braces are its own)
                brace = min((k for k in (text.find("{", i, semi), text.find("}", i, semi)) if k >= 0), default=-1)
                j = semi if brace < 0 or "=" in text[i:brace] else brace
        else:
            j = text.find(";", i)
            j = n if j < 0 else j
        raw = text[i:j]
        st = " ".join(raw.split())
        if st:
            yield i, i + len(raw.rstrip()), st
        i = max(j, i + 1)


def statements(text: str) -> list[str]:
    """The instructions of a piece of PTX (an asm string, or a whole module): split at `;` and
    braces, across newlines; labels, comments and directives dropped; each as `opcode operands`
    with its whitespace collapsed."""
    return [st for _, _, st in _pieces(_strip_ptx_comments(text)) if not st.startswith(".")]


def opcode(statement: str) -> str | None:
    """The opcode and its modifiers as one word (`ex2.approx.ftz.f32`), however ptxas would
    have let them be spaced, past a guard (`@p`, `@ !p`)."""
    return _read(statement)[0]


def _call_target(statement: str) -> str | None:
    """The function a `call` names: `call.uni (ret), name, (args)`, `call name, (args)`."""
    m = _CALL.match(_GUARD.sub("", statement.strip()))
    return m.group(1) if m else None


def analyze(ptx: str) -> dict:
    """Counts of the classified instructions, by opcode, in the compiler's code ("code") and
    in inline asm ("asm"), and the external functions the module declares ("extern")."""
    lines = ptx.split("\n")  # as `starts` below: a `\r` is no line break to ptxas's marks
    inside = _asm_lines(lines)
    text = _strip_ptx_comments(ptx)  # (the marks are comments: read above, on the raw lines)
    starts = [0] + [m.end() for m in re.finditer("\n", text)]  # each line's first offset
    code, asm, ext, data = Counter(), Counter(), Counter(), Counter()
    defined, called = set(), Counter()
    for r in _RESERVED_SMEM.findall(text):
        data[r] += 1
    n_tells = len(_TELL_REGS.findall(text))
    if n_tells:
        data[_TELLS] += n_tells
    for a, b, st in _pieces(text):
        # inline asm if any line of the statement lies in a region (nothing is waived there)
        in_asm = any(inside[i] for i in range(bisect_right(starts, a) - 1, min(bisect_right(starts, b - 1), len(inside))))
        if st.startswith("."):
            n_generic = len(re.findall(r"\bgeneric\s*\(", st))
            if n_generic:
                data[_GENERIC_INIT] += n_generic
            f = _FUNC.search(st)
            if f and _EXTERN_WORD.search(st):
                ext[f.group(1)] += 1
            elif f:
                defined.add(f.group(1))
            if in_asm and not _ASM_DIRECTIVE.match(st):  # inline asm declares registers, nothing else
                data[_UNREADABLE] += 1
            continue
        op, whole = _read(st)
        if op is None or op.split(".")[0].lower() not in OPCODES or not whole:
            data[_UNREADABLE] += 1  # what the reader cannot read is counted, never skipped
            continue
        if op.startswith("call"):
            target = _call_target(st)
            if target:
                called[target] += 1
        if op.startswith("cvta.const"):
            data[_CVTA_CONST] += 1
        elif op.startswith("cvta.param"):
            data[_CVTA_PARAM] += 1
        if classify(op):
            (asm if in_asm else code)[op] += 1
    for name in called:  # a call of what the module neither defines nor declares extern
        if name not in defined and name not in ext and not name.startswith("%"):  # (`%rd3`: through a pointer)
            ext[name] += 1
    for name in declared_globals(ptx):
        data[name] += 1
    return {"code": dict(sorted(code.items())), "asm": dict(sorted(asm.items())), "extern": dict(sorted(ext.items())),
            "data": dict(sorted(data.items()))}


def merge(analyses: list[dict]) -> dict:
    """The largest count of each opcode over several builds (the shapes of one trial)."""
    out: dict = {"code": {}, "asm": {}, "extern": {}, "data": {}}
    for a in analyses:
        for part in out:
            for k, v in a.get(part, {}).items():
                out[part][k] = max(out[part].get(k, 0), v)
    return out


def compare(cand: dict, base: dict | None, named, waived=frozenset()) -> tuple[str, str] | None:
    """(action, reason) for the first forbidden-class instruction the candidate's build has
    more of than the approved template's build (`base`; None: no approved build to compare
    with, so every count is new), or None. `waived` holds the opcodes the accurate math
    library compiles to, not counted in the compiler's own code."""
    base = base or {"code": {}, "asm": {}, "extern": {}, "data": {}}
    named = set(named)
    # whatever the spec names (see the module's docstring); what the reader could not read last,
    # so that a declaration it did read is named as what it is
    what = ", ".join(k[len(FOREIGN_CODE) + 2:] for k in cand.get("data", {}) if k.startswith(FOREIGN_CODE + ": "))
    for name, n in sorted(cand.get("data", {}).items(), key=lambda kv: kv[0] == _UNREADABLE):
        if name.startswith(FOREIGN_CODE + ": "):  # the names of what the count below counts
            continue
        if name in _COUNTED:  # more than the approved build has, not merely any
            b = base.get("data", {}).get(name, 0)
            if n > b:
                action = {_UNREADABLE: "unreadable_ptx", FOREIGN_CODE: "foreign_code"}.get(name, "device_state")
                return action, _COUNTED[name].format(n=n, b=b, what=what)
            continue
        if name not in base.get("data", {}):
            if name.startswith("%"):
                return "device_state", (f"the PTX uses {name}, the shared memory reserved in each block, which "
                                        "the approved template's build does not use")
            return "device_state", (f"the PTX declares the module-scope device variable '{name}', which the "
                                    "approved template's build does not")
    where = {"code": "compiled code", "asm": "inline asm"}
    for part in ("asm", "code"):
        for op, n in cand.get(part, {}).items():
            action = classify(op)
            if action == "unjudged":  # whatever the spec names, as many as the approved build at most
                b = base.get(part, {}).get(op, 0)
                if n > b:
                    return "unjudged_ptx", (f"'{op}' in the {where[part]}: {n} in the candidate's PTX vs {b} in the "
                                            "approved template's build; an instruction the judge sorts into no action "
                                            "is allowed only as often as the approved template uses it")
                continue
            if action not in named or (part == "code" and op in waived):
                continue
            b = base.get(part, {}).get(op, 0)
            if n > b:
                return action, (f"'{op}' in the {where[part]}: {n} in the candidate's PTX vs {b} in the approved "
                                "template's build at the same parameters")
    for name, n in cand.get("extern", {}).items():
        action = classify_extern(name)
        if action in named and name not in base.get("extern", {}):
            return action, f"the compiled code calls the external function '{name}', which the approved template's build does not"
    return None


# Accurate CUDA math functions (no intrinsics): what they compile to is not fast math.
LIBRARY_PROBE = r"""
extern "C" __global__ void pipe_library_probe(float* y, const float* x, double* d) {
  const int i = threadIdx.x;
  const float a = x[i], b = x[i + 1];
  y[i] = expf(a) + exp2f(a) + exp10f(a) + expm1f(a) + logf(a) + log2f(a) + log10f(a) + log1pf(a)
       + sinf(a) + cosf(a) + tanf(a) + sinpif(a) + cospif(a) + asinf(a) + acosf(a) + atanf(a) + atan2f(a, b)
       + sinhf(a) + coshf(a) + tanhf(a) + asinhf(a) + acoshf(a) + atanhf(a) + powf(a, b) + sqrtf(a) + rsqrtf(a)
       + cbrtf(a) + rcbrtf(a) + hypotf(a, b) + erff(a) + erfcf(a) + erfinvf(a) + normcdff(a) + lgammaf(a)
       + tgammaf(a) + fmodf(a, b) + remainderf(a, b) + 1.f / a + a / b;
  d[i] = exp(d[i]) + exp2(d[i + 1]) + log(d[i + 2]) + sin(d[i + 3]) + tanh(d[i + 4]) + sqrt(d[i + 5])
       + rsqrt(d[i + 6]) + pow(d[i + 7], d[i + 8]) + 1.0 / d[i + 9] + d[i + 10] / d[i + 11]
       + round(d[i + 12]) + (double)lround(d[i + 13]) + (double)llround(d[i + 14]) + hypot(d[i + 15], d[i + 16])
       + sinpi(d[i + 17]) + cospi(d[i + 18]) + asin(d[i + 19]) + acos(d[i + 20]) + acosh(d[i + 21])
       + asinh(d[i + 22]) + atanh(d[i + 23]) + cbrt(d[i + 24]) + erf(d[i + 25]) + expm1(d[i + 26])
       + log1p(d[i + 27]) + atan2(d[i + 28], d[i + 29]) + fmod(d[i + 30], d[i + 31]);
}
"""


def library_opcodes(ptx: str) -> frozenset:
    """The fast_math-class opcodes of the probe's PTX (its compiler code, not inline asm). The
    accurate `expf` reduces its argument with `fma.rm.f32` and `add.rz.f32`, so those are waived
    too: a variant's own `__fadd_rz` is refused by its name in the preprocessed source."""
    return frozenset(op for op in analyze(ptx)["code"] if classify(op) == "fast_math")
