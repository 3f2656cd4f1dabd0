"""runner.build.forbid: forbidden actions over parameters, source and compile options."""

import re

import pytest

from runner.build import forbid
from runner.core.expr import compile_expr
from runner.build.forbid import NAMED, Pattern, Rule, Violation, check_params, check_source, strip_comments

# One representative offending snippet per (action, backend) with source patterns.
SNIPPETS = {
    ("fast_math", "cuda"): "float y = __expf(x);",
    ("fast_math", "cpu"): "#pragma GCC optimize(\"fast-math\")",
    ("lower_precision", "cuda"): "h = __hadd2(a, b);",
    ("lower_precision", "cpu"): "_Float16 h = x;",
    ("library_calls", "cuda"): "cublasSgemm(handle, opA, opB, m, n, k, &al, A, lda, B, ldb, &be, C, ldc);",
    ("library_calls", "cpu"): "cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1, A, k, B, n, 0, C, n);",
    ("side_streams", "cuda"): "cudaStreamCreate(&s);",
    ("side_streams", "cpu"): "auto f = std::async(std::launch::async, work);",
    ("host_sync", "cuda"): "cudaDeviceSynchronize();",
    ("disable_cuda_graphs", "cuda"): "cudaStreamIsCapturing(s, &status);",
}

WITH_PATTERNS = sorted((name, backend) for name, n in NAMED.items()
                       for backend in ("cuda", "cpu") if n.source.get(backend))

HONEST_CUDA = """\
#include <cuda_runtime.h>
#include <cuda_bf16.h>
// fast path: no __expf here, no cublasSgemm, no cudaDeviceSynchronize()
/* a long comment mentioning cudaStreamCreate and __hadd2(a, b)
   and std::async and #pragma GCC optimize */
template <int BLOCK>
__global__ void softmax(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* y, int n) {
    __shared__ float red[32];
    float m = -INFINITY, s = 0.f;
    for (int i = threadIdx.x; i < n; i += BLOCK) {
        float v = __bfloat162float(x[blockIdx.x * n + i]);
        float m2 = fmaxf(m, v);
        s = s * expf(m - m2) + expf(v - m2);
        m = m2;
    }
    red[threadIdx.x % 32] = s;
    __syncthreads();
    y[blockIdx.x] = __float2bfloat16_rn(logf(s) + m);
}
"""

HONEST_CPU = """\
#include <cmath>
#include <cstdint>
// we do not call cblas_sgemm, nor std::async
extern "C" void kernel(const float* x, float* y, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; ++i) m = std::fmax(m, x[i]);
    double s = 0;
    for (int i = 0; i < n; ++i) s += std::exp(x[i] - m);
    for (int i = 0; i < n; ++i) y[i] = std::exp(x[i] - m) / s;
}
"""


def test_every_action_with_source_patterns_has_a_snippet():
    assert set(WITH_PATTERNS) == set(SNIPPETS)


@pytest.mark.parametrize("name, backend", WITH_PATTERNS)
def test_named_action_catches_snippet_and_line(name, backend):
    src = "int a = 0;\n\n" + SNIPPETS[(name, backend)] + "\nint b = 1;\n"
    v = check_source(src, [], backend, [name], [])
    assert isinstance(v, Violation)
    assert v.rule == name
    assert "at line 3" in v.reason
    assert NAMED[name].description in v.reason
    assert str(v).startswith(f"{name}: ")


@pytest.mark.parametrize("name, backend", WITH_PATTERNS)
def test_named_action_only_when_requested(name, backend):
    src = SNIPPETS[(name, backend)] + "\n"
    others = [n for n in NAMED if n != name and not any(
        re.search(rx, src) for rx in NAMED[n].source.get(backend, ()))]
    assert check_source(src, [], backend, others, []) is None


@pytest.mark.parametrize("name, backend", WITH_PATTERNS)
def test_snippet_in_line_comment_is_not_caught(name, backend):
    src = "int a = 0;\n// " + SNIPPETS[(name, backend)] + "\nint b = 1;\n"
    assert check_source(src, [], backend, [name], []) is None


@pytest.mark.parametrize("name, backend", WITH_PATTERNS)
def test_snippet_in_block_comment_is_not_caught(name, backend):
    src = "int a = 0;\n/* note:\n   " + SNIPPETS[(name, backend)] + "\n*/\nint b = 1;\n"
    assert check_source(src, [], backend, [name], []) is None


