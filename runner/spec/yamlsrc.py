"""YAML with positions, and without the traps.

Flow: yaml.compose (a node graph with marks) → our own conversion to plain
Python values, recording the line and column of every key and value by key
path. Compared with yaml.safe_load this:
- rejects duplicate keys (PyYAML silently keeps the last one);
- reads `1e-3` as a number (YAML 1.1 wants a dot in floats);
- refuses alias expansion past a node budget, so a billion-laughs document
  fails in milliseconds instead of eating memory;
- refuses merge keys (`<<`) and custom tags: a spec is plain data;
- refuses nesting deeper than MAX_DEPTH levels, checked while composing (PyYAML's
  composer recurses once per level) and again while converting (aliases can nest
  one deep structure inside another), so no walk over a loaded document, ours or
  the schema validator's, can run out of stack.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..core.errors import Diagnostic, SpecError

MAX_NODES = 100_000  # values after alias expansion; a real spec has a few hundred
MAX_DEPTH = 100  # levels of nesting; a real spec has under ten

Path = tuple  # tuple[str | int, ...]


class _Loader(yaml.SafeLoader):
    """SafeLoader whose composer stops at MAX_DEPTH levels, before the stack runs out."""

    def __init__(self, stream):
        super().__init__(stream)
        self._path: list = []  # key path of the node being composed

    def compose_node(self, parent, index):
        if parent is None:
            return super().compose_node(parent, index)
        # index: the key node (a mapping's value), the position (a sequence's item), None (a key)
        step = index.value if isinstance(index, yaml.ScalarNode) else index if isinstance(index, int) else "?"
        self._path.append(step)
        try:
            if len(self._path) > MAX_DEPTH:
                raise _TooDeep(self.peek_event().start_mark, tuple(self._path))
            return super().compose_node(parent, index)
        finally:
            self._path.pop()


# YAML 1.2-style floats: 1e-3, 1.0e+6, .5, 3. (PyYAML's 1.1 rule misses 1e-3).
_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:float"]
    for k, v in _Loader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
# YAML 1.2 booleans only: `yes`, `no`, `on`, `off` stay strings (the Norway problem).
_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
    for k, v in _Loader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
# YAML 1.2 integers: 010 is ten (not octal eight), 1:30 is a string (not ninety).
_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:int"]
    for k, v in _Loader.yaml_implicit_resolvers.items()
}
_INT = re.compile(r"^(?:[-+]?[0-9][0-9_]*|0o[0-7_]+|0x[0-9a-fA-F_]+)$")
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))

_COLLECTION_TAGS = {"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"}
_SCALAR_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
}


@dataclass
class Located:
    """A loaded document plus where each key path sits in the file."""

    file: str
    data: Any
    values: dict = field(default_factory=dict)  # path -> (line, col) of the value
    keys: dict = field(default_factory=dict)  # path -> (line, col) of the key

    def pos(self, path: Path, prefer_key: bool = False) -> tuple[int, int]:
        """Best position for a path: walk up until something is known."""
        path = tuple(path)
        while True:
            table = (self.keys, self.values) if prefer_key else (self.values, self.keys)
            for t in table:
                if path in t:
                    return t[path]
            if not path:
                return (1, 1)
            path = path[:-1]

    def diag(self, path: Path, message: str, prefer_key: bool = False) -> Diagnostic:
        line, col = self.pos(path, prefer_key)
        return Diagnostic(self.file, line, col, dotted(path), message)


def dotted(path: Path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _mark(node: yaml.Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def _short(path: Path) -> str:
    """A dotted path, its middle elided when it is long (a path 100 levels deep)."""
    path = tuple(path)
    while path and path[-1] == "?":  # a key being composed: the mapping's path says where
        path = path[:-1]
    if len(path) <= 8:
        return dotted(path)
    head, tail = dotted(path[:5]), dotted(path[-2:])
    sep = "" if isinstance(path[5], int) else "."
    return f"{head}{sep}<{len(path) - 7} more>{'' if isinstance(path[-2], int) else '.'}{tail}"


class _TooDeep(Exception):
    def __init__(self, mark: yaml.Mark, path: Path):
        self.where = (mark.line + 1, mark.column + 1)
        self.path = path


def _too_deep(file: str, e: _TooDeep) -> SpecError:
    return SpecError([Diagnostic(file, *e.where, _short(e.path),
                                 f"nested deeper than {MAX_DEPTH} levels; refused "
                                 "(a spec needs a handful)")])


# contexts of a syntax error whose cause is an opening mark never closed
_UNCLOSED = ("while parsing a flow", "while scanning a quoted scalar")


def _at_next_key(text: str, opened, stopped) -> bool:
    """Whether a syntax error inside a flow collection or quote stopped on a block's next key
    or at the end of the file: on a line indented no deeper than the opening line, or past the
    last character (a collection closed but missing a comma inside stops at its own next item,
    on a line indented deeper than that)."""
    lines = text.split("\n")
    if stopped.line >= len(lines) or not text[stopped.index:].strip():
        return True

    def indent(line: str) -> int:
        return len(line) - len(line.lstrip())

    return indent(lines[stopped.line]) <= indent(lines[opened.line])


def load(text: str, file: str) -> Located:
    """Parse one YAML document; raise SpecError with positions on any problem."""
    try:
        node = yaml.compose(text, Loader=_Loader)
    except _TooDeep as e:
        raise _too_deep(file, e) from None
    except RecursionError:  # not expected with the depth limit; never a traceback all the same
        raise SpecError([Diagnostic(file, 1, 1, "", "document nested too deeply")]) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        msg = " ".join(x for x in (e.context, e.problem) if x) or str(e)
        c, p = e.context_mark, e.problem_mark
        if c and p and c.line < p.line and str(e.context).startswith(_UNCLOSED) and _at_next_key(text, c, p):
            # a `{`, `[` or quote left open: the parser stops lines later, at the next key (or the
            # end); the mistake is on the line that opened it (where its closing mark belongs)
            msg = (f"{str(e.context).removeprefix('while parsing ').removeprefix('while scanning ')} opened here "
                   f"is not closed: at line {p.line + 1}, column {p.column + 1}, {e.problem}")
            mark = c
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise SpecError([Diagnostic(file, line, col, "", f"YAML syntax error: {msg}")]) from None
    except yaml.YAMLError as e:
        raise SpecError([Diagnostic(file, 1, 1, "", f"YAML error: {e}")]) from None
    loc = Located(file=file, data=None)
    if node is None:
        raise SpecError([Diagnostic(file, 1, 1, "", "the file is empty")])
    errors: list[Diagnostic] = []
    budget = [MAX_NODES]
    constructor = yaml.constructor.SafeConstructor()

    def convert(n: yaml.Node, path: Path) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooBig(n)
        if len(path) > MAX_DEPTH:  # aliases can nest past what the composer saw
            raise _TooDeep(n.start_mark, path)
        loc.values.setdefault(path, _mark(n))
        if isinstance(n, (yaml.MappingNode, yaml.SequenceNode)) and n.tag not in _COLLECTION_TAGS:
            errors.append(Diagnostic(file, *_mark(n), dotted(path), f"unsupported YAML tag {n.tag}"))
            return None
        if isinstance(n, yaml.MappingNode):
            out: dict = {}
            for knode, vnode in n.value:
                if not isinstance(knode, yaml.ScalarNode):
                    errors.append(Diagnostic(file, *_mark(knode), dotted(path), "keys must be plain scalars"))
                    continue
                if knode.value == "<<" and knode.tag == "tag:yaml.org,2002:merge":
                    errors.append(Diagnostic(file, *_mark(knode), dotted(path), "merge keys (<<) are not supported"))
                    continue
                key = knode.value
                if key in out:
                    first = loc.keys.get(path + (key,), (0, 0))
                    errors.append(
                        Diagnostic(file, *_mark(knode), dotted(path + (key,)),
                                   f"duplicate key '{key}' (first defined at line {first[0]})")
                    )
                    continue
                loc.keys[path + (key,)] = _mark(knode)
                out[key] = convert(vnode, path + (key,))
            return out
        if isinstance(n, yaml.SequenceNode):
            return [convert(v, path + (i,)) for i, v in enumerate(n.value)]
        if n.tag not in _SCALAR_TAGS:
            errors.append(Diagnostic(file, *_mark(n), dotted(path), f"unsupported YAML tag {n.tag}"))
            return None
        if n.tag == "tag:yaml.org,2002:int":
            text = n.value.replace("_", "")
            try:
                return int(text, 10) if re.fullmatch(r"[-+]?[0-9]+", text) else int(text, 0)
            except ValueError:
                errors.append(Diagnostic(file, *_mark(n), dotted(path), f"bad integer {n.value!r}"))
                return None
        try:
            return constructor.construct_object(n, deep=True)
        except (yaml.YAMLError, ValueError) as e:
            errors.append(Diagnostic(file, *_mark(n), dotted(path), f"bad value: {e}"))
            return None

    try:
        loc.data = convert(node, ())
    except _TooBig as e:
        raise SpecError([Diagnostic(file, *_mark(e.node), "",
                                    f"document expands to more than {MAX_NODES} values "
                                    "(aliases nested too deep?); refused")]) from None
    except _TooDeep as e:
        raise _too_deep(file, e) from None
    except RecursionError:
        raise SpecError([Diagnostic(file, 1, 1, "", "document nested too deeply")]) from None
    if errors:
        raise SpecError(errors)
    return loc


class _TooBig(Exception):
    def __init__(self, node: yaml.Node):
        self.node = node


def load_file(path: str) -> Located:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise SpecError([Diagnostic(path, 1, 1, "", "no such file")]) from None
    except UnicodeDecodeError as e:
        raise SpecError([Diagnostic(path, 1, 1, "", f"not UTF-8 text: {e.reason}")]) from None
    except OSError as e:
        raise SpecError([Diagnostic(path, 1, 1, "", f"cannot read: {e.strerror}")]) from None
    return load(text, path)
