"""Rendering of kernel templates: sandboxed Jinja with StrictUndefined.

The sandbox keeps a template from reaching Python attributes and globals;
StrictUndefined turns a misspelt variable into an error instead of an empty
string. `template_variables` lists what a template reads, so the spec loader
can check it against the search space, the shape symbols and the dtype.

Templates share parts (CUDA helpers) through `{% include "NAME" %}` lines, NAME
relative to the including file's folder. The spec loader flattens them
(`flatten`): every include line is replaced by the file's text, recursively,
and the flat text is what is rendered, hashed into the spec and the source
digests, checked for variables and shown to agents. An edit to a shared part
is an edit to every template that includes it, for the caches and `--reuse`
alike. Errors name the file and line the text came from (`locate`).
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

import jinja2
from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..core.errors import ExprError, PipeError

# Values the runner provides to every template besides parameters and shape symbols.
DTYPE_VARS = ("dtype", "ctype")

CTYPES = {
    "cpu": {"fp32": "float", "fp64": "double", "bf16": "uint16_t", "fp16": "uint16_t",
            "int8": "int8_t", "uint8": "uint8_t", "int32": "int32_t", "int64": "int64_t",
            "bool": "bool"},
    "cuda": {"fp32": "float", "fp64": "double", "bf16": "__nv_bfloat16", "fp16": "__half",
             "int8": "int8_t", "uint8": "uint8_t", "int32": "int", "int64": "long long",
             "bool": "bool"},
}


class RenderError(PipeError):
    pass


def _env() -> ImmutableSandboxedEnvironment:
    return ImmutableSandboxedEnvironment(
        undefined=jinja2.StrictUndefined, autoescape=False,
        keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


_ENV = _env()


@lru_cache(maxsize=64)
def _compiled(text: str) -> jinja2.Template:
    return _ENV.from_string(text)


def template_variables(text: str) -> set[str]:
    """Undeclared variables the template reads; raises jinja2.TemplateSyntaxError."""
    return set(meta.find_undeclared_variables(_ENV.parse(text)))


def read_symbols(used: set[str], symbols: list[str], derive) -> dict[str, list[str]]:
    """Shape symbols a template reads (`used`: its variables), directly or through the derived
    values it reads (`derive`: (name, Expr) pairs): symbol -> the chain of names that reaches
    it from the template. Those sizes are compiled into the kernel; the others may vary at
    run time under one binary."""
    derive = dict(derive)
    via: dict[str, list[str]] = {}
    stack = [(n, [n]) for n in sorted(used) if n in derive or n in symbols]
    seen: set[str] = set()
    while stack:
        n, chain = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in symbols:
            via.setdefault(n, chain)
        if n in derive:
            stack.extend((x, chain + [x]) for x in sorted(derive[n].names) if x not in seen)
    return {s: via[s] for s in symbols if s in via}


# Jinja's statement tags: `{%` followed by anything else is not Jinja (inline PTX's `{%0, %1}`).
JINJA_TAGS = {"if", "elif", "else", "endif", "for", "endfor", "set", "endset", "macro", "endmacro", "call",
              "endcall", "filter", "endfilter", "raw", "endraw", "block", "endblock", "extends", "include",
              "import", "from", "with", "endwith", "autoescape", "endautoescape", "do", "break", "continue",
              "trans", "endtrans", "pluralize"}
_PTX_OPEN = re.compile(r"\{%-?\+?\s*([A-Za-z_]\w*)?")


def syntax_hint(text: str, lineno: int) -> str | None:
    """For a template syntax error at `lineno`: a hint when that line holds `{%` followed by
    something that is no Jinja tag, as inline PTX's operand lists (`{%0, %1}`) do."""
    lines = text.splitlines()
    if not 1 <= lineno <= len(lines):
        return None
    for m in _PTX_OPEN.finditer(lines[lineno - 1]):
        if m.group(1) not in JINJA_TAGS:
            what = re.match(r"\{%[-+]?\s*\w*", lines[lineno - 1][m.start():]).group(0)
            return (f"inline PTX operands `{what}` read as a Jinja tag `{{%`: write `{{ %0` (a space after "
                    "the brace) or wrap the asm in {% raw %}...{% endraw %}")
    return None


