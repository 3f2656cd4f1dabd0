"""Forbidden actions: checked on the parameters, the rendered source and the
compile options before anything runs.

A spec's `forbidden` list holds three kinds of entries:
- a named action (below): source patterns and compile options per backend,
  plus runtime rules that the judge enforces (documented in `judge_enforced`);
- `{pattern: REGEX, reason: ...}`: a custom source pattern;
- `{rule: EXPR, reason: ...}`: a safe expression over the parameters that
  must be false.
Comments are stripped before patterns are matched, so prose about cuBLAS in a
comment is harmless while a call is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..core.expr import Expr

_FAST_MATH_OPTS = (r"^-ffast-math$", r"^-Ofast$", r"^-funsafe-math-optimizations$",
                   r"^-fassociative-math$", r"^-freciprocal-math$", r"^-ffinite-math-only$",
                   r"^--?use_fast_math$", r"^--?ftz=true$", r"^--?prec-div=false$",
                   r"^--?prec-sqrt=false$", r"^--?fmad=true$")


@dataclass(frozen=True)
class Named:
    description: str
    source: Mapping[str, tuple[str, ...]]  # backend -> regexes over the comment-free source
    options: tuple[str, ...] = ()  # regexes over each compile option
    judge_enforced: str = ""  # what the judge checks at run time for this action


NAMED: dict[str, Named] = {
    "fast_math": Named(
        "approximate math: fast-math flags, optimize pragmas, CUDA's intrinsic approximations, "
        "flush-to-zero set at run time",
        # GCC's per-function options in any spelling: the pragmas (also through _Pragma, which the
        # preprocessor turns into #pragma), and optimize/target wherever they stand. The word
        # `optimize` (or `target_clones`) anywhere, string literals included, and `target("...")`:
        # not only inside an attribute list as the list's own brackets delimit it (session 30's
        # second red team closed a `[[...]]` early with a "]" in a string before gnu::optimize)
        {"cpu": (r"#\s*pragma\s+GCC\s+(optimize|push_options|pop_options|reset_options|target)\b",
                 r"\b_Pragma\s*\(\s*(u8|u|U|L)?R?\"[^\n]*?\b(optimize|push_options|target)\b",
                 r"\b_*(optimize|target_clones|push_options)_*\b",
                 r"\b_*target_*\s*\(\s*(u8|u|U|L)?R?\"",
                 r"#\s*pragma\s+(clang\s+)?fp\s+",
                 # the run-time half: flush-to-zero and denormals-are-zero (or the rounding mode)
                 # set in MXCSR from immintrin.h (session 35's red team: it passed the rules)
                 r"\b_mm_setcsr\b", r"\b_MM_SET_(FLUSH_ZERO|DENORMALS_ZERO|ROUNDING)_MODE\b",
                 # ... and the state restores that load MXCSR and the x87 control word whole
                 # (session 35's second red team set flush-to-zero through _fxrstor64)
                 r"\b_(fx|x)rstors?(64)?\b"),
         "cuda": (r"\b__(expf|exp10f|logf|log2f|log10f|powf|sinf|cosf|tanf|sincosf|fdividef|tanhf)\b",
                  r"\b__nv_fast_\w+", r"\b__nvvm_\w*(approx|ftz)\w*", r"#\s*pragma\s+nv_fast_math",
                  r"\b__(USE_FAST_MATH|FAST_MATH|FTZ)__\b", r"\basm\b[^;]*\.approx",
                  # float arithmetic rounded toward zero or an infinity (`__fmul_rz`, `__fmaf_rd`)
                  r"\b__(fadd|fsub|fmul|fmaf?|fdiv|frcp|fsqrt|dadd|dsub|dmul|ddiv|drcp|dsqrt)\w*_r[zdu]\b",
                  # (NVVM's builtins: `__nvvm_add_rz_f`, `__nvvm_fma_rm_f`)
                  r"\b__nvvm_(?![fd]2u?(i|ll)_)\w*_r[zmp](_\w+)?\b")},
        _FAST_MATH_OPTS),
    "lower_precision": Named(
        "arithmetic in a narrower type than the op's declared math (half/bf16 math, TF32)",
        {"cpu": (r"\b_Float16\b", r"\b__bf16\b"),
         "cuda": (r"\b__h(add|sub|mul|fma|div|max|min)2?(_rn|_sat|_relu)?\s*\(", r"\bh2?(exp|log|sqrt|rsqrt|rcp)2?\s*\(",
                  r"\bwmma::precision::tf32\b", r"\.tf32\b", r"\b__nvvm_\w*(f16|bf16|tf32)\w*",
                  # a float rounded to a half type other than to nearest (`__float2bfloat16_rz`)
                  r"\b__\w*2(bfloat16|half)2?\w*_r[zdu]\b")},
        judge_enforced="TF32 and reduced-precision reductions are switched off and checked after each trial"),
    "library_calls": Named(
        "calling a library (BLAS, cuDNN, CUTLASS, torch) or the system instead of the kernel's own code",
        {"cpu": (r"\bcblas_", r"\bmkl_", r"\bdlopen\s*\(", r"\bdlsym\s*\(", r"\bsystem\s*\(", r"\bpopen\s*\(",
                 r"\bexec[lv]p?e?\s*\(", r"#\s*include\s*[<\"](cblas|mkl|torch|ATen|dlfcn)"),
         # the library's namespace in use, through an alias too (`namespace th = thrust;`), and
         # anywhere in an include's path (`<cuda/../thrust/reduce.h>`: session 44's red team)
         "cuda": (r"\bcublas", r"\bcudnn", r"\b(cutlass|cute|thrust)\s*::",
                  r"\bnamespace\s+\w+\s*=\s*(::\s*)?(cutlass|cute|thrust)\b",
                  r"\busing\s+namespace\s+(::\s*)?(cutlass|cute|thrust)\b", r"\bcub::Device",
                  r"#\s*include\s*[<\"][^>\"\n]*(?<![\w.])(cublas|cudnn|cutlass|cute|thrust|torch|ATen)(?!\w)")}),
    "side_streams": Named(
        "work on another stream or left running after the call returns",
        {"cpu": (r"\.detach\s*\(", r"\bstd::async\b", r"\bpthread_detach\b"),
         "cuda": (r"\bcudaStream(Create|BeginCapture)", r"\bcudaLaunch", r"\bcudaGraph", r"<<<",
                  r"\bcudaMemcpy\w*Async")},
        judge_enforced="a device-wide synchronize before the end event; event time checked against wall time"),
    "host_sync": Named(
        "synchronizing with the host from kernel code",
        {"cpu": (), "cuda": (r"\bcuda(Device|Stream|Event)Synchronize\b",)}),
    "disable_cuda_graphs": Named(
        "running outside the spec's runtime mode (CUDA graph replay)",
        {"cpu": (), "cuda": (r"\bcudaStream(IsCapturing|GetCaptureInfo)", r"\bcudaThreadExchangeStreamCaptureMode")},
        judge_enforced="the runtime mode is set by the runner from the spec, never by a candidate"),
    "shrink_workload": Named(
        "doing less than the whole workload (fewer rows, shorter rows, tuned shapes only)",
        {"cpu": (), "cuda": ()},
        judge_enforced="the runner makes the inputs for every spec shape plus extra shapes and checks every output element"),
    "spills": Named(
        "register spills to local memory",
        {"cpu": (), "cuda": ()},
        judge_enforced="configurations whose compile report shows spill stores are pruned"),
}


@dataclass(frozen=True)
class Pattern:
    regex: str
    reason: str


@dataclass(frozen=True)
class Rule:
    expr: Expr
    reason: str


@dataclass(frozen=True)
class Violation:
    rule: str
    reason: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.reason}"


# One pass over C/C++ text: string and character literals are kept whole (a "//" or
# "/*" inside one starts no comment), comments are replaced by their newlines. Raw string
# literals (`R"d( ... )d"`, any prefix) first: read as plain strings, a raw string holding a
# quote then "/*" hid the code after it from every source rule as a comment (session 30's
# second red team hid inline asm and a bare syscall so).
_RAW = r'(?<![\w$])(?:u8|u|U|L)?R"([^()\\\s"]{0,16})\((?:.*?)\)\1"'
_TOKENS = re.compile(_RAW + r'|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?(?:\*/|\Z)', re.S)
_RAW_START = re.compile(r'(?:u8|u|U|L)?R"')


_TRIGRAPHS = {"??=": "#", "??/": "\\", "??'": "^", "??(": "[", "??)": "]", "??!": "|", "??<": "{", "??>": "}",
              "??-": "~"}
_DIGRAPHS = (("%:%:", "##"), ("%:", "#"), ("<:", "["), (":>", "]"), ("<%", "{"), ("%>", "}"))


# a pp-number (C++14): a digit, optionally after a dot, then digits, letters, dots, exponent signs
# and digit separators (`1'000`); a separator read as a quote opened a "character literal" that hid
# the code after it from every rule (session 44's second red team)
_PP_NUMBER = re.compile(r"(?<![\w.'])\.?\d(?:[\w.]|'(?=\w)|[eEpP][+-])*")
_OLD_STD = re.compile(r"^--?std=(?:c|gnu)\+\+(?:98|03|0x|11|1y|14)$")


def trigraphs(options: Sequence[str]) -> bool:
    """Whether the compiler replaces trigraphs: in C++14 and before (`-std=c++14`); C++17, the
    default of both backends, has none (`??/` is three characters there, not a backslash)."""
    return any(_OLD_STD.match(o) for o in options)


def normalize(source: str, with_trigraphs: bool = False) -> str:
    """What the compiler sees before it reads tokens: digit separators dropped from numbers,
    trigraphs (where the standard has them) and digraphs spelled out, backslash-newline splices
    joined (line count kept, so reported lines stay right)."""
    source = _PP_NUMBER.sub(lambda m: m.group(0).replace("'", ""), source)
    for k, v in _TRIGRAPHS.items() if with_trigraphs else ():
        source = source.replace(k, v)
    for k, v in _DIGRAPHS:
        source = source.replace(k, v)
    lines = re.split(r"\r?\n", source)
    out, pending = [], 0
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        if line.endswith("\\") and not last:
            out.append(line[:-1])
            pending += 1
            continue
        out.append(line + "\n" * pending + ("" if last else "\n"))
        pending = 0
    return "".join(out)


def strip_comments(source: str, with_trigraphs: bool = False) -> str:
    def repl(m: re.Match) -> str:
        t = m.group(0)
        return t if t[0] in "\"'" or _RAW_START.match(t) else "\n" * t.count("\n")
    return _TOKENS.sub(repl, normalize(source, with_trigraphs))


def check_params(params: Mapping[str, Any], rules: Sequence[Rule],
                 shapes: Sequence[Mapping[str, Any]]) -> Violation | None:
    """A rule holds if it is true for any shape the candidate would run on."""
    for r in rules:
        for shape in shapes:
            if r.expr({**shape, **params}):
                return Violation(f"rule '{r.expr.text}'", r.reason)
    return None


def check_source(source: str, options: Sequence[str], backend: str, named: Sequence[str],
                 patterns: Sequence[Pattern]) -> Violation | None:
    code = strip_comments(source, trigraphs(options))
    if named:
        m = re.search(r"##", code)
        if m:
            line = code.count("\n", 0, m.start()) + 1
            return Violation("token_pasting", f"token pasting (##) at line {line} can build names the "
                                              "forbidden-action rules cannot see; it is refused while any is on")
    v = _check_code(code, backend, named, patterns, "")
    if v is not None and not v.rule.startswith("pattern "):
        return v
    for name in named:
        n = NAMED[name]
        for opt in options:
            for rx in n.options:
                if re.search(rx, opt):
                    return Violation(name, f"{n.description}: compile option '{opt}'")
    return v


def _check_code(code: str, backend: str, named: Sequence[str], patterns: Sequence[Pattern],
                where: str) -> Violation | None:
    """The named actions' source patterns, each inline-asm instruction, then the custom
    patterns, over comment-free code (`where` tells the reason which text it was)."""
    for name in named:
        n = NAMED[name]
        for rx in n.source.get(backend, ()):
            m = re.search(rx, code)
            if m:
                line = code.count("\n", 0, m.start()) + 1
                return Violation(name, f"{n.description}: '{m.group(0).strip()}' at line {line}{where}")
    if backend == "cuda" and named:
        from . import ptx

        for line, text in asm_strings(code):
            # the compiler's marks around inline asm are comments in the PTX: a string that writes
            # one moves its own instructions out of the inline asm the PTX counts judge strictly
            # (session 38's second red team: into the accurate math library's waiver)
            if re.search(r"//[^\n]*inline\s+asm", text):
                return Violation("unreadable_asm", f"inline asm at line {line}{where} writes the compiler's own "
                                                   "`// begin inline asm` / `// end inline asm` marks: refused")
            for st in ptx.statements(text):
                op = ptx.opcode(st)
                action = ptx.classify(op) if op else None
                if action in named:
                    return Violation(action, f"{NAMED[action].description}: inline asm instruction '{st}' "
                                             f"at line {line}{where}")
    for p in patterns:
        m = re.search(p.regex, code)
        if m:
            line = code.count("\n", 0, m.start()) + 1
            return Violation(f"pattern '{p.regex}'", f"{p.reason} ('{m.group(0).strip()}' at line {line}{where})")
    return None


# ---------------------------------------------------------------- inline asm and the preprocessor

_ASM = re.compile(r"\b(?:asm|__asm__|__asm)\b(?:\s*(?:volatile|__volatile__|inline|goto)\b)*\s*\(")
_STRING = re.compile(r'\s*(?:u8|u|U|L)?(?:R"([^()\\\s]{0,16})\((.*?)\)\1"|"((?:\\.|[^"\\\n])*)")', re.S)
_ESC = {"n": "\n", "t": "\t", "r": "\n", "\\": "\\", '"': '"', "'": "'", "0": ""}


def _unescape(s: str) -> str:
    """A string literal's text as the compiler reads it: simple escapes, and hexadecimal,
    octal and universal-character ones (`"ex2\\x2eapprox"` is `ex2.approx`: read as `x2e`,
    the dot escaped past every rule, session 38's second red team)."""
    def one(m):
        e = m.group(1)
        if e[0] in "xuU":
            return chr(int(e[1:], 16)) if len(e) > 1 else e
        if e[0] in "01234567":
            return chr(int(e, 8))
        return _ESC.get(e, e)
    return re.sub(r"\\(x[0-9A-Fa-f]+|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|[0-7]{1,3}|.)", one, s)


def asm_strings(code: str) -> list[tuple[int, str]]:
    """(line, text) of every inline-asm statement's template: its adjacent string literals
    (raw strings and prefixes included) joined, escapes read as the compiler reads them."""
    out = []
    for m in _ASM.finditer(code):
        pos, parts = m.end(), []
        while True:
            sm = _STRING.match(code, pos)
            if not sm:
                break
            parts.append(sm.group(2) if sm.group(2) is not None else _unescape(sm.group(3)))
            pos = sm.end()
        out.append((code.count("\n", 0, m.start()) + 1, "".join(parts)))
    return out


def nvrtc_macros(arch: str, nvrtc: str = "") -> dict[str, str]:
    """The macros NVRTC defines that a source may test (#ifdef __CUDACC__ ...): the
    preprocessor takes the branches the compiler takes."""
    m = re.search(r"(\d+)", arch or "sm_90")
    cc = f"{m.group(1)}0" if m else "900"
    # the ones NVRTC 13 defines (each checked with #ifdef against NVRTC; values as with the
    # default options, since the fast-math options are forbidden)
    out = {"__CUDACC__": "1", "__CUDACC_RTC__": "1", "__CUDA_ARCH__": cc, "__CUDA_ARCH_LIST__": cc,
           "__cplusplus": "201703L", "__CUDA_ARCH_HAS_FEATURE__(x)": "1", "__NVCC_DIAG_PRAGMA_SUPPORT__": "1",
           "__USE_FAST_MATH__": "0", "__CUDA_FTZ": "0", "__CUDA_PREC_DIV": "1", "__CUDA_PREC_SQRT": "1",
           "__CUDACC_DEVICE_ATOMIC_BUILTINS__": "1", "__LP64__": "1", "__EDG__": "1"}
    if arch and arch.endswith("a") and m:
        out[f"__CUDA_ARCH_FEAT_SM{m.group(1)}_ALL"] = "1"
        out["__CUDA_ARCH_SPECIFIC__"] = out["__CUDA_ARCH_FAMILY_SPECIFIC__"] = cc
    v = re.search(r"(\d+)\.(\d+)", nvrtc)
    if v:
        out["__CUDACC_VER_MAJOR__"], out["__CUDACC_VER_MINOR__"] = v.group(1), v.group(2)
    return out


class PreprocessError(Exception):
    pass


_CONDITIONAL = re.compile(r"^[ \t]*#[ \t]*(?:if|ifdef|ifndef|elif|elifdef|elifndef|else)\b")
BRANCH_END = "end"


def mark_branches(source: str, tag: str, with_trigraphs: bool = False) -> str:
    """The source with a `#pragma message("pipe-branch:TAG:N")` after the conditional directive
    of line N (after its continuation lines), and one at the end: which of them a preprocessor
    keeps tells which branches it took (`branch_marks`), as NVRTC's log tells the compiler's.
    `tag` is drawn afresh for every check (`secrets`): a source that wrote marks of its own into
    the branches, to make the two sets look alike, cannot know it."""
    code = strip_comments(source, with_trigraphs).split("\n")  # (the lines the directives are found on)
    lines = source.split("\n")
    after: dict[int, int] = {}  # the last physical line of a directive -> its first line
    for i, text in enumerate(code):
        if _CONDITIONAL.match(text):
            j = i
            while j < len(lines) - 1 and lines[j].endswith("\\"):
                j += 1
            after[j] = i + 1
    out = []
    for j, line in enumerate(lines):
        out.append(line)
        if j in after:
            out.append(f'#pragma message("pipe-branch:{tag}:{after[j]}")')
    out.append(f'#pragma message("pipe-branch:{tag}:{BRANCH_END}")')
    return "\n".join(out) + "\n"


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include\b[ \t]*(?:([<"])([^>"\n]*)[>"]|([^\n]*))', re.M)


def odd_layout(source: str) -> str | None:
    """Why a variant's layout could place a directive where the rules' lexer and the compiler's
    disagree, or None: a form feed, vertical tab or lone carriage return (whitespace to the
    compiler, not to the rules' patterns or to pcpp), or a block comment that opens on a
    directive's line and closes on a later one (`#/*` newline `*/include`: the compiler reads
    one directive, the rules' line-based reading none). Session 44's third red team included a
    header and hid a branch from the branch marks with each."""
    for ch, name in (("\f", "a form feed"), ("\v", "a vertical tab")):
        if ch in source:
            return f"{name} at line {source.count(chr(10), 0, source.index(ch)) + 1}: write plain spaces"
    m = re.search(r"\r(?!\n)", source)
    if m:
        return f"a carriage return alone at line {source.count(chr(10), 0, m.start()) + 1}: end lines with \\n"
    text = normalize(source)
    for m in _TOKENS.finditer(text):
        t = m.group(0)
        if not t.startswith("/*") or "\n" not in t:
            continue
        start = text.rfind("\n", 0, m.start()) + 1
        before = _TOKENS.sub(" ", text[start:m.start()])
        if before.lstrip().startswith("#"):
            line = text.count("\n", 0, m.start()) + 1
            return (f"a block comment opens on the directive of line {line} and closes on a later line: "
                    "close it on the same line, or put it on a line of its own")
    return None


def foreign_include(source: str, approved: str) -> str | None:
    """Why a variant's `#include` reaches a file outside the toolchain's headers, or None: a
    quoted, absolute or `..` path that the approved template's source does not include itself.
    The file is no part of the variant's text: the judge's preprocessor would read it while the
    compiler reads its own copy, its conditionals unchecked (mark_branches marks the source's),
    and the artifact's key would not change with it."""
    mine = strip_comments(source)
    theirs = {m.group(0).strip() for m in _INCLUDE.finditer(strip_comments(approved))}
    for m in _INCLUDE.finditer(mine):
        quote, path = m.group(1) or "", (m.group(2) if m.group(1) else m.group(3)).strip()
        # (an include of a macro names a file nobody reads here: refused too)
        if (quote != "<" or path.startswith("/") or ".." in path.split("/")) and m.group(0).strip() not in theirs:
            line = mine.count("\n", 0, m.start()) + 1
            return (f"#include {quote}{path}{'>' if quote == '<' else quote} at line {line}: a variant includes only "
                    "the toolchain's headers (<name.h>) and those the approved template includes; write the text "
                    "into the variant")
    return None


def branch_marks(text: str, tag: str) -> set[str]:
    """The marks (`mark_branches`, this `tag`) a preprocessed text kept as directives."""
    rx = r'^[ \t]*#[ \t]*pragma[ \t]+message[ \t]*\([ \t]*"pipe-branch:' + re.escape(tag) + r':(\w+)"[ \t]*\)'
    return set(re.findall(rx, text, re.M))


def preprocess(source: str, macros: Mapping[str, str] | None = None, defines: Sequence[str] = ()) -> str:
    """The source with its own macros expanded and its own conditionals taken (pcpp, a C99
    preprocessor in Python): `#include`s are left in place unread (their macros stay
    unexpanded), `macros` (name -> value, NVRTC's) and `defines` (-D options) are defined
    first. Comments are removed. Raises PreprocessError on malformed input. Whether its
    conditionals took the compiler's branches is for the caller to ask (`mark_branches`)."""
    import io

    from pcpp import Preprocessor
    from pcpp.parser import Action, OutputDirective

    errors: list[str] = []

    class _P(Preprocessor):
        def on_error(self, file, line, msg):
            errors.append(f"line {line}: {msg}")

        def on_include_not_found(self, is_malformed, is_system_include, curdir, includepath):
            raise OutputDirective(Action.IgnoreAndPassThrough)

        def on_directive_unknown(self, directive, toks, ifpassthru, precedingtoks):
            if directive.value == "error":
                errors.append(f"line {directive.lineno}: #error")
                return True
            return None

        def on_comment(self, tok):
            return None

    p = _P()
    p.line_directive = None
    p.compress = 0
    for k, v in (macros or {}).items():
        p.define(f"{k} {v}")
    for d in defines:
        k, _, v = d.partition("=")
        p.define(f"{k} {v or '1'}")
    p.parse(normalize(source), "candidate.cu")
    out = io.StringIO()
    try:
        p.write(out)
    except Exception as e:  # pcpp's own failures on input it cannot read
        raise PreprocessError(f"{type(e).__name__}: {e}") from None
    if errors:
        raise PreprocessError("; ".join(errors[:3]))
    return strip_comments(out.getvalue())


def check_names_anywhere(source: str, options: Sequence[str], backend: str, named: Sequence[str]) -> Violation | None:
    """A variant's named-action patterns over its whole text, comments kept: whatever a lexer
    (the rules' own or pcpp's) takes for a comment, a forbidden name written anywhere in the
    text is refused. Session 44's fourth red team hid `__fdividef` in "comments" the compiler
    reads as code, by five disagreements inside literals (a raw string whose delimiter holds a
    quote, digraphs and digit separators inside literals, a character literal with a suffix);
    a variant that names an intrinsic in prose says it another way."""
    return _check_code(normalize(source, trigraphs(options)), backend, named, (),
                       " (in the variant's text, comments included)")


def check_expanded(expanded: str, backend: str, named: Sequence[str],
                   patterns: Sequence[Pattern]) -> Violation | None:
    """The source rules over the preprocessed source (macros expanded, the compiler's
    conditional branches taken): a macro that expands to a forbidden name is caught here."""
    return _check_code(expanded, backend, named, patterns, " after the preprocessor")
