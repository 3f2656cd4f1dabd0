"""Rendering of kernel templates: sandboxed Jinja with StrictUndefined.

The sandbox keeps a template from reaching Python attributes and globals;
StrictUndefined turns a misspelt variable into an error instead of an empty
string. `template_variables` lists what a template reads, so the spec loader
can check it against the search space, the shape symbols and the dtype.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import jinja2
from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..core.errors import PipeError

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


def variable_line(text: str, name: str) -> int:
    """First line where a name appears inside a Jinja expression or statement."""
    rx = re.compile(r"\b" + re.escape(name) + r"\b")
    for m in re.finditer(r"\{\{.*?\}\}|\{%.*?%\}", text, re.S):
        hit = rx.search(m.group(0))
        if hit:
            return text.count("\n", 0, m.start() + hit.start()) + 1
    return 1


def render(text: str, context: Mapping[str, Any], name: str = "template") -> str:
    try:
        return _compiled(text).render(**context)
    except jinja2.TemplateError as e:
        line = getattr(e, "lineno", None)
        where = f"{name}:{line}" if line else name
        hint = syntax_hint(text, line) if isinstance(e, jinja2.TemplateSyntaxError) and line else None
        raise RenderError(f"{where}: {type(e).__name__}: {e}" + (f"; {hint}" if hint else "")) from None
    except Exception as e:  # a sandbox violation or an error raised inside a filter
        raise RenderError(f"{name}: {type(e).__name__}: {e}") from None


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


def render_shape(spec, params: dict, choice: str) -> tuple[str, str]:
    """`pipe render`: (label, source) of the spec's template at `params` for the shape
    `choice` names (pick_shape). RenderError, or ExprError from a derived value."""
    label, shape = pick_shape(spec.op, choice)
    ctx = {**params, **shape, **spec.kernel.derived({**shape, **params}), "dtype": spec.op.dtype,
           "ctype": CTYPES[spec.kernel.backend][spec.op.dtype]}
    return label, render(spec.kernel.template, ctx, Path(spec.kernel.template_path).name)


def compile_check(spec, source: str, label: str) -> tuple[bool, str]:
    """`pipe render --compile`: the spec's forbidden actions, then the backend's own compiler
    (g++ for cpu, NVRTC for cuda; neither needs a GPU) on one rendered source. Returns
    (compiled, a message: the compiler's diagnostics when it did not)."""
    from . import backends, forbid

    k = spec.kernel
    be = backends.get(k.backend)
    try:
        tool = be.toolchain()
    except Exception as e:  # no compiler here
        tool = f"unavailable ({type(e).__name__})"
    what = f"{Path(k.template_path).name} for {label}"
    bad = forbid.check_source(source, k.options, k.backend, spec.forbidden.named, spec.forbidden.patterns)
    if bad:
        return False, f"forbidden: {what}: {bad}"
    c = be.compile(source, k.entry, k.options, spec.hw)
    if not c.ok:
        log = (c.log or "").strip()
        return False, f"{c.status}: {what} with {k.backend} ({tool}): {c.reason}" + (f"\n{log[-4000:]}" if log else "")
    res = f"; {', '.join(f'{n} {v}' for n, v in c.resources.items())}" if c.resources else ""
    return True, f"compiles: {what} with {k.backend} ({tool}){' (cached)' if c.cached else ''}{res}"