def variable_position(text: str, name: str) -> tuple[int, int]:
    """(line, column), 1-based, where a name first appears inside a Jinja expression or statement."""
    rx = re.compile(r"\b" + re.escape(name) + r"\b")
    for m in re.finditer(r"\{\{.*?\}\}|\{%.*?%\}", text, re.S):
        hit = rx.search(m.group(0))
        if hit:
            at = m.start() + hit.start()
            return text.count("\n", 0, at) + 1, at - (text.rfind("\n", 0, at) + 1) + 1
    return 1, 1


def variable_line(text: str, name: str) -> int:
    """First line where a name appears inside a Jinja expression or statement."""
    return variable_position(text, name)[0]


class Segment(NamedTuple):
    """Lines of a flat template from one file: flat line `start` on is `path`'s line `line` on."""
    start: int
    path: str
    line: int


_INCLUDE_LINE = re.compile(r"^[ \t]*\{%-?\s*include\s+([\"'])([^\"']+)\1\s*-?%\}[ \t]*(?:\n|$)", re.M)
# a tag that reads another template file at render time
FILE_TAG = re.compile(r"\{%-?\s*(include|import|from|extends)\b")
_COMMENT = re.compile(r"\{#.*?#\}", re.S)


def flatten(path: Path, shown: Callable[[Path], str] = str, _stack: tuple = ()) -> tuple[str, list[Segment]]:
    """(the template at `path` with its include lines replaced by the included files' text,
    where each flat line came from). RenderError, naming file:line, for a missing file, a
    cycle, or an include, import, from or extends tag that is not a whole `{% include "NAME" %}`
    line (those would read files at render time, past the digest)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes().count(b"\n", 0, e.start) + 1
        raise RenderError(f"{shown(path)}:{line}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                          f"{e.start}); save the template as UTF-8") from None
    except OSError as e:
        raise RenderError(f"{shown(path)}: cannot read ({e.strerror})") from None
    comments = [c.span() for c in _COMMENT.finditer(text)]  # Jinja comments render to nothing

    def commented(i: int) -> bool:
        return any(a <= i < b for a, b in comments)

    out: list[str] = []
    segs: list[Segment] = []
    at, flat_line = 0, 1
    for m in _INCLUDE_LINE.finditer(text):
        if commented(m.start(2)):
            continue
        before = text[at:m.start()]
        segs.append(Segment(flat_line, shown(path), text.count("\n", 0, at) + 1))
        out.append(before)
        flat_line += before.count("\n")
        line = text.count("\n", 0, m.start()) + 1
        child = (path.parent / m.group(2))
        if not child.is_file():
            raise RenderError(f"{shown(path)}:{line}: include '{m.group(2)}': no file {shown(child)}")
        if child.resolve() in _stack or child.resolve() == path.resolve():
            raise RenderError(f"{shown(path)}:{line}: include '{m.group(2)}' includes itself (a cycle)")
        ctext, csegs = flatten(child, shown, _stack + (path.resolve(),))
        if ctext and not ctext.endswith("\n"):
            ctext += "\n"
        segs.extend(Segment(flat_line + c.start - 1, c.path, c.line) for c in csegs)
        out.append(ctext)
        flat_line += ctext.count("\n")
        at = m.end()
    segs.append(Segment(flat_line, shown(path), text.count("\n", 0, at) + 1))
    out.append(text[at:])
    flat = "".join(out)
    for bad in FILE_TAG.finditer(text):
        if commented(bad.start()):
            continue
        if not _INCLUDE_LINE.match(text, text.rfind("\n", 0, bad.start()) + 1):
            line = text.count("\n", 0, bad.start()) + 1
            raise RenderError(f"{shown(path)}:{line}: '{{% {bad.group(1)}' is allowed only as a whole line "
                              "{% include \"NAME\" %} (NAME relative to this file's folder)")
    return flat, segs


def locate(segments, line: int) -> tuple[str, int] | None:
    """(file, line) of flat line `line`, or None without segments."""
    seg = None
    for s_ in segments or ():
        if s_.start <= line:
            seg = s_
        else:
            break
    return (seg.path, seg.line + line - seg.start) if seg else None


_EXPR = re.compile(r"\{\{.*?\}\}", re.S)
_TAG = re.compile(r"\{%.*?%\}", re.S)
# where a compiler names a line of the rendered source: g++ `kernel.cpp:44:1:`, NVRTC `entry.cu(44):`,
# and the source rules `... at line 44` (not `at line 44 after the preprocessor`: another text's line)
_COMPILER_LINE = re.compile(r"\bkernel\.cpp:(\d+):|\b\w+\.cu\((\d+)\)|\bat line (\d+)\b(?! after the preprocessor)")


def _line_pattern(tline: str) -> re.Pattern | None:
    """A template line as a pattern of every line it can render to (never fewer): each expression
    any text, and where the line holds tags (an inline `{% if %}A{% else %}B{% endif %}`), each
    piece of text between them optional, and the tags nothing; None for a line with too little
    text of its own to tell (a tag alone, a brace)."""
    tline = _COMMENT.sub("", tline)
    pieces = _TAG.split(tline)
    if sum(ch.isalnum() for piece in pieces for part in _EXPR.split(piece) for ch in part) < 3:
        return None

    def text(piece: str) -> str:  # literal text with its expressions as any text
        return r".*?".join(r"\s*".join(map(re.escape, part.split())) for part in _EXPR.split(piece))

    if len(pieces) == 1:
        body = text(pieces[0])
    else:  # the text before the first tag and after the last may be inside a branch too
        body = r"\s*".join(f"(?:{text(piece)})?" for piece in pieces if piece.strip())
    return re.compile(r"\s*" + body + r"\s*")


def source_line(template: str, rendered: str, line: int, segments=None, name: str = "template") -> str | None:
    """`file:line` of the template line that rendered line `line` of `rendered` came from, where
    exactly one template line can have rendered to its text (render.locate names the file of an
    include); None where none or several can (a compiler's line is then the rendered source's
    alone: `pipe render` shows it)."""
    lines = rendered.splitlines()
    if not 1 <= line <= len(lines) or not lines[line - 1].strip():
        return None
    text = lines[line - 1]
    found = [i for i, t in enumerate(template.splitlines(), 1) if (pat := _line_pattern(t)) and pat.fullmatch(text)]
    if len(found) != 1:
        return None
    where = locate(segments, found[0])
    return f"{where[0]}:{where[1]}" if where else f"{name}:{found[0]}"


def compiler_source_line(reason: str, template: str, rendered: str, segments=None, name: str = "template") -> str:
    """A compiler's message about a rendered source, with the template line it names where one
    alone can have rendered that line (source_line): `... [the template's file:line]`."""
    m = _COMPILER_LINE.search(reason or "")
    if not m:
        return reason
    where = source_line(template, rendered, int(m.group(1) or m.group(2) or m.group(3)), segments, name)
    return f"{reason} [template {where}]" if where else reason


def _template_line(e: BaseException) -> int | None:
    """The template line an error was raised at while rendering: Jinja rewrites the
    traceback so that a template's frames carry the file name '<template>' and its line."""
    tb, line = e.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def render(text: str, context: Mapping[str, Any], name: str = "template", segments=None) -> str:
    try:
        return _compiled(text).render(**context)
    except Exception as e:  # Jinja's errors, a sandbox violation, an error raised inside an expression
        line = getattr(e, "lineno", None) or _template_line(e)
        found = locate(segments, line) if line else None
        where = f"{found[0]}:{found[1]}" if found else f"{name}:{line}" if line else name
        hint = syntax_hint(text, line) if isinstance(e, jinja2.TemplateSyntaxError) and line else None
        raise RenderError(f"{where}: {type(e).__name__}: {e}" + (f"; {hint}" if hint else "")) from None


