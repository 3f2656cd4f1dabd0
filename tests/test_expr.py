"""runner.core.expr: safe expressions, no eval."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.core.errors import ExprError
from runner.core.expr import HELPERS, MAX_POW, Expr, compile_expr


def ev(text, **env):
    return compile_expr(text)(env)


# ---------------------------------------------------------------- arithmetic

@pytest.mark.parametrize("text, value", [
    ("1 + 2 * 3", 7),
    ("(1 + 2) * 3", 9),
    ("2 ** 3 ** 2", 512),  # right associative
    ("-2 ** 2", -4),  # unary minus binds looser than **
    ("7 // 2", 3),
    ("-7 // 2", -4),
    ("7 % 3", 1),
    ("-7 % 3", 2),
    ("7 / 2", 3.5),
    ("1 << 4", 16),
    ("256 >> 3", 32),
    ("6 & 3", 2),
    ("6 | 3", 7),
    ("10 - 4 - 3", 3),  # left associative
    ("2 * 3 + 4 * 5", 26),
    ("+5", 5),
])
def test_arithmetic_and_precedence(text, value):
    got = ev(text)
    assert got == value
    assert type(got) is type(value)


def test_symbols():
    assert ev("BLOCK * VEC + N", BLOCK=128, VEC=4, N=3) == 515


@pytest.mark.parametrize("text, value", [
    ("1 < 2 < 3", True),
    ("1 < 3 < 2", False),
    ("3 > 2 >= 2", True),
    ("1 == 1 != 2", True),
    ("1 <= 0 < 5", False),
    ("'fp16' == 'fp16'", True),
])
def test_comparison_chains(text, value):
    assert ev(text) is value


def test_chain_does_not_compare_first_with_last():
    # 1 < 5 > 2 is (1 < 5) and (5 > 2); a wrong fold would compare 1 > 2.
    assert ev("1 < 5 > 2") is True


@pytest.mark.parametrize("text, value", [
    ("1 and 2", 2),
    ("0 and 2", 0),
    ("0 or 3", 3),
    ("2 or 3", 2),
    ("not 0", True),
    ("not 5", False),
    ("x > 1 and x < 10", True),
    ("x < 1 or x > 4", True),
    ("not (x == 5)", False),
])
def test_boolean_logic(text, value):
    assert ev(text, x=5) == value


def test_and_or_short_circuit():
    # the right-hand side would divide by zero if evaluated
    assert ev("x != 0 and 10 // x > 1", x=0) is False
    assert ev("x == 0 or 10 // x > 1", x=0) is True


def test_conditional_expression():
    e = compile_expr("a if c else b")
    assert e({"a": 1, "b": 2, "c": True}) == 1
    assert e({"a": 1, "b": 2, "c": False}) == 2
    # only the chosen branch is evaluated
    assert ev("1 if n == 0 else 10 // n", n=0) == 1


# ---------------------------------------------------------------- helpers

@pytest.mark.parametrize("text, value", [
    ("ceil_div(10, 3)", 4),
    ("ceil_div(9, 3)", 3),
    ("ceil_div(1, 128)", 1),
    ("round_up(100, 32)", 128),
    ("round_up(128, 32)", 128),
    ("min(3, 1, 2)", 1),
    ("max(3, 1, 2)", 3),
    ("abs(-4)", 4),
    ("floor(2.7)", 2),
    ("ceil(2.1)", 3),
    ("sqrt(16)", 4.0),
    ("int(3.9)", 3),
    ("is_pow2(64)", True),
    ("is_pow2(1)", True),
    ("is_pow2(96)", False),
    ("is_pow2(0)", False),
    ("is_pow2(-4)", False),
    ("is_pow2(4.0)", False),
])
def test_helpers(text, value):
    assert ev(text) == value


@pytest.mark.parametrize("k", range(0, 63))
def test_log2_exact_for_powers_of_two(k):
    v = ev("log2(x)", x=2 ** k)
    assert v == k
    assert type(v) is int


def test_log2_of_non_power_is_float():
    assert ev("log2(1000)") == pytest.approx(math.log2(1000))
    assert isinstance(ev("log2(1000)"), float)


def test_log2_exact_beyond_float_precision():
    # math.log2(2**60 - 1) rounds to 60.0; exact path must not apply there
    assert ev("log2(2 ** 60)") == 60
    assert ev("is_pow2(2 ** 60 - 1)") is False


def test_helpers_combine():
    assert ev("round_up(ceil_div(N, BLOCK), 4) * BLOCK", N=1000, BLOCK=64) == 1024


def test_number_inputs_are_accepted():
    assert compile_expr(5)({}) == 5
    assert compile_expr(2.5)({}) == 2.5
    assert compile_expr(True)({}) is True


def test_non_string_input_rejected():
    with pytest.raises(ExprError, match="expected an expression string"):
        compile_expr(None)
    with pytest.raises(ExprError):
        compile_expr(["a"])


def test_too_long_rejected():
    with pytest.raises(ExprError, match="longer than 1000"):
        compile_expr("1" * 1001)


# ---------------------------------------------------------------- rejections at compile time

@pytest.mark.parametrize("text, what", [
    ("__import__('os')", "__import__"),
    ("x.y", "attribute"),
    ("x.__class__", "attribute"),
    ("lambda: 1", "lambda"),
    ("[i for i in range(3)]", "comprehension"),
    ("(i for i in range(3))", "comprehension"),
    ("a[0]", "subscript"),
    ("open('f')", "open"),
    ("(lambda: 1)()", "call"),
    ("eval('1')", "eval"),
    ("getattr(x, 'y')", "getattr"),
    ("__builtins__", "__builtins__"),
    ("[1, 2]", "list"),
    ("{1: 2}", "dict"),
    ("(1, 2)", "tuple"),
    ("(x := 1)", "assignment"),
    ("f'{x}'", "f-string"),
    ("None", "None"),
    ("b'x'", "b'x'"),
    ("1 in x", "In"),
    ("x is y", "Is"),
    ("~x", "Invert"),
    ("x ^ 1", "BitXor"),
    ("x @ y", "MatMult"),
    ("min(*xs)", "min"),
    ("1 +", "syntax error"),
    ("x = 1", "syntax error"),
])
def test_rejected_at_compile(text, what):
    with pytest.raises(ExprError) as ei:
        compile_expr(text)
    assert what.lower() in str(ei.value).lower()


def test_keyword_arguments_rejected():
    with pytest.raises(ExprError, match="keyword"):
        compile_expr("max(a=1, b=2)")
    with pytest.raises(ExprError, match="keyword"):
        compile_expr("ceil_div(1, b=2)")


@pytest.mark.parametrize("text, msg", [
    ("ceil_div(1)", "ceil_div takes 2 arguments, got 1"),
    ("round_up(1, 2, 3)", "round_up takes 2 arguments, got 3"),
    ("abs(1, 2)", "abs takes 1 argument, got 2"),
    ("log2()", "log2 takes 1 argument, got 0"),
    ("min(1)", "min takes 2 to 16 arguments, got 1"),
    ("max(" + ", ".join(["1"] * 17) + ")", "max takes 2 to 16 arguments, got 17"),
])
def test_wrong_helper_arity(text, msg):
    with pytest.raises(ExprError) as ei:
        compile_expr(text)
    assert msg in str(ei.value)


def test_unknown_names_with_allowed():
    with pytest.raises(ExprError) as ei:
        compile_expr("BLOCK * VECC + M", allowed={"BLOCK", "VEC", "N"})
    msg = str(ei.value)
    assert "unknown names M, VECC" in msg
    assert "in scope: BLOCK, N, VEC" in msg


def test_unknown_single_name_and_empty_scope():
    with pytest.raises(ExprError) as ei:
        compile_expr("x + 1", allowed=set())
    assert "unknown name x " in str(ei.value)
    assert "(none)" in str(ei.value)


def test_allowed_accepts_known_names_and_helpers():
    e = compile_expr("ceil_div(N, B) * B", allowed={"N", "B"})
    assert e({"N": 10, "B": 4}) == 12


def test_no_allowed_means_any_name():
    assert compile_expr("whatever + 1").names == frozenset({"whatever"})


# ---------------------------------------------------------------- rejections at evaluation

def test_power_tower_refused_fast():
    e = compile_expr("9**9**9")
    with pytest.raises(ExprError, match="exceeds"):
        e({})


@pytest.mark.parametrize("text", ["2 ** 65", "1 << 65", "x ** 100", "2.0 ** 1000", "(2**33) ** 2"])
def test_large_power_or_shift_refused(text):
    with pytest.raises(ExprError):
        compile_expr(text)({"x": 2})


def test_power_at_limit_allowed():
    assert ev(f"2 ** {MAX_POW}") == 2 ** MAX_POW
    assert ev(f"1 << {MAX_POW}") == 1 << MAX_POW


@pytest.mark.parametrize("text", ["1 / 0", "1 // 0", "1 % 0", "ceil_div(4, 0)", "round_up(4, 0)",
                                  "x / (y - y)"])
def test_division_by_zero_is_expr_error(text):
    e = compile_expr(text)
    with pytest.raises(ExprError) as ei:
        e({"x": 1, "y": 3})
    assert not isinstance(ei.value, ZeroDivisionError)
    assert text in str(ei.value)


@pytest.mark.parametrize("text", ["log2(0)", "sqrt(-1)", "int('abc')", "min(1, 'a')", "'a' < 1",
                                  "floor(1e400)", "-1 << 2 >> -1"])
def test_other_evaluation_errors_are_expr_error(text):
    with pytest.raises(ExprError):
        compile_expr(text)({})


def test_missing_symbol_at_evaluation():
    e = compile_expr("a + b")
    with pytest.raises(ExprError, match="unknown name b"):
        e({"a": 1})


def test_helper_used_as_value():
    e = compile_expr("min + 1")
    assert e.names == frozenset()
    with pytest.raises(ExprError, match="must be called"):
        e({})


def test_string_repetition_bomb_is_expr_error():
    e = compile_expr("'a' * 2 ** 62")
    with pytest.raises(ExprError):
        e({})


def test_deep_nesting_is_expr_error():
    text = "-" * 999 + "1"  # exactly the 1000-character limit
    with pytest.raises(ExprError):
        compile_expr(text)({})


# ---------------------------------------------------------------- names

def test_names_are_free_symbols_not_helpers():
    e = compile_expr("ceil_div(N, BLOCK) * max(VEC, 2) if is_pow2(BLOCK) else log2(M)")
    assert e.names == frozenset({"N", "BLOCK", "VEC", "M"})
    assert not (e.names & set(HELPERS))


def test_names_empty_for_constants():
    assert compile_expr("1 + 2 * 3").names == frozenset()


def test_expr_equality_is_by_text():
    assert compile_expr("a + 1") == compile_expr("a + 1")
    assert compile_expr("a + 1") != compile_expr("a + 2")
    assert isinstance(compile_expr("a"), Expr)


def test_whitespace_around_text_tolerated():
    assert compile_expr("  1 + 1 \n")({}) == 2


# ---------------------------------------------------------------- property: agrees with Python

_ints = st.integers(min_value=-1000, max_value=1000)
_ops = st.sampled_from(["+", "-", "*", "//", "%", "<", "<=", "==", "!=", ">", ">="])


@settings(max_examples=200, deadline=None)
@given(a=_ints, b=_ints, c=_ints, op1=_ops, op2=_ops)
def test_agrees_with_python_on_integer_arithmetic(a, b, c, op1, op2):
    text = f"a {op1} b {op2} c"
    try:
        want = eval(text, {"__builtins__": {}}, {"a": a, "b": b, "c": c})  # reference only
    except ZeroDivisionError:
        with pytest.raises(ExprError):
            compile_expr(text)({"a": a, "b": b, "c": c})
        return
    assert compile_expr(text)({"a": a, "b": b, "c": c}) == want


@settings(max_examples=200, deadline=None)
@given(a=st.integers(min_value=0, max_value=10**6), b=st.integers(min_value=1, max_value=4096))
def test_ceil_div_and_round_up_properties(a, b):
    q = compile_expr("ceil_div(a, b)")({"a": a, "b": b})
    r = compile_expr("round_up(a, b)")({"a": a, "b": b})
    assert q == math.ceil(a / b)
    assert (q - 1) * b < a <= q * b or (a == 0 and q == 0)
    assert r % b == 0 and a <= r < a + b
