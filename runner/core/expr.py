"""Safe expressions for launch geometry, constraints and byte counts.

Flow: `compile_expr(text)` parses with Python's `ast` in eval mode and checks
every node against a whitelist (numbers, names, arithmetic, comparisons,
boolean logic, conditional expressions, calls of named helpers); the result
is an `Expr` that evaluates by walking the tree over a dict of symbols.
Python's `eval` is never called: attribute access, subscripts, lambdas,
comprehensions and calls of anything but the helpers below are rejected.
"""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import ExprError


def _ceil_div(a, b):
    return -(-a // b)


def _round_up(a, m):
    return _ceil_div(a, m) * m


def _log2(x):
    if isinstance(x, int) and x > 0 and x & (x - 1) == 0:
        return x.bit_length() - 1
    return math.log2(x)


def _is_pow2(x):
    return isinstance(x, int) and x > 0 and x & (x - 1) == 0


def experts_used(experts, tokens, topk) -> int:
    """The experts a `routing` draw of `tokens` tokens uses, each token picking `topk` distinct
    experts of `experts` (judge/inputs.py): the expected count E (1 - (1 - k / E)^T), rounded
    half up, within [k, min(E, T k)]; 0 without tokens. The draw makes exactly this many
    experts non-empty, so an op.bytes that counts their weights with it counts what a kernel
    must read (an expectation alone is off by up to a quarter at a few tokens)."""
    e, t, k = int(experts), int(tokens), int(topk)
    if e <= 0 or t <= 0:
        return 0
    k = max(1, min(k, e))
    m = math.floor(e * (1 - (1 - k / e) ** t) + 0.5)
    return max(k, min(e, t * k, m))


HELPERS: dict[str, tuple[Any, int, int]] = {  # name -> (function, min args, max args)
    "ceil_div": (_ceil_div, 2, 2),
    "round_up": (_round_up, 2, 2),
    "min": (min, 2, 16),
    "max": (max, 2, 16),
    "abs": (abs, 1, 1),
    "log2": (_log2, 1, 1),
    "sqrt": (math.sqrt, 1, 1),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "is_pow2": (_is_pow2, 1, 1),
    "int": (int, 1, 1),
    "experts_used": (experts_used, 3, 3),
}

_BIN = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow, ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
    ast.LShift: operator.lshift, ast.RShift: operator.rshift,
}
_CMP = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
    ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}

_WHAT = {
    ast.Attribute: "attribute access", ast.Subscript: "subscripts", ast.Lambda: "lambdas",
    ast.ListComp: "comprehensions", ast.GeneratorExp: "comprehensions",
    ast.DictComp: "comprehensions", ast.SetComp: "comprehensions",
    ast.NamedExpr: "assignment", ast.Starred: "star arguments", ast.JoinedStr: "f-strings",
    ast.List: "lists", ast.Dict: "dicts", ast.Set: "sets", ast.Tuple: "tuples",
}

MAX_POW = 64  # exponent and shift limit: keeps `9**9**9` from hanging the runner (a float base in
# [-1, 1] to a non-negative power is exempt: `(1 - p) ** T` stays in [-1, 1], one float operation)
MAX_STR = 10_000  # longest string a repetition may build


@dataclass(frozen=True)
class Expr:
    text: str
    tree: ast.Expression = field(repr=False, compare=False)
    names: frozenset = field(compare=False)

    def __call__(self, symbols: Mapping[str, Any]) -> Any:
        try:
            return _eval(self.tree.body, symbols, self.text)
        except ExprError:
            raise
        except RecursionError:
            raise ExprError(f"'{self.text[:60]}': nested too deeply") from None
        except (ZeroDivisionError, OverflowError, ValueError, TypeError, MemoryError) as e:
            raise ExprError(f"'{self.text}': {type(e).__name__}: {e}") from None