SHAPE_GROUPS = (("shapes", "op.shapes"), ("extra", "op.extra_shapes"), ("held", "op.held_out_shapes"))


def pick_shape(op, choice: str) -> tuple[str, dict]:
    """`pipe render --shape`: `I` or `shapes:I` is op.shapes[I], `extra:I` op.extra_shapes[I],
    `held:I` op.held_out_shapes[I]. Returns (label, shape); RenderError lists the valid choices."""
    groups = {"shapes": op.shapes, "extra": op.extra_shapes, "held": op.held_out_shapes}
    valid = [f"{g}:0..{len(groups[g]) - 1}" if len(groups[g]) > 1 else f"{g}:0"
             for g, _ in SHAPE_GROUPS if groups[g]]
    kind, colon, index = str(choice).strip().rpartition(":")
    kind = kind if colon else "shapes"
    listing = f"valid choices: {', '.join(valid)} (a bare index is op.shapes)"
    if kind not in groups or not index.lstrip("-").isdigit():
        raise RenderError(f"--shape {choice}: expected I, shapes:I, extra:I or held:I; {listing}")
    i = int(index)
    if not 0 <= i < len(groups[kind]):
        name = dict(SHAPE_GROUPS)[kind]
        raise RenderError(f"--shape {choice}: {name} has " + (f"{len(groups[kind])} shapes" if groups[kind]
                                                               else "no shapes") + f"; {listing}")
    shape = dict(groups[kind][i])
    return f"{dict(SHAPE_GROUPS)[kind]}[{i}] ({', '.join(f'{k}={v}' for k, v in shape.items())})", shape


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