@pytest.mark.parametrize("src", [
    "#include <cuda/../thrust/reduce.h>\n",  # session 44's red team: the library under another path
    "#include <thrust/reduce.h>\n",
    '#include "cutlass/gemm/device/gemm.h"\n',
    "namespace th = thrust;\nfloat s = th::reduce(th::seq, x, x + n);\n",  # an alias of its namespace
])
def test_a_library_is_found_in_any_include_path_and_through_an_alias(src):
    v = check_source(src, [], "cuda", ["library_calls"], [])
    assert v is not None and v.rule == "library_calls", src


@pytest.mark.parametrize("src", [
    "#include <cuda/barrier>\n#include <cuda_bf16.h>\nint cuteness = 0;\n",
    'static_assert(1, "no thrust or cute here");\n', "float thrust = 1.0f;\n", "struct P { float cute; };\n",
])
def test_names_near_a_library_are_not_one(src):
    assert check_source(src, [], "cuda", ["library_calls"], []) is None


def test_line_number_counts_lines_of_stripped_block_comments():
    src = "/* one\ntwo\nthree */\nint x;\nfloat y = __expf(x);\n"
    v = check_source(src, [], "cuda", ["fast_math"], [])
    assert v is not None and "at line 5" in v.reason


def test_code_after_comment_on_same_line_is_caught():
    v = check_source("/* ok */ float y = __expf(x);\n", [], "cuda", ["fast_math"], [])
    assert v is not None and v.rule == "fast_math"


def test_strip_comments_keeps_newlines():
    src = "a // c1\nb /* c2\nc3 */ d\ne"
    out = strip_comments(src)
    assert out.count("\n") == src.count("\n")
    assert "c1" not in out and "c2" not in out and "c3" not in out
    assert out.split("\n")[0].strip() == "a" and out.split("\n")[2].strip() == "d"


@pytest.mark.parametrize("snippet", [
    "float y = __logf(x);", "float y = __fdividef(a, b);", "__sincosf(x, &s, &c);",
    "#pragma nv_fast_math",
])
def test_more_cuda_fast_math_intrinsics(snippet):
    assert check_source(snippet, [], "cuda", ["fast_math"], []) is not None


@pytest.mark.parametrize("snippet", [
    "_mm_setcsr(_mm_getcsr() | 0x8040);", "_MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);",
    "_MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);", "_MM_SET_ROUNDING_MODE(_MM_ROUND_TOWARD_ZERO);",
    "_fxrstor64(area);", "_fxrstor(area);", "_xrstor64(area, ~0ull);", "_xrstors(area, 3);",
])
def test_flush_to_zero_set_at_run_time_is_cpu_fast_math(snippet):
    # session 35's red team: MXCSR's FTZ and DAZ bits set from immintrin.h passed the rules
    v = check_source(snippet, [], "cpu", ["fast_math"], [])
    assert v is not None and v.rule == "fast_math", v
    for reading in ("unsigned c = _mm_getcsr();", "_fxsave64(area);"):  # reading the state is not
        assert check_source(reading, [], "cpu", ["fast_math"], []) is None


@pytest.mark.parametrize("snippet", [
    "float y = expf(x);", "float y = logf(x);", "float y = my__expf(x);", "float expf_ = 1;",
])
def test_accurate_math_is_not_fast_math(snippet):
    assert check_source(snippet, [], "cuda", ["fast_math"], []) is None


@pytest.mark.parametrize("snippet", [
    "#include <cublas_v2.h>", "cudnnCreate(&h);", "cutlass::gemm::device::Gemm<> g;",
    "thrust::sort(v.begin(), v.end());", "cub::DeviceReduce::Sum(p, n, a, b, c);",
])
def test_more_cuda_library_calls(snippet):
    v = check_source(snippet, [], "cuda", ["library_calls"], [])
    assert v is not None and v.rule == "library_calls"


@pytest.mark.parametrize("snippet", ["system(\"ls\");", "void* h = dlopen(\"libm.so\", 0);",
                                     "#include <mkl.h>", "execvp(a, b);"])
def test_more_cpu_library_calls(snippet):
    assert check_source(snippet, [], "cpu", ["library_calls"], []) is not None


def test_kernel_launch_is_side_stream_on_cuda():
    v = check_source("child<<<1, 32>>>(p);", [], "cuda", ["side_streams"], [])
    assert v is not None and "<<<" in v.reason


def test_cpu_thread_detach_is_side_stream():
    assert check_source("std::thread t(f);\nt.detach();\n", [], "cpu", ["side_streams"], []) is not None


