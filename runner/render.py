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
from typing import Any, Mapping

import jinja2
from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import PipeError

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
        raise RenderError(f"{where}: {type(e).__name__}: {e}") from None
    except Exception as e:  # a sandbox violation or an error raised inside a filter
        raise RenderError(f"{name}: {type(e).__name__}: {e}") from None


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]