VARIANT = "render"  # the id `pipe render --variant` gives its variant in a Builder


def render_shape(spec, params: dict, choice: str, variant: str | None = None) -> tuple[str, str]:
    """`pipe render`: (label, source) of the spec's template at `params` for the shape
    `choice` names (pick_shape), or of `variant` (a template variant's text) as a trial renders
    it. RenderError, or ExprError from a derived value."""
    label, shape = pick_shape(spec.op, choice)
    if variant is not None:
        from .builder import Builder

        b = Builder(spec)
        b.variants[VARIANT] = variant
        return label, b.render_all(params, VARIANT, [shape])[0]
    ctx = {**params, **shape, **spec.kernel.derived({**shape, **params}), "dtype": spec.op.dtype,
           "ctype": CTYPES[spec.kernel.backend][spec.op.dtype]}
    return label, render(spec.kernel.template, ctx, Path(spec.kernel.template_path).name,
                         spec.kernel.template_segments)


def compile_check(spec, source: str, label: str, params: dict, shape: dict,
                  variant: str | None = None) -> tuple[bool, str]:
    """`pipe render --compile`: what a trial's build makes of one rendered source (at `params`
    and `shape`), without a GPU: the spec's parameter rules, its forbidden actions, the backend's
    own compiler (g++ for cpu, NVRTC for cuda) and the limits a trial is pruned by (register
    spills where forbidden, shared memory, the launch's sizes). With `variant` (the text the
    source was rendered from), the source is judged as a variant's trial is: its preprocessed
    source and compiled code against the approved template's build at the same parameters and
    shape. Returns (it would build, a message: the reason, with the template's line where one
    alone made the compiler's)."""
    from . import backends, forbid
    from .builder import Builder

    k = spec.kernel
    try:
        tool = backends.get(k.backend).toolchain()
    except Exception as e:  # no compiler here
        tool = f"unavailable ({type(e).__name__})"
    what = f"{Path(k.template_path).name} for {label}"
    rule = forbid.check_params(params, spec.forbidden.rules, spec.op.all_shapes)
    if rule:
        return False, f"forbidden: {what}: {rule}"
    builder = Builder(spec)
    approved = None
    if variant is not None:
        try:  # the approved template at the same parameters and shape: the build a variant is held to
            approved = builder.render_all(params, None, [shape])
        except (RenderError, ExprError):
            approved = None
        what = f"the variant of {Path(k.template_path).name} for {label}"
    b = builder.build([source], builder.geometry(params, [shape]), approved)
    if b.status != "ok":
        log = (b.log or "").strip()
        why = b.reason.removeprefix("shape 0: ")  # (the builder's one shape: the label names it)
        if variant is None:
            why = compiler_source_line(why, k.template, source, k.template_segments, Path(k.template_path).name)
        else:
            why = compiler_source_line(why, variant, source, None, "variant")
        return False, f"{b.status}: {what} with {k.backend} ({tool}): {why}" + (f"\n{log[-4000:]}" if log else "")
    res = b.resources[source] if b.resources else None
    res = f"; {', '.join(f'{n} {v}' for n, v in res.items())}" if res else ""
    return True, f"compiles: {what} with {k.backend} ({tool}), within the profile's limits{res}"