def test_backend_selects_patterns():
    # a CUDA intrinsic is not a pattern of the CPU backend
    assert check_source("float y = __expf(x);", [], "cpu", ["fast_math"], []) is None
    assert check_source("auto f = std::async(g);", [], "cuda", ["side_streams"], []) is None


# ---------------------------------------------------------------- compile options

@pytest.mark.parametrize("backend, opt", [
    ("cpu", "-ffast-math"), ("cpu", "-Ofast"), ("cpu", "-funsafe-math-optimizations"),
    ("cpu", "-fassociative-math"), ("cpu", "-freciprocal-math"), ("cpu", "-ffinite-math-only"),
    ("cuda", "--use_fast_math"), ("cuda", "-use_fast_math"), ("cuda", "--ftz=true"),
    ("cuda", "--prec-div=false"), ("cuda", "--prec-sqrt=false"), ("cuda", "--fmad=true"),
])
def test_fast_math_options_caught(backend, opt):
    v = check_source("int x;\n", ["-O3", opt], backend, ["fast_math"], [])
    assert v is not None
    assert v.rule == "fast_math"
    assert f"'{opt}'" in v.reason


@pytest.mark.parametrize("opt", ["-O3", "-O2", "-march=native", "--ftz=false", "--prec-div=true",
                                 "-fno-fast-math", "-lineinfo"])
def test_harmless_options_pass(opt):
    assert check_source("int x;\n", [opt], "cuda", ["fast_math"], []) is None
    assert check_source("int x;\n", [opt], "cpu", ["fast_math"], []) is None


def test_options_not_checked_without_the_action():
    assert check_source("int x;\n", ["-ffast-math"], "cpu", ["library_calls"], []) is None


@pytest.mark.parametrize("opt", ["-ftz=true", "-prec-div=false", "-prec-sqrt=false"])
def test_nvcc_single_dash_fast_math_options_caught(opt):
    assert check_source("int x;\n", [opt], "cuda", ["fast_math"], []) is not None


# ---------------------------------------------------------------- string literals vs comments

@pytest.mark.parametrize("src", [
    'const char* u = "http://x"; float y = __expf(x);\n',
    'const char* a = "/*";\nfloat y = __expf(x);\nconst char* b = "*/";\n',
])
def test_comment_marker_inside_string_does_not_hide_code(src):
    v = check_source(src, [], "cuda", ["fast_math"], [])
    assert v is not None


# ---------------------------------------------------------------- custom patterns

def test_custom_pattern_reported_with_reason_and_line():
    p = Pattern(r"\batomicAdd\s*\(", "no atomics: the reduction must be deterministic")
    src = "int a;\nint b;\n\natomicAdd(&sum, v);\n"
    v = check_source(src, [], "cuda", [], [p])
    assert v is not None
    assert v.rule == r"pattern '\batomicAdd\s*\('"
    assert "no atomics: the reduction must be deterministic" in v.reason
    assert "at line 4" in v.reason
    assert "atomicAdd(" in v.reason


def test_custom_pattern_ignores_comments():
    p = Pattern(r"\batomicAdd\b", "no atomics")
    assert check_source("// atomicAdd is not used\nint x;\n", [], "cuda", [], [p]) is None


def test_custom_pattern_no_match():
    assert check_source("int x;\n", [], "cpu", [], [Pattern(r"\bgoto\b", "no goto")]) is None


def test_named_checked_before_patterns():
    src = "__expf(x); atomicAdd(p, 1);"
    v = check_source(src, [], "cuda", ["fast_math"], [Pattern("atomicAdd", "no atomics")])
    assert v.rule == "fast_math"


# ---------------------------------------------------------------- rules over parameters

def test_check_params_fires_only_when_true():
    rule = Rule(compile_expr("BLOCK * VEC > N"), "a block may not cover more than one row")
    assert check_params({"BLOCK": 128, "VEC": 4}, [rule], [{"N": 1024}]) is None
    v = check_params({"BLOCK": 512, "VEC": 4}, [rule], [{"N": 1024}])
    assert v is not None
    assert v.rule == "rule 'BLOCK * VEC > N'"
    assert v.reason == "a block may not cover more than one row"
    assert str(v) == "rule 'BLOCK * VEC > N': a block may not cover more than one row"


def test_check_params_boundary():
    rule = Rule(compile_expr("BLOCK >= 1024"), "too big")
    assert check_params({"BLOCK": 1023}, [rule], [{}]) is None
    assert check_params({"BLOCK": 1024}, [rule], [{}]) is not None