def compile_expr(text: Any, allowed: set[str] | None = None) -> Expr:
    """Parse and check; `allowed` (if given) is the set of symbol names in scope."""
    if isinstance(text, bool) or isinstance(text, (int, float)):
        text = repr(text)
    if not isinstance(text, str):
        raise ExprError(f"expected an expression string, got {type(text).__name__}")
    if len(text) > 1000:
        raise ExprError("expression longer than 1000 characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ExprError(f"'{text}': syntax error: {e.msg}") from None
    except (RecursionError, MemoryError):
        raise ExprError(f"'{text[:60]}...': nested too deeply") from None
    names: set[str] = set()
    for node in ast.walk(tree):
        _check(node, text, names)
    unknown = sorted(names - set(allowed)) if allowed is not None else []
    if unknown:
        scope = ", ".join(sorted(allowed)) or "(none)"
        raise ExprError(f"'{text}': unknown name{'s' if len(unknown) > 1 else ''} "
                        f"{', '.join(unknown)} (in scope: {scope})")
    return Expr(text, tree, frozenset(names))


def _check(node: ast.AST, text: str, names: set[str]) -> None:
    if isinstance(node, (ast.Expression, ast.Load, ast.operator, ast.cmpop, ast.unaryop, ast.boolop)):
        if isinstance(node, ast.operator) and type(node) not in _BIN:
            raise ExprError(f"'{text}': operator {type(node).__name__} is not allowed")
        if isinstance(node, ast.cmpop) and type(node) not in _CMP:
            raise ExprError(f"'{text}': comparison {type(node).__name__} is not allowed")
        return
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or isinstance(node.value, (int, float, str)):
            return
        raise ExprError(f"'{text}': constant {node.value!r} is not allowed")
    if isinstance(node, ast.Name):
        if node.id.startswith("__"):
            raise ExprError(f"'{text}': name {node.id} is not allowed")
        if node.id not in HELPERS:
            names.add(node.id)
        return
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in HELPERS:
            what = ast.unparse(node.func) if hasattr(ast, "unparse") else "?"
            raise ExprError(f"'{text}': call of '{what}' is not allowed "
                            f"(helpers: {', '.join(sorted(HELPERS))})")
        if node.keywords:
            raise ExprError(f"'{text}': keyword arguments are not allowed")
        _, lo, hi = HELPERS[node.func.id]
        if not lo <= len(node.args) <= hi:
            raise ExprError(f"'{text}': {node.func.id} takes {lo if lo == hi else f'{lo} to {hi}'} "
                            f"argument{'s' if hi > 1 else ''}, got {len(node.args)}")
        return
    if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp)):
        if isinstance(node, ast.UnaryOp) and type(node.op) not in _UNARY:
            raise ExprError(f"'{text}': operator {type(node.op).__name__} is not allowed")
        return
    what = _WHAT.get(type(node), type(node).__name__)
    raise ExprError(f"'{text}': {what} not allowed in expressions")


def _bounded_pow(a, b, text: str) -> float:
    """A float base in [-1, 1] to a non-negative exponent: the result stays in [-1, 1] and
    costs one floating-point operation whatever the exponent, so it needs no MAX_POW limit
    (`(1 - 6 / 64) ** T`, the share of experts no token picks, at T in the thousands). A
    result that is not real (a negative base to a fractional power, which Python answers
    with a complex number) is an error."""
    v = float(a) ** float(b)
    if isinstance(v, complex):
        raise ExprError(f"'{text}': {a!r} ** {b!r} is not a real number")
    return v


def _eval(node: ast.AST, env: Mapping[str, Any], text: str) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in HELPERS:
            raise ExprError(f"'{text}': helper {node.id} must be called")
        try:
            return env[node.id]
        except KeyError:
            raise ExprError(f"'{text}': unknown name {node.id}") from None
    if isinstance(node, ast.BinOp):
        a = _eval(node.left, env, text)
        b = _eval(node.right, env, text)
        if isinstance(node.op, ast.Pow) and isinstance(a, float) and abs(a) <= 1 and \
                isinstance(b, (int, float)) and not isinstance(b, bool) and b >= 0:
            return _bounded_pow(a, b, text)
        if isinstance(node.op, (ast.Pow, ast.LShift)) and abs(b) > MAX_POW:
            raise ExprError(f"'{text}': exponent or shift {b} exceeds {MAX_POW}")
        if isinstance(node.op, ast.Pow) and abs(a) > 2**32:
            raise ExprError(f"'{text}': power base {a} too large")
        if isinstance(node.op, ast.Mult) and (isinstance(a, str) or isinstance(b, str)):
            n = b if isinstance(a, str) else a
            if not isinstance(n, int) or len(a if isinstance(a, str) else b) * max(n, 0) > MAX_STR:
                raise ExprError(f"'{text}': string repetition longer than {MAX_STR} characters")
        return _BIN[type(node.op)](a, b)
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, env, text))
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            v = True
            for x in node.values:
                v = _eval(x, env, text)
                if not v:
                    return v
            return v
        v = False
        for x in node.values:
            v = _eval(x, env, text)
            if v:
                return v
        return v
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, text)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, env, text)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body if _eval(node.test, env, text) else node.orelse, env, text)
    if isinstance(node, ast.Call):
        fn = HELPERS[node.func.id][0]
        return fn(*(_eval(a, env, text) for a in node.args))
    raise ExprError(f"'{text}': cannot evaluate {type(node).__name__}")  # unreachable after _check