def test_check_params_first_firing_rule_wins():
    rules = [Rule(compile_expr("A > 10"), "a"), Rule(compile_expr("B > 10"), "b"),
             Rule(compile_expr("A + B > 0"), "c")]
    assert check_params({"A": 1, "B": 20}, rules, [{}]).reason == "b"
    assert check_params({"A": 1, "B": 1}, rules, [{}]).reason == "c"
    assert check_params({"A": 0, "B": 0}, rules, [{}]) is None


def test_check_params_params_shadow_symbols():
    rule = Rule(compile_expr("X == 1"), "x is one")
    assert check_params({"X": 2}, [rule], [{"X": 1}]) is None


def test_check_params_no_rules():
    assert check_params({"A": 1}, [], [{}]) is None


# ---------------------------------------------------------------- honest code

def test_honest_cuda_snippet_passes_every_named_action():
    assert check_source(HONEST_CUDA, ["-O3", "-lineinfo"], "cuda", list(NAMED), []) is None


def test_honest_cpu_snippet_passes_every_named_action():
    assert check_source(HONEST_CPU, ["-O3", "-march=native"], "cpu", list(NAMED), []) is None


def test_honest_cuda_snippet_still_caught_once_a_call_is_added():
    bad = HONEST_CUDA.replace("expf(v - m2)", "__expf(v - m2)")
    v = check_source(bad, [], "cuda", list(NAMED), [])
    assert v is not None and v.rule == "fast_math"
    line = bad.splitlines().index(next(l for l in bad.splitlines() if "__expf(v" in l)) + 1
    assert f"at line {line}" in v.reason


def test_named_table_is_well_formed():
    for name, n in NAMED.items():
        assert n.description
        assert set(n.source) <= {"cpu", "cuda"}
        for rxs in n.source.values():
            for rx in rxs:
                re.compile(rx)
        for rx in n.options:
            re.compile(rx)
    assert forbid._FAST_MATH_OPTS == NAMED["fast_math"].options


def test_rules_hold_on_every_shape():
    rule = Rule(compile_expr("ACC * 64 > N"), "rows shorter than the partial sums")
    assert check_params({"ACC": 32}, [rule], [{"N": 4096}]) is None
    assert check_params({"ACC": 32}, [rule], [{"N": 4096}, {"N": 1024}]) is not None


def test_splices_digraphs_and_trigraphs_cannot_hide_a_pattern():
    for src, options in (('#pragma GCC opti\\\nmize("fast-math")\nint k;', ()),
                         ('%:pragma GCC optimize("fast-math")\nint k;', ()),
                         ('??=pragma GCC optimize("fast-math")\nint k;', ("-std=c++14",))):
        v = check_source(src, options, "cpu", ["fast_math"], [])
        assert v is not None and v.rule == "fast_math", src
    v = check_source("float f(float x) { return __ex\\\npf(x); }", (), "cuda", ["fast_math"], [])
    assert v is not None and v.rule == "fast_math"


@pytest.mark.parametrize("src", [
    # C++17 has no trigraphs: `??/` is no backslash, so the next line is code, not a comment's
    "// note ??/\nfloat y = __expf(x);\n",
    'const char* s = "??/";\nfloat y = __expf(x);\nconst char* t = "";\n',
    # a digit separator is no quote: nothing here opens a character literal, a string or a comment
    'static_assert(1\'0 == 10, "\'/*");\nfloat y = __expf(x);\nconst char* s = "*/";\n',
])
def test_the_rules_read_cpp17_tokens_as_the_compiler_does(src):
    """Session 44's second red team hid `__fdividef` from every rule behind a trigraph (which
    the rules replaced and C++17 does not) and a digit separator (read as a quote)."""
    v = check_source(src, (), "cuda", ["fast_math"], [])
    assert v is not None and v.rule == "fast_math", src
    if "??/" in src.split("\n")[0] and src.startswith("//"):  # under C++14 the splice is real: a comment
        assert check_source(src, ("-std=c++14",), "cuda", ["fast_math"], []) is None


def test_token_pasting_is_refused_while_rules_are_on():
    src = "#define F(a) __##a\nfloat g(float x) { return F(expf)(x); }"
    assert check_source(src, (), "cuda", ["fast_math"], []).rule == "token_pasting"
    assert check_source(src, (), "cuda", [], []) is None


def test_splices_keep_line_numbers():
    src = "int a;\nint b = 1 + \\\n 2;\nfloat y = __expf(1.f);\n"
    v = check_source(src, (), "cuda", ["fast_math"], [])
    assert "line 4" in v.reason
