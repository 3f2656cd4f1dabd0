"""The spec: YAML → JSON Schema → cross-checks → frozen dataclasses.

Flow: yamlsrc.load_file (positions, no YAML traps) → jsonschema (shape and
types; unknown keys are errors) → semantic checks (expressions and their
symbols, parameter domains, the template's variables against the space, the
hardware profile, the reference, the forbidden actions, the goal) → `Spec`.
Every problem found is reported at once as `file:line:col: key.path: message`
in one SpecError; the CLI prints them and exits 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from ..build import forbid as forbid_mod
from ..build import render
from ..core import userpath
from . import yamlsrc
from ..core.errors import Diagnostic, ExprError, SpecError
from ..core.expr import Expr, compile_expr
from .hw import HwProfile, find_profile, load_profile
from .schema import ROUTING_DISTS, SPEC, diagnostics as schema_diagnostics
from ..search.space import Param, Space, domain_problem, param_values

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8, "int8": 1, "uint8": 1,
               "int32": 4, "int64": 8, "bool": 1}
# the arms pipe compare names itself (and "table", the range curve's line for the dispatch
# table): op.arms may not take these names
BUILTIN_ARMS = ("torch eager", "torch.compile", "triton", "copy")
RESERVED_ARMS = (*BUILTIN_ARMS, "table")
MAX_PARAM_VALUES = 65536  # values of one search parameter (a `range` expands into every one of them)
DEFAULT_TOL = {"bf16": (1e-2, 1.6e-2), "fp16": (1e-3, 2e-3), "fp32": (1e-5, 1e-5),
               "fp64": (1e-10, 1e-10)}
INT_DTYPES = {"int8", "uint8", "int32", "int64", "bool"}
INT_DISTS = ("randint", "perm", *ROUTING_DISTS)  # what an integer tensor may be drawn from
ROUTING_DTYPES = ("int32", "int64")  # an offsets input (routing dists): cumulative row ends
PERM_MAX = {"int8": 127, "uint8": 255, "int32": 2 ** 31 - 1, "int64": 2 ** 63 - 1}  # the largest value a dtype holds


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[Expr, ...]
    dtype: str
    dists: tuple[str, ...]
    low: Expr | None = None
    high: Expr | None = None
    special: tuple[float, float] | None = None  # (value, fraction): that share of elements set to value
    # an input's `timed` override: the same tensor with other dist/low/high, the values of the
    # timed calls (the candidate's timed loop, the baseline's, pipe compare's arms); the check
    # rounds of verification and the domain checks take the tensor's own
    timed: "TensorSpec | None" = None
    # an offsets input drawn by a routing dist (judge/inputs.py): the rows routed, an
    # expression over the shape symbols (R = tokens x topk), and the experts a token picks
    rows: Expr | None = None
    topk: int | None = None
    # (input, fraction): that share of the elements set to the index of the largest value of the
    # named input's last dimension at the same leading index (targets a model predicts: a
    # cross-entropy loss near 0, where an absolute error shows); `special` elements are kept
    argmax: tuple[str, float] | None = None
    # the routing input whose tokens this input's rows gather (a MoE layer's x: each token's row
    # once in the group of every expert it picks; judge/inputs.py `_gathered`)
    gather: str | None = None

    def drawn(self, timed: bool = False) -> "TensorSpec":
        """The tensor as its values are drawn: for timed calls (`timed`) or for verification."""
        return self.timed if timed and self.timed is not None else self


@dataclass(frozen=True)
class ScalarSpec:
    name: str
    value: Any
    type: str  # i32 | i64 | f32 | f64


@dataclass(frozen=True)
class OpSpec:
    reference: str  # "module:function"
    dtype: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    scalars: tuple[ScalarSpec, ...]
    shapes: tuple[dict, ...]  # tuned and timed
    extra_shapes: tuple[dict, ...]  # verified only: odd sizes, one row, the longest row
    atol: float
    rtol: float
    bytes: Expr
    flops: Expr | None
    in_place: bool = False
    notes: str = ""
    triton: str | None = None  # "module:function": a Triton kernel for `pipe compare` (imported only there)
    # op.arms: name -> "module:function", more arms for `pipe compare` (imported only there), in order
    arms: dict = field(default_factory=dict)
    # op.fallbacks: names of arms (op.arms, or "triton" for op.triton) that the range table may
    # take instead of the reference where one is faster; each must be exact on every input of
    # the domain (pipe compare verifies it on the judge's inputs before it counts)
    fallbacks: tuple = ()
    # op.traffic: which of the profile's bandwidths bounds the op ("copy": bytes read plus
    # written, the default; "read": an op that reads nearly all its bytes, a decode attention)
    traffic: str = "copy"
    held_out_shapes: tuple[dict, ...] = ()  # never tuned on: pipe compare checks the dispatch table there
    ulps: float = 1.0  # error budget in units of the output dtype's rounding at the reference (judge/verify.py)
    floor: float = 2.0 ** -7  # atol is at most floor x the output's mean magnitude (judge/verify.py)
    # op.domain: symbol -> Domain, the sizes the exported op serves (empty: the listed shapes only)
    domain: dict = field(default_factory=dict)
    named: int = 0  # with a domain: shapes[:named] are the listed sizes, the rest the tuning grid
    # op.domain_where: an expression over the domain's symbols (and elem) that every size of the
    # domain satisfies besides its ranges (a cross-axis bound, such as B * L <= 2 ** 21)
    domain_where: Expr | None = None
    # op.batch_invariant: the shape symbol of the batch axis (the leading dimension of every
    # tensor that has it) whose rows the judge checks are computed independently of each
    # other (judge/invariance.py); `batch_required`: a kernel whose rows are not is wrong
    batch_axis: str | None = None
    batch_required: bool = False
    # op.tolerance.gemm_k: the reduction length of a GEMM with fp32 accumulation, an expression
    # over the shape symbols; the error budget is then judge/verify.GemmBudget's (the reference
    # gives the GEMM's parts), not atol/rtol's
    gemm_k: Expr | None = None
    # op.channel_pairs: pairs of input places (into `inputs`) multiplied together along their last
    # dimension (attention's q and k); verification's outlier channels of each are made small in
    # the other (judge/inputs.py, `partners`)
    channel_pairs: tuple = ()

    def gemm_k_at(self, shape: dict) -> int:
        """op.tolerance.gemm_k at a shape (spec.py checked it is a whole number >= 1 there)."""
        return int(self.gemm_k(self.shape_env(shape)))

    def compare_arms(self, triton: bool = True, arms: bool = True) -> dict[str, str]:
        """The user's arms of pipe compare, name -> "module:function": op.triton (named
        "triton") unless `triton` is false, then op.arms unless `arms` is false."""
        out = {"triton": self.triton} if (triton and self.triton) else {}
        if arms:
            out.update(self.arms)
        return out

    @property
    def symbols(self) -> list[str]:
        return list(self.shapes[0])

    @property
    def all_shapes(self) -> tuple[dict, ...]:
        return self.shapes + self.extra_shapes

    def shape_env(self, shape: dict) -> dict:
        return {**shape, "elem": DTYPE_BYTES[self.dtype]}

    @property
    def named_shapes(self) -> tuple[dict, ...]:
        """The sizes the spec lists (without a domain, every timed shape)."""
        return self.shapes[:self.named] if self.domain else self.shapes

    @property
    def axes(self) -> list[str]:
        """The domain's range symbols (the tuning grid's axes), in shape-symbol order."""
        return [s for s in self.symbols if s in self.domain and self.domain[s].tune is None]

    def point(self, axes_env: dict, level: int = 0) -> dict:
        """The tuning point (a full shape) at values of the grid axes, at a `tune` level."""
        return complete(self.domain, self.symbols, axes_env, DTYPE_BYTES[self.dtype], level, self.domain_where)

    @property
    def levels(self) -> tuple[str | None, int]:
        """(the symbol whose `tune` has several levels, or None; the number of levels)."""
        return levels_of(self.domain)

    def level_of(self, shape: dict) -> int | None:
        """The `tune` level whose tuning point at this shape's axis values is the shape."""
        env = {a: shape[a] for a in self.axes}
        return next((i for i in range(self.levels[1]) if self.point(env, i) == shape), None)

    def row_cap(self, s: str, shape: dict) -> int | None:
        """The largest value a `tune` symbol with no max serves at a shape's axis values:
        ROWS_CAP times its tuning value there. The judge verifies up to it (judge/domain.wide_rows)
        and no further, so the table and the exported op serve up to it and fall back above: a
        kernel wrong only beyond every row count ever drawn was shipped while the rows had no
        bound (session 38's second red team). None for any other symbol."""
        d = self.domain.get(s)
        if d is None or d.tune is None or d.max is not None:
            return None
        t = self.point({a: shape[a] for a in self.axes if a in shape})[s]
        return ROWS_CAP * max(d.min, int(t))

    def in_domain(self, shape: dict) -> str | None:
        """Why a shape lies outside the domain, or None."""
        for s, d in self.domain.items():
            v = shape.get(s)
            if v is None or v < d.min or (d.max is not None and v > d.max):
                return f"{s}={v} is outside [{d.min}, {d.max if d.max is not None else 'any'}]"
            cap = self.row_cap(s, shape)
            if cap is not None and v > cap:
                return (f"{s}={v} is above {cap}, {ROWS_CAP} times its tuning value at these sizes (op.domain "
                        f"gives {s} no max: what is served is what the judge verifies)")
        if not self.where_holds(shape):
            return (f"op.domain_where '{self.domain_where.text}' does not hold at "
                    f"{', '.join(f'{k}={v}' for k, v in shape.items())}")
        return None

    def where_holds(self, shape: dict) -> bool:
        """Whether op.domain_where holds at a shape (always without one; an expression that
        cannot be worked out at the shape does not hold)."""
        return holds(self.domain_where, shape, DTYPE_BYTES[self.dtype])


# a `tune` symbol with no max (the rows: "any M") serves up to this many times its tuning value
# at the axes' values, and the judge verifies up to there (Op.row_cap)
ROWS_CAP = 8


@dataclass(frozen=True)
class Domain:
    """One symbol of op.domain: the values the exported op serves, and at the tuning points
    either a grid axis (log-spaced from min to max, plus the typical values) or `tune`, a
    value worked out from the axes."""
    min: int
    max: int | None
    typical: tuple[int, ...] = ()
    tune: Expr | None = None
    # more `tune` expressions: each a level of its own, tuned at the same axis values (the
    # table chooses per level, and between levels by this symbol's value)
    levels: tuple[Expr, ...] = ()


def levels_of(domain: dict) -> tuple[str | None, int]:
    """The symbol whose `tune` lists several levels, and how many levels (1: none)."""
    for s, d in domain.items():
        if d.levels:
            return s, 1 + len(d.levels)
    return None, 1


def holds(where: Expr | None, shape: dict, dtype_bytes: int) -> bool:
    """Whether op.domain_where holds at a shape (True without one; False where it cannot be
    worked out)."""
    if where is None:
        return True
    try:
        return bool(where({**shape, "elem": dtype_bytes}))
    except ExprError:
        return False


def _lower_tune(where: Expr, domain: dict, symbols: list[str], shape: dict, dtype_bytes: int) -> dict:
    """A tuning point where op.domain_where does not hold, its `tune` sizes lowered until it
    does: each in turn (symbol order) to the largest value from its min up to its value at the
    point that satisfies the constraint, by bisection (a bound such as rows x length <= C);
    a symbol at whose min it still fails goes to its min and the next is lowered. Grid axes
    are never moved: a point still outside is dropped by the caller."""
    shape = dict(shape)
    for s in symbols:
        if holds(where, shape, dtype_bytes):
            break
        d = domain.get(s)
        if d is None or d.tune is None:
            continue
        lo, hi = d.min, shape[s]
        if holds(where, {**shape, s: lo}, dtype_bytes):
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if holds(where, {**shape, s: mid}, dtype_bytes):
                    lo = mid
                else:
                    hi = mid
        shape[s] = lo
    return shape


def complete(domain: dict, symbols: list[str], env: dict, dtype_bytes: int, level: int = 0,
             where: Expr | None = None) -> dict:
    """A full shape from values of the grid axes: each `tune` symbol at its level's value
    (level 0 the main one; a symbol with one expression has it at every level), clamped
    into its range, and lowered (`_lower_tune`) where op.domain_where (`where`) does not
    hold there. The shape may still lie outside `where` (the axes' values alone break it):
    callers check."""
    env = {**env, "elem": dtype_bytes}
    for s in symbols:
        d = domain.get(s)
        if d is None or d.tune is None:
            if s not in env and d is not None:
                env[s] = d.min
            continue
        exprs = (d.tune, *d.levels)
        v = int((exprs[level] if level < len(exprs) else d.tune)(env))
        env[s] = max(d.min, v if d.max is None else min(d.max, v))
    shape = {s: env[s] for s in symbols}
    if where is not None and not holds(where, shape, dtype_bytes):
        shape = _lower_tune(where, domain, symbols, shape, dtype_bytes)
    return shape


def grid_points(domain: dict, symbols: list[str], per_octave: float, dtype_bytes: int,
                where: Expr | None = None) -> list[dict]:
    """The tuning points of a domain: the product of each axis's log-spaced values (per_octave
    of them per doubling, the min and max included, and the typical values), each completed
    with the `tune` symbols, clamped into their own ranges; with several `tune` levels, the
    main level's points first, then each further level's. With op.domain_where (`where`),
    the `tune` sizes are lowered to satisfy it (`complete`) and a point whose axis values
    break it is dropped: the grid keeps every other point where it was."""
    import itertools
    import math

    axes = [s for s in symbols if s in domain and domain[s].tune is None]
    values = []
    for s in axes:
        d = domain[s]
        lo, hi = d.min, d.max
        n = max(1, math.ceil(math.log2(hi / lo) * per_octave)) if hi > lo else 0
        vs = {lo, hi, *d.typical} | {int(round(lo * (hi / lo) ** (i / n))) for i in range(1, n)} if n else {lo}
        values.append(sorted(v for v in vs if lo <= v <= hi))
    out = []
    for level in range(levels_of(domain)[1]):
        for combo in itertools.product(*values):
            shape = complete(domain, symbols, dict(zip(axes, combo)), dtype_bytes, level, where)
            if shape not in out and holds(where, shape, dtype_bytes):
                out.append(shape)
    return out


@dataclass(frozen=True)
class ScratchSpec:
    """kernel.scratch: a workspace the runner allocates (zeroed, once) and passes as a pointer;
    the kernel must leave it zero after every call (docs/judge.md)."""
    name: str
    shape: tuple[Expr, ...]  # over parameters, shape symbols and derived values, as the launch geometry
    dtype: str


def scratch_dim(value, name: str, i: int) -> int:
    """A scratch dimension as the launch works it out: a whole number of at least 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
        raise ExprError(f"kernel.scratch.{name}.shape[{i}] is {value!r}: a dimension must be a whole number "
                        "of at least 1")
    return int(value)


@dataclass(frozen=True)
class TensorMapSpec:
    """kernel.tensor_maps: a TMA descriptor (CUtensorMap, 128 bytes) of an op tensor, which the
    runner builds on its own buffers and passes by value (the kernel's `const __grid_constant__
    CUtensorMap` parameter). The box is in the tensor's dimension order, outermost first; an
    element outside the tensor reads as zero."""
    name: str
    tensor: str
    box: tuple[Expr, ...]  # over parameters, shape symbols and derived values, as the launch geometry
    swizzle: int  # 0 (none), 32, 64 or 128 bytes
    dtype: str  # the tensor's
    dims: tuple[Expr, ...]  # the tensor's shape (its strides must suit the tensor copy)
    # where it holds (over parameters, shape symbols and derived values) the kernel reads the
    # map; elsewhere the runner passes a placeholder descriptor in its place, never read (one
    # template whose paths differ in how they load: a pointer path and a tensor-copy path)
    when: Expr | None = None

    @property
    def elem(self) -> int:
        """The tensor's element size in bytes."""
        return DTYPE_BYTES[self.dtype]


TMA_BOX_MAX = 256  # elements a box dimension (cuTensorMapEncodeTiled)


def tensor_map_box(values, tm: "TensorMapSpec") -> list[int]:
    """A map's box as the launch works it out: whole numbers 1..256 a dimension, the innermost
    a multiple of 16 bytes and, with a swizzle, within its span. ExprError otherwise."""
    box = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or not 1 <= v <= TMA_BOX_MAX:
            raise ExprError(f"kernel.tensor_maps.{tm.name}.box[{i}] is {v!r}: a box dimension must be a whole "
                            f"number from 1 to {TMA_BOX_MAX}")
        box.append(int(v))
    inner = box[-1] * tm.elem
    if inner % 16:
        raise ExprError(f"kernel.tensor_maps.{tm.name}.box: its innermost dimension is {inner} bytes; the tensor "
                        "copy moves whole 16-byte units")
    if tm.swizzle and inner > tm.swizzle:
        raise ExprError(f"kernel.tensor_maps.{tm.name}.box: its innermost dimension is {inner} bytes, more than "
                        f"the {tm.swizzle}-byte swizzle spans")
    return box


def tensor_map_strides(dims, tm: "TensorMapSpec") -> None:
    """ExprError unless every stride of the (contiguous) tensor but the innermost is a multiple
    of 16 bytes, as the tensor copy needs."""
    stride = tm.elem
    for i in range(len(dims) - 1, 0, -1):
        stride *= int(dims[i])
        if stride % 16 and int(dims[i - 1]) > 1:
            raise ExprError(f"'{tm.tensor}' has a stride of {stride} bytes in dimension {i - 1}; the tensor "
                            "copy needs multiples of 16 (op.domain_where can keep such sizes out)")


@dataclass(frozen=True)
class KernelSpec:
    backend: str
    template_path: str
    template: str = field(repr=False)  # flat: include lines replaced by the files' text (render.flatten)
    entry: str
    args: tuple[str, ...]
    grid: tuple[Expr, ...] = ()
    block: tuple[Expr, ...] = ()
    cluster: tuple[Expr, ...] = ()  # thread-block cluster dims (CUDA); the grid counts blocks
    shared_mem: Expr | None = None
    options: tuple[str, ...] = ()
    derive: tuple[tuple[str, Expr], ...] = ()  # named values from params and shape symbols, in order
    template_segments: tuple = field(default=(), repr=False)  # where each flat line came from (render.locate)
    serves: Expr | None = None  # with op.domain: the shapes a configuration serves (params, derived, sizes)
    scratch: tuple[ScratchSpec, ...] = ()  # runner-owned workspaces, each passed as a pointer (in args)
    tensor_maps: tuple[TensorMapSpec, ...] = ()  # TMA descriptors of op tensors, passed by value (in args)

    def derived(self, env: dict) -> dict:
        """The derived values for one (params + shape) environment."""
        out: dict = {}
        for name, e in self.derive:
            out[name] = e({**env, **out})
        return out

    def scratch_shapes(self, env: dict) -> dict[str, list[int]]:
        """name -> shape of every scratch buffer for one launch's environment (parameters, shape
        symbols and derived values, as the geometry is worked out); ExprError for a dimension
        that is not a whole number of at least 1."""
        return {s.name: [scratch_dim(d(env), s.name, i) for i, d in enumerate(s.shape)] for s in self.scratch}

    def tensor_map_boxes(self, env: dict) -> dict[str, list[int]]:
        """name -> box of every tensor map for one launch's environment; ExprError for a box the
        tensor copy cannot move (tensor_map_box)."""
        return {m.name: tensor_map_box([d(env) for d in m.box], m) for m in self.tensor_maps
                if m.when is None or m.when(env)}

    def serves_shape(self, params: dict, shape: dict, elem: int) -> bool:
        """Whether a configuration serves a shape (kernel.serves; every shape without one).
        A derived value that cannot be worked out for the shape means it does not."""
        try:
            return self.serves_or_raise(params, shape, elem)
        except ExprError:
            return False

    def serves_or_raise(self, params: dict, shape: dict, elem: int) -> bool:
        """serves_shape, with the ExprError of a value that cannot be worked out raised."""
        if self.serves is None:
            return True
        env = {**shape, **params, "elem": elem}
        env.update(self.derived(env))
        return bool(self.serves(env))


@dataclass(frozen=True)
class RuntimeSpec:
    mode: str = "auto"  # auto | graph | direct
    cache: str = "cold"  # cold | warm
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    checks: int = 2  # fresh-input verification rounds per shape
    timeout_s: float = 60.0  # watchdog for one trial in the worker
    # CPU backend: torch's intra-op threads for every torch arm (the baseline, pipe compare's
    # eager and compile), so torch and a candidate are timed with the same thread count
    # (default: the hardware profile's cores)
    threads: int | None = None


@dataclass(frozen=True)
class ForbiddenSpec:
    named: tuple[str, ...] = ()
    patterns: tuple[forbid_mod.Pattern, ...] = ()
    rules: tuple[forbid_mod.Rule, ...] = ()


@dataclass(frozen=True)
class AgentSpec:
    strategy: str
    seed: int = 0
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class GoalSpec:
    metric: str | None
    at_least: float | None
    at_most: float | None
    trials: int | None
    minutes: float | None
    patience: int | None
    # false: a met target does not stop the run (it goes on to its budget or patience for
    # each shape's fastest kernel); the exit code still says whether it was met
    stop_when_met: bool = True

    def met(self, value: float | None) -> bool:
        if self.metric is None or value is None:
            return False
        if self.at_least is not None:
            return value >= self.at_least
        return value <= self.at_most

    def describe(self) -> str:
        if self.metric is None:
            return "no target (runs to budget)"
        return f"{self.metric} {'>=' if self.at_least is not None else '<='} " \
               f"{self.at_least if self.at_least is not None else self.at_most}"


@dataclass(frozen=True)
class Spec:
    name: str
    description: str
    path: str
    hash: str
    hw: HwProfile
    op: OpSpec
    kernel: KernelSpec
    runtime: RuntimeSpec
    space: Space
    start: dict | None  # the first of `starts`: the default fill of pipe render and pipe eval
    forbidden: ForbiddenSpec
    agent: AgentSpec
    goal: GoalSpec
    baseline: str
    raw: dict = field(repr=False, compare=False)
    hash_parts: dict = field(default_factory=dict, repr=False, compare=False)  # part -> digest (see load)
    starts: tuple = ()  # search.start: the configurations a run tries first, in order
    folder: str = ""  # the spec file's folder, absolute: where its reference module and template are looked for

    @property
    def home(self) -> str:
        """The spec's folder (absolute), for specs made before `folder` was kept."""
        return self.folder or str(Path(self.path).resolve().parent)


def _taken_names(op, params, symbols, derive) -> dict[str, str]:
    """The spec's names a runner-owned argument (a scratch buffer, a tensor map) may not take:
    name -> what it already is."""
    taken: dict[str, str] = {v: "a runner variable" for v in (*render.DTYPE_VARS, "elem")}
    taken.update({n: "a derived value" for n, _ in derive})
    taken.update({p: "a search parameter" for p in params})
    taken.update({s: "a shape symbol" for s in symbols})
    if op is not None:
        taken.update({s.name: "a scalar" for s in op.scalars})
        taken.update({t.name: "an output" for t in op.outputs})
        taken.update({t.name: "an input" for t in op.inputs})
    return taken


def _checked_dim(e: Expr, name: str, i: int):
    """A scratch dimension's expression that fails (ExprError) unless it gives a whole number >= 1."""
    def f(env: dict) -> int:
        return scratch_dim(e(env), name, i)
    return f


def _takes_parts(fn) -> bool:
    """Whether a reference takes the `parts` keyword (op.tolerance.gemm_k)."""
    import inspect

    try:
        ps = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True  # a builtin: cannot tell, the judge's call says
    return "parts" in ps or any(p.kind is p.VAR_KEYWORD for p in ps.values())


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _show(p: Path) -> str:
    """A path as a user would type it: relative to the working folder when inside it."""
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


class _Checker:
    """Semantic checks over schema-valid data; collects diagnostics."""

    def __init__(self, loc: yamlsrc.Located):
        self.loc = loc
        self.d = loc.data
        self.diags: list[Diagnostic] = []
        self.near = Path(loc.file).resolve().parent

    def err(self, path: tuple, msg: str, prefer_key: bool = False) -> None:
        self.diags.append(self.loc.diag(path, msg, prefer_key))

    def expr(self, path: tuple, text: Any, scope: set[str]) -> Expr | None:
        try:
            return compile_expr(text, scope)
        except ExprError as e:
            self.err(path, str(e))
            return None

    def written_symbols(self) -> set[str]:
        """The shape symbols the spec's op names, read from its text alone (op.shapes' keys,
        op.domain's), for checking the rest of a spec whose op has errors of its own."""
        o = self.d.get("op") if isinstance(self.d, dict) else None
        if not isinstance(o, dict):
            return set()
        out = set()
        for sh in o.get("shapes") or []:
            if isinstance(sh, dict):
                out |= {k for k in sh if isinstance(k, str)}
        if isinstance(o.get("domain"), dict):
            out |= {k for k in o["domain"] if isinstance(k, str)}
        return out

    def build(self) -> Spec | None:
        d = self.d
        hw = self.hardware()
        op = self.op()
        # with an error in op (its bytes, say), the shape symbols as written, so that the kernel's
        # expressions are not also reported for naming them
        symbols = set(op.shapes[0]) if op else self.written_symbols()
        params, space = self.space(symbols, op)
        kernel = self.kernel(hw, op, params, symbols, space)
        runtime = self.runtime()
        forbidden = self.forbidden(params, symbols, kernel)
        agent = self.agent()
        goal = self.goal(hw, op)
        starts = self.starts(space)
        if op is not None and hw is not None and op.traffic == "read" and hw.read_bandwidth is None:
            self.err(("op", "traffic"), f"op.traffic 'read' needs the read-only bandwidth in the profile "
                                        f"'{hw.name}' (bandwidth.read_bytes_per_s), which it does not give")
        if op is not None and op.domain and d.get("baseline", "reference") == "none":
            self.err(("baseline",), "op.domain needs the reference's baseline: the dispatch table falls back "
                                    "to it wherever no kernel is faster", prefer_key=True)
        if self.diags:
            return None
        # Everything a verdict depends on: the spec, the template, the hardware profile's
        # numbers and the reference's code. A change to any of them makes a new run.
        whole = {"spec": d, "template": kernel.template, "hardware": hw.data,
                 "reference": userpath.reference_source(op.reference, self.near)}
        spec_hash = _digest(whole)
        # each part's own digest: a run may take verdicts from a run that differs in the
        # template alone, for kernels whose rendered source is the same (pipe record --reuse)
        parts = {k: _digest(v) for k, v in whole.items()}
        return Spec(name=d["name"], description=d.get("description", ""), path=self.loc.file,
                    hash=spec_hash, hw=hw, op=op, kernel=kernel, runtime=runtime, space=space,
                    start=starts[0] if starts else None, forbidden=forbidden, agent=agent, goal=goal,
                    baseline=d.get("baseline", "reference"), raw=d, hash_parts=parts, starts=starts,
                    folder=str(self.near))

    def hardware(self) -> HwProfile | None:
        name = self.d["hardware"]
        p = find_profile(name, self.near)
        if p is None:
            self.err(("hardware",), f"no hardware profile hw_profiles/{name}.yaml near {self.loc.file} "
                                    "or in pipe's own hw_profiles/")
            return None
        try:
            return load_profile(p)
        except SpecError as e:
            self.diags.extend(e.diagnostics)
            self.err(("hardware",), f"hardware profile {p} is invalid (see above)")
            return None

    def op(self) -> OpSpec | None:
        o = self.d["op"]
        ok = True
        shapes = o["shapes"]
        extra = o.get("extra_shapes", [])
        held = o.get("held_out_shapes", [])
        symbols = list(shapes[0])
        for key, group in (("shapes", shapes), ("extra_shapes", extra), ("held_out_shapes", held)):
            for i, s in enumerate(group):
                if set(s) != set(symbols):
                    self.err(("op", key, i), f"shape symbols {sorted(s)} differ from the first shape's {sorted(symbols)}")
                    ok = False
        scope = set(symbols) | {"elem"}
        if "elem" in symbols:
            self.err(("op", "shapes", 0, "elem"), "'elem' is reserved (bytes per element of the dtype)")
        dtype = o["dtype"]
        used_syms: set[str] = set()

        def tensor(kind: str, name: str, t: dict) -> TensorSpec | None:
            base = ("op", kind, name)
            dims = [self.expr(base + ("shape", i), x, scope) for i, x in enumerate(t["shape"])]
            if any(x is None for x in dims):
                return None
            for x in dims:
                used_syms.update(x.names)
            tdtype = t.get("dtype", dtype)
            dists = t.get("dist", ["randint"] if tdtype in INT_DTYPES else ["normal", "uniform", "outliers"])
            dists = tuple([dists] if isinstance(dists, str) else dists)
            self.int_dists(base + ("dist",), tdtype, dists)
            if "randint" in dists and ("low" not in t or "high" not in t):
                self.err(base, "dist 'randint' needs low and high (expressions over the shape symbols)")
            low = self.expr(base + ("low",), t["low"], scope) if "low" in t else None
            high = self.expr(base + ("high",), t["high"], scope) if "high" in t else None
            special = None
            if "special" in t:
                sp_ = t["special"]
                special = (sp_["value"], float(sp_["fraction"]))
                if tdtype in INT_DTYPES and sp_["value"] != int(sp_["value"]):
                    self.err(base + ("special", "value"), f"an integer tensor ({tdtype}) needs an integer value")
            rows, topk = self.routing_keys(kind, base, t, tdtype, dims, scope)
            argmax = self.argmax_key(kind, base, t, tdtype, dims, earlier)
            gather = t.get("gather")
            if gather is not None and kind != "inputs":
                self.err(base + ("gather",), "`gather` draws an input's rows; an output has none", prefer_key=True)
                gather = None
            spec_ = TensorSpec(name, tuple(dims), tdtype, dists, low, high, special, rows=rows, topk=topk,
                               argmax=argmax, gather=gather)
            if "timed" in t:
                spec_ = timed_override(kind, base, t, spec_)
            return spec_

        def timed_override(kind: str, base: tuple, t: dict, main: TensorSpec) -> TensorSpec:
            """An input's `timed` override: the same tensor, its dist, low or high replaced for
            the values of timed calls."""
            o_ = t["timed"]
            path = base + ("timed",)
            if kind != "inputs":
                self.err(path, "`timed` gives the values of an input in timed calls; an output has none",
                         prefer_key=True)
                return main
            dists = o_.get("dist", main.dists)
            dists = tuple([dists] if isinstance(dists, str) else dists)
            if "dist" in o_:
                self.int_dists(path + ("dist",), main.dtype, dists)
            bounds = [k for k in ("low", "high") if k in o_]
            if bounds and "randint" not in dists:
                self.err(path + (bounds[0],), f"'{bounds[0]}' bounds dist 'randint' only; input '{main.name}' "
                                              f"({main.dtype}) is drawn from {', '.join(dists)} in timed calls: "
                                              "give `timed.dist` as well, or leave the bounds out")
            low = self.expr(path + ("low",), o_["low"], scope) if "low" in o_ else main.low
            high = self.expr(path + ("high",), o_["high"], scope) if "high" in o_ else main.high
            if "randint" in dists and (low is None or high is None) and "randint" not in main.dists:
                self.err(path, "dist 'randint' needs low and high (here or beside dist)")
            return dataclasses.replace(main, timed=dataclasses.replace(main, dists=dists, low=low, high=high))

        earlier: dict[str, TensorSpec] = {}  # the inputs built so far (an `argmax` names one of them)
        for n, t in o["inputs"].items():
            spec_ = tensor("inputs", n, t)
            if spec_ is not None:
                earlier[n] = spec_
        inputs = tuple(earlier.get(n) for n in o["inputs"])
        outputs = tuple(tensor("outputs", n, t) for n, t in o["outputs"].items())
        dup = set(o["inputs"]) & set(o["outputs"])
        for n in dup:
            self.err(("op", "outputs", n), f"'{n}' is both an input and an output", prefer_key=True)
        scalars = tuple(ScalarSpec(n, s["value"], s["type"]) for n, s in o.get("scalars", {}).items())
        for s in scalars:
            want = (int,) if s.type.startswith("i") else (int, float)
            if isinstance(s.value, bool) or not isinstance(s.value, want):
                self.err(("op", "scalars", s.name, "value"), f"value {s.value!r} does not fit type {s.type}")
            if s.name in symbols:
                self.err(("op", "scalars", s.name), f"scalar '{s.name}' shadows a shape symbol", prefer_key=True)
        unused = set(symbols) - used_syms
        for u in sorted(unused):
            self.err(("op", "shapes", 0, u), f"shape symbol '{u}' is used by no input or output shape")
        nbytes = self.expr(("op", "bytes"), o["bytes"], scope)
        flops = self.expr(("op", "flops"), o["flops"], scope) if "flops" in o else None
        for path, e in ((("op", "bytes"), nbytes), (("op", "flops"), flops)):
            if e is not None:
                for i, s in enumerate(shapes + extra + held):
                    try:
                        v = e({**s, "elem": DTYPE_BYTES[dtype]})
                        if not isinstance(v, (int, float)) or v <= 0:
                            self.err(path, f"must be positive; is {v!r} for shape {i}")
                    except ExprError as ex:
                        self.err(path, f"shape {i}: {ex}")
        ref = o["reference"]
        self.reference(ref, inputs)
        for name in o.get("arms") or {}:
            if name in RESERVED_ARMS:
                self.err(("op", "arms", name), f"arm name '{name}' is taken by a built-in arm of pipe compare "
                         f"({', '.join(RESERVED_ARMS)}); use op.triton for the Triton kernel", prefer_key=True)
        for i, name in enumerate(o.get("fallbacks") or ()):
            known = {**({"triton": o["triton"]} if o.get("triton") else {}), **(o.get("arms") or {})}
            if name not in known:
                self.err(("op", "fallbacks", i), f"'{name}' is not an arm of this spec (op.arms"
                         f"{', op.triton as triton' if o.get('triton') else ''}: {', '.join(known) or 'none'})")
        if o.get("fallbacks") and not o.get("domain"):
            self.err(("op", "fallbacks"), "fallbacks are chosen by the range table: they need op.domain",
                     prefer_key=True)
        atol, rtol = DEFAULT_TOL.get(dtype, (0.0, 0.0))
        tol = o.get("tolerance", {})
        domain, timed, where = self.domain(o, symbols, shapes, extra, held, dtype)
        if None in inputs or None in outputs or nbytes is None or not ok or domain is None:
            return None
        self.randint_bounds(inputs, timed + list(extra) + list(held), dtype)
        self.perm_sizes(inputs, timed + list(extra) + list(held), dtype)
        self.routing_sizes(inputs, timed + list(extra) + list(held), dtype)
        self.gather_keys(inputs, timed + list(extra) + list(held), dtype)
        gemm_k = self.gemm_k(o, scope, outputs, timed + list(extra) + list(held), dtype)
        batch_axis, batch_required = self.batch_invariant(o, symbols, inputs, outputs, timed + list(extra))
        pairs = self.channel_pairs(o, inputs, timed + list(extra) + list(held), dtype, gemm_k)
        return OpSpec(reference=ref, dtype=dtype, inputs=inputs, outputs=outputs, scalars=scalars,
                      batch_axis=batch_axis, batch_required=batch_required,
                      domain=domain, named=len(shapes), domain_where=where,
                      shapes=tuple(dict(s) for s in timed), extra_shapes=tuple(dict(s) for s in extra), atol=float(tol.get("atol", atol)),
                      rtol=float(tol.get("rtol", rtol)), bytes=nbytes, flops=flops,
                      in_place=bool(o.get("in_place", False)), notes=o.get("notes", ""), triton=o.get("triton"),
                      arms=dict(o.get("arms") or {}), traffic=str(o.get("traffic", "copy")),
                      fallbacks=tuple(o.get("fallbacks") or ()),
                      held_out_shapes=tuple(dict(s) for s in held), ulps=float(tol.get("ulps", 1.0)),
                      floor=float(tol.get("floor", 2.0 ** -7)), gemm_k=gemm_k, channel_pairs=pairs)

    def int_dists(self, path: tuple, tdtype: str, dists: tuple) -> None:
        """Integer tensors draw from `randint` (low, high) or `perm`; `perm` draws integers only."""
        if tdtype in INT_DTYPES and any(x not in INT_DISTS for x in dists):
            self.err(path, f"integer tensors ({tdtype}) take dist 'randint' with low and high, or 'perm', or a "
                           f"routing dist ({', '.join(ROUTING_DISTS)}) with rows and topk")
        elif tdtype not in INT_DTYPES and "perm" in dists:
            self.err(path, f"dist 'perm' (a permutation of 0 .. n - 1) draws integers; this tensor is {tdtype}: "
                           "give it an integer dtype (int32, int64)")
        elif tdtype == "bool" and "perm" in dists:
            self.err(path, "dist 'perm' (a permutation of 0 .. n - 1) cannot be bool")

    def argmax_key(self, kind: str, base: tuple, t: dict, tdtype: str, dims: list,
                   earlier: dict) -> tuple[str, float] | None:
        """`argmax: {of, fraction}`: an integer input, some of whose elements are the index of the
        largest value along the last dimension of an input listed before it (`earlier`, by name),
        whose other dimensions are this input's own (the same expressions)."""
        if "argmax" not in t:
            return None
        a = t["argmax"]
        path = base + ("argmax",)
        if kind != "inputs":
            self.err(path, "`argmax` draws an input's values; an output has none", prefer_key=True)
            return None
        if tdtype not in INT_DTYPES or tdtype == "bool":
            self.err(path, f"`argmax` sets indices: an integer input, not {tdtype}", prefer_key=True)
            return None
        src = earlier.get(a["of"])
        if src is None:
            before = ", ".join(earlier) or "none"
            self.err(path + ("of",), f"'{a['of']}' is not an input listed before '{base[-1]}' (before it: {before})")
            return None
        if src.dtype in INT_DTYPES:
            self.err(path + ("of",), f"'{a['of']}' is {src.dtype}: `argmax` takes the largest of a floating input")
            return None
        want = [e.text for e in src.shape[:-1]]
        if len(src.shape) < 2 or [e.text for e in dims] != want:
            self.err(path + ("of",), f"'{a['of']}' has shape [{', '.join(e.text for e in src.shape)}]: "
                                     f"'{base[-1]}' must have its leading dimensions, [{', '.join(want)}]")
            return None
        return a["of"], float(a["fraction"])

    def routing_keys(self, kind: str, base: tuple, t: dict, tdtype: str, dims: list,
                     scope: set) -> tuple[Expr | None, int | None]:
        """`rows` and `topk` of an offsets input drawn by a routing dist (its own or its timed
        override's): both given, on a 1-D int32 or int64 input, and only there."""
        own = t.get("dist", [])
        timed = (t.get("timed") or {}).get("dist", [])
        routed = [d for d in ([own] if isinstance(own, str) else own) + ([timed] if isinstance(timed, str) else timed)
                  if d in ROUTING_DISTS]
        keys = [k for k in ("rows", "topk") if k in t]
        if kind != "inputs":
            for k in keys:
                self.err(base + (k,), f"'{k}' describes an offsets input drawn by a routing dist; an output has none",
                         prefer_key=True)
            return None, None
        if keys and not routed:
            self.err(base + (keys[0],), f"'{keys[0]}' goes with a routing dist ({', '.join(ROUTING_DISTS)}): "
                                        f"input '{base[-1]}' draws none, so nothing reads it", prefer_key=True)
            return None, None
        if not routed:
            return None, None
        good = True
        if tdtype not in ROUTING_DTYPES:
            self.err(base + ("dtype",) if "dtype" in t else base,
                     f"dist '{routed[0]}' draws per-expert cumulative row ends: an int32 or int64 input, not "
                     f"{tdtype}" + ("" if "dtype" in t else " (the op's dtype): give it `dtype: int32`"),
                     prefer_key="dtype" not in t)
            good = False
        if len(dims) != 1:
            self.err(base + ("shape",), f"dist '{routed[0]}' draws one cumulative row end per expert: a 1-D shape "
                                        f"[E], not {len(dims)}-D")
            good = False
        if "special" in t:
            self.err(base + ("special",), f"`special` would overwrite some of the cumulative ends dist "
                                          f"'{routed[0]}' draws (they must stay in order): leave it out",
                     prefer_key=True)
            good = False
        missing = [k for k in ("rows", "topk") if k not in t]
        if missing:
            self.err(base, f"dist '{routed[0]}' needs {' and '.join(missing)}: `rows`, the rows routed (an "
                           "expression over the shape symbols, tokens x topk), and `topk`, the experts each "
                           "token picks", prefer_key=True)
            good = False
        rows = self.expr(base + ("rows",), t["rows"], scope) if "rows" in t else None
        if not good or rows is None:
            return None, None
        return rows, int(t["topk"])

    def routing_sizes(self, inputs, shapes: list[dict], dtype: str) -> None:
        """Each routing input at every timed, extra and held-out shape: `rows` a whole number of
        at least 1 that its dtype holds and that `topk` divides (tokens x topk), and at least
        `topk` experts (a token picks topk distinct ones)."""
        for t in inputs:
            if t.rows is None:
                continue
            path = ("op", "inputs", t.name)
            top = {"int32": 2 ** 31 - 1, "int64": 2 ** 63 - 1}[t.dtype]
            for sh in shapes:
                env = {**sh, "elem": DTYPE_BYTES[dtype]}
                at = ", ".join(f"{k}={x}" for k, x in sh.items())
                try:
                    rows, experts = t.rows(env), t.shape[0](env)
                except ExprError as e:
                    self.err(path + ("rows",), f"at {at}: {e}")
                    break
                if isinstance(rows, bool) or not isinstance(rows, (int, float)) or rows != int(rows) or rows < 1:
                    self.err(path + ("rows",), f"rows '{t.rows.text}' is {rows!r} at {at}: the rows routed must be "
                                               "a whole number of at least 1")
                    break
                rows = int(rows)
                if rows % t.topk:
                    self.err(path + ("rows",), f"rows '{t.rows.text}' is {rows} at {at}, which topk {t.topk} does "
                                               f"not divide: the rows are tokens x topk")
                    break
                if rows > top:
                    self.err(path + ("rows",), f"rows '{t.rows.text}' is {rows} at {at}: {t.dtype} holds at most "
                                               f"{top}")
                    break
                if isinstance(experts, (int, float)) and experts < t.topk:
                    self.err(path + ("topk",), f"topk {t.topk} is more than the {experts} experts at {at}: a token "
                                               "picks topk distinct experts")
                    break

    def gather_keys(self, inputs, shapes: list[dict], dtype: str) -> None:
        """`gather: OFFS` on a floating input of two or more dimensions: OFFS is another input drawn
        by a routing dist, and this input's first dimension is OFFS's `rows` at every timed, extra
        and held-out shape (its rows are the routed rows, sorted by expert)."""
        by_name = {t.name: t for t in inputs}
        for t in inputs:
            if t.gather is None:
                continue
            path = ("op", "inputs", t.name, "gather")
            if t.dtype in INT_DTYPES or len(t.shape) < 2:
                self.err(path, f"`gather` repeats rows of a token's values: a floating input of two or more "
                               f"dimensions, not {len(t.shape)}-D {t.dtype}", prefer_key=True)
                continue
            src = by_name.get(t.gather)
            if src is None or src.rows is None:
                routed = ", ".join(n for n, u in by_name.items() if u.rows is not None) or "none"
                self.err(path, f"'{t.gather}' is not an input drawn by a routing dist (with rows and topk): "
                               f"`gather` names the routing whose tokens '{t.name}' gathers (routing inputs: {routed})")
                continue
            for sh in shapes:
                env = {**sh, "elem": DTYPE_BYTES[dtype]}
                try:
                    lead, rows = t.shape[0](env), src.rows(env)
                except ExprError:
                    break  # routing_sizes and the shapes' own checks name it
                if lead != rows:
                    at = ", ".join(f"{k}={x}" for k, x in sh.items())
                    self.err(path, f"'{t.name}' has {lead} rows at {at}, and '{t.gather}' routes {rows} "
                                   f"(its rows '{src.rows.text}'): a gathered input has a row for each routed row")
                    break

    def gemm_k(self, o: dict, scope: set, outputs, shapes: list[dict], dtype: str) -> Expr | None:
        """op.tolerance.gemm_k: an expression over the shape symbols, a whole number from 1 to
        2^22 at every timed, extra and held-out shape; alone in op.tolerance (it sets the whole
        budget); one floating output; a reference that gives the GEMM's parts (`parts=True`,
        judge/verify.GemmBudget)."""
        tol = o.get("tolerance", {})
        if "gemm_k" not in tol:
            return None
        path = ("op", "tolerance", "gemm_k")
        e = self.expr(path, tol["gemm_k"], scope)
        good = e is not None
        for k in ("atol", "rtol", "ulps", "floor"):
            if k in tol:
                self.err(("op", "tolerance", k), f"op.tolerance.gemm_k sets the whole error budget (the GEMM's, "
                                                 f"docs/judge.md): '{k}' does not apply beside it", prefer_key=True)
                good = False
        outs = [t for t in outputs if t is not None]
        if len(outs) != 1 or outs[0].dtype in INT_DTYPES:
            self.err(path, "op.tolerance.gemm_k budgets one floating output (the GEMM's, or its epilogue's); "
                           f"this op has {len(outs)} output(s)"
                           + (f", '{outs[0].name}' of {outs[0].dtype}" if len(outs) == 1 else ""))
            good = False
        if e is not None:
            for sh in shapes:
                at = ", ".join(f"{k}={x}" for k, x in sh.items())
                try:
                    v = e({**sh, "elem": DTYPE_BYTES[dtype]})
                except ExprError as ex:
                    self.err(path, f"at {at}: {ex}")
                    good = False
                    break
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or not 1 <= v <= 2 ** 22:
                    self.err(path, f"'{e.text}' is {v!r} at {at}: the reduction length must be a whole number "
                                   "from 1 to 2^22 (fp32 accumulation's bound K * 2^-23 stays below 1)")
                    good = False
                    break
        try:
            fn = userpath.load_callable(o["reference"], self.near)
        except Exception:  # noqa: BLE001 - reported at op.reference
            fn = None
        if fn is not None and not _takes_parts(fn):
            self.err(path, f"op.tolerance.gemm_k needs a reference that gives the GEMM's parts: "
                           f"{o['reference']} takes no `parts` keyword (runner/ops/reference.moe_gemm does; "
                           "docs/judge.md, \"The GEMM budget\")")
            good = False
        return e if good else None

    def perm_sizes(self, inputs, shapes: list[dict], dtype: str) -> None:
        """Each `perm` input (its own dist, and its `timed` override's) at every timed, extra and
        held-out shape: its values 0 .. numel - 1 fit its dtype."""
        for t in inputs:
            for which, v in (((), t), (("timed",), t.timed)):
                if v is None or "perm" not in v.dists or v.dtype not in PERM_MAX or (which and "perm" in t.dists):
                    continue  # (a timed override's perm is the same size as its input's: reported once)
                path = ("op", "inputs", t.name) + which + ("dist",)
                for sh in shapes:
                    env = {**sh, "elem": DTYPE_BYTES[dtype]}
                    try:
                        n = math.prod(int(d(env)) for d in v.shape)
                    except (ExprError, TypeError, ValueError):
                        break  # the shape's own check reports it
                    if n - 1 > PERM_MAX[v.dtype]:
                        at = ", ".join(f"{k}={x}" for k, x in sh.items())
                        self.err(path, f"dist 'perm' draws 0 .. {n - 1} ({n} elements at {at}); "
                                       f"{v.dtype} holds at most {PERM_MAX[v.dtype]}")
                        break

    def channel_pairs(self, o: dict, inputs, shapes: list[dict], dtype: str, gemm_k) -> tuple:
        """op.channel_pairs: ((input place, input place), ...). Each pair names two distinct
        floating inputs of two or more dimensions whose last dimensions are equal at every verified
        shape (the channels they are multiplied along), each input in one pair at most; not beside
        op.tolerance.gemm_k, whose activation and weights the judge pairs already."""
        pairs = o.get("channel_pairs")
        if not pairs:
            return ()
        if gemm_k is not None:
            self.err(("op", "channel_pairs"), "op.tolerance.gemm_k pairs a GEMM's activation with its weights "
                     "already (outlier channels small in the weights); op.channel_pairs is for other products, "
                     "such as attention's q and k", prefer_key=True)
            return ()
        place = {t.name: i for i, t in enumerate(inputs)}
        out, seen = [], {}
        for n, pair in enumerate(pairs):
            good = True
            for j, name in enumerate(pair):
                path = ("op", "channel_pairs", n, j)
                t = inputs[place[name]] if name in place else None
                if t is None:
                    self.err(path, f"'{name}' is not an input (they are {', '.join(place)})")
                    good = False
                elif (t.dtype or dtype) in INT_DTYPES or len(t.shape) < 2:
                    self.err(path, f"input '{name}' is not a floating tensor of two or more dimensions: "
                             "op.channel_pairs names inputs multiplied together along their last dimension")
                    good = False
                elif name in seen:
                    self.err(path, f"input '{name}' is already in pair {seen[name]}: an input pairs with one "
                             "other at most")
                    good = False
            if not good:
                continue
            if pair[0] == pair[1]:
                self.err(("op", "channel_pairs", n), f"'{pair[0]}' is paired with itself: a pair names two inputs")
                continue
            a, b = (inputs[place[x]] for x in pair)
            for sh in shapes:
                env = {**sh, "elem": DTYPE_BYTES[dtype]}
                try:
                    la, lb = a.shape[-1](env), b.shape[-1](env)
                except ExprError:  # the shapes' own checks name it
                    break
                if la != lb:
                    at = ", ".join(f"{k}={x}" for k, x in sh.items())
                    self.err(("op", "channel_pairs", n), f"the last dimensions of '{a.name}' ({a.shape[-1].text}"
                             f" = {la}) and '{b.name}' ({b.shape[-1].text} = {lb}) differ at {at}: a pair is "
                             "multiplied along the same channels", prefer_key=True)
                    good = False
                    break
            if good:
                seen.update({pair[0]: n, pair[1]: n})
                out.append((place[pair[0]], place[pair[1]]))
        return tuple(out)

    def batch_invariant(self, o: dict, symbols: list[str], inputs, outputs,
                        verified: list[dict]) -> tuple[str | None, bool]:
        """op.batch_invariant: (the batch axis, whether invariance is required). The axis is a
        shape symbol; every tensor that has it has it as its leading dimension, on its own and
        nowhere else in its shape; every output and at least one input have it; no input's
        values (randint bounds) depend on it; the op is not in place; a verified shape (timed
        or extra) has a batch of at least 3, where the judge checks it."""
        v = o.get("batch_invariant")
        if v is None:
            return None, False
        axis, required = (v, False) if isinstance(v, str) else (v["axis"], bool(v.get("require", False)))
        base = ("op", "batch_invariant") + (() if isinstance(v, str) else ("axis",))
        if axis not in symbols:
            self.err(base, f"'{axis}' is no shape symbol (they are {', '.join(symbols)}): op.batch_invariant "
                           "names the batch axis, the leading dimension of the tensors that have it")
            return None, False
        good = True
        for kind, group in (("inputs", inputs), ("outputs", outputs)):
            for t in group:
                for key in ("low", "high"):  # the values of a row may not change with the batch size
                    own = getattr(t, key)
                    timed = getattr(t.timed, key) if t.timed is not None else None
                    for which, e in (((), own), (("timed",), timed if timed is not own else None)):
                        if e is not None and axis in e.names:
                            self.err(("op", kind, t.name) + which + (key,),
                                     f"the values of '{t.name}' may not depend on the batch size '{axis}' "
                                     "(op.batch_invariant): a row taken alone or among other rows keeps its "
                                     "values")
                            good = False
                at = [i for i, d in enumerate(t.shape) if axis in d.names]
                if not at:
                    if kind == "outputs":
                        self.err(("op", kind, t.name), f"output '{t.name}' has no batch axis '{axis}' "
                                 "(op.batch_invariant): each row of every output must come from its own rows "
                                 "of the inputs, so the judge can compare it row by row", prefer_key=True)
                        good = False
                    continue
                first = t.shape[0].text.strip() == axis
                bad = next((i for i in at if i > 0), None) if first else at[0]
                if bad is not None or not first:
                    i = bad if bad is not None else 0
                    self.err(("op", kind, t.name, "shape", i),
                             f"'{axis}' (op.batch_invariant: the batch axis) must be the leading dimension of "
                             f"every tensor that has it, on its own, and nowhere else in its shape; "
                             f"{t.name}'s shape[{i}] is '{t.shape[i].text}'")
                    good = False
        if not any(any(axis in d.names for d in t.shape) for t in inputs):
            self.err(base, f"no input has the batch axis '{axis}': op.batch_invariant names the leading "
                           "dimension of the inputs whose rows the outputs' rows are made from")
            good = False
        if o.get("in_place"):
            self.err(base, "op.batch_invariant cannot check an in-place op: the judge calls the kernel again "
                           "on the same inputs")
            good = False
        if not any(s.get(axis, 0) >= 3 for s in verified):
            self.err(base, f"op.batch_invariant needs a verified shape (op.shapes or op.extra_shapes) with "
                           f"{axis} >= 3: the judge checks the rows there, alone and in other batches")
            good = False
        return (axis, required) if good else (None, False)

    def randint_bounds(self, inputs, shapes: list[dict], dtype: str) -> None:
        """Each `randint` input's low and high (its own, and its `timed` override's) at every
        timed, extra and held-out shape: worked out, and low below high (torch draws from
        [low, high))."""
        for t in inputs:
            for which, v in (((), t), (("timed",), t.timed)):
                if v is None or "randint" not in v.dists or v.low is None or v.high is None:
                    continue
                path = ("op", "inputs", t.name) + which
                for sh in shapes:
                    env = {**sh, "elem": DTYPE_BYTES[dtype]}
                    at = ", ".join(f"{k}={x}" for k, x in sh.items())
                    try:
                        lo, hi = v.low(env), v.high(env)
                    except ExprError as e:
                        self.err(path, f"low or high at {at}: {e}")
                        break
                    if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo < hi):
                        self.err(path, f"randint draws from [low, high): low {lo} is not below high {hi} at {at}")
                        break

    def domain(self, o: dict, symbols: list[str], shapes, extra, held,
               dtype) -> tuple[dict | None, list, Expr | None]:
        """op.domain, op.domain_where and op.grid: the symbols' ranges, checked, the timed shapes
        (the listed ones, then the tuning grid's points that are not listed) and the cross-axis
        constraint. ({}, shapes, None) without a domain."""
        if "domain" not in o:
            if "grid" in o:
                self.err(("op", "grid"), "a tuning grid needs op.domain (the ranges it spans)", prefer_key=True)
            if "domain_where" in o:
                self.err(("op", "domain_where"), "op.domain_where needs op.domain (the ranges it narrows)",
                         prefer_key=True)
            return {}, list(shapes), None
        dom: dict[str, Domain] = {}
        good = True
        axes_env = {s for s, d in o["domain"].items() if "tune" not in d} | {"elem"}
        for s, d in o["domain"].items():
            base = ("op", "domain", s)
            if s not in symbols:
                self.err(base, f"'{s}' is no shape symbol (they are {', '.join(symbols)})", prefer_key=True)
                good = False
                continue
            lo, hi = d["min"], d.get("max")
            if hi is not None and hi < lo:
                self.err(base + ("max",), f"max {hi} is below min {lo}")
                good = False
            tune, levels = None, ()
            if "tune" in d:
                if isinstance(d["tune"], list):
                    exprs = [self.expr(base + ("tune", i), e, axes_env - {s}) for i, e in enumerate(d["tune"])]
                    good = good and all(e is not None for e in exprs)
                    tune, levels = exprs[0], tuple(exprs[1:])
                    if levels and any(dom[x].levels for x in dom):
                        self.err(base + ("tune",), "only one symbol may have several `tune` levels")
                        good = False
                else:
                    tune = self.expr(base + ("tune",), d["tune"], axes_env - {s})
                    good = good and tune is not None
                if "typical" in d:
                    self.err(base + ("typical",), "a `tune` symbol is no grid axis: typical values go on the axes")
            elif hi is None:
                self.err(base, f"'{s}' needs a max (a grid axis) or `tune` (its value at the tuning points)")
                good = False
            for i, v in enumerate(d.get("typical", [])):
                if v < lo or (hi is not None and v > hi):
                    self.err(base + ("typical", i), f"{v} is outside [{lo}, {hi}]")
            dom[s] = Domain(lo, hi, tuple(d.get("typical", ())), tune, levels)
        missing = [s for s in symbols if s not in o["domain"]]
        if missing:
            self.err(("op", "domain"), f"every shape symbol needs a domain; missing: {', '.join(missing)}")
            good = False
        if not any(d.tune is None for d in dom.values()):
            self.err(("op", "domain"), "at least one symbol must be a range with a max (the grid's axis)")
            good = False
        where = None
        if "domain_where" in o:
            # over the sizes (and elem): a bound across axes, such as what the judge can verify
            where = self.expr(("op", "domain_where"), o["domain_where"], set(symbols) | {"elem"})
            good = good and where is not None
        if not good:
            return None, [], None
        probe = OpSpec(reference="", dtype=dtype, inputs=(), outputs=(), scalars=(), shapes=tuple(shapes),
                       extra_shapes=(), atol=0, rtol=0, bytes=None, flops=None, domain=dom)
        per_octave = float(o.get("grid", {}).get("per_octave", 2))
        if where is not None:
            # an expression that cannot be worked out at a listed size or a tuning point (a
            # division by zero, say) is a mistake, not a size outside the domain
            try:
                raw = grid_points(dom, symbols, per_octave, DTYPE_BYTES[dtype])
            except ExprError:
                raw = []  # reported below
            for sh in [*shapes, *extra, *held, *raw]:
                try:
                    where({**sh, "elem": DTYPE_BYTES[dtype]})
                except ExprError as e:
                    self.err(("op", "domain_where"), f"at {', '.join(f'{k}={v}' for k, v in sh.items())}: {e}")
                    return None, [], None
            probe = dataclasses.replace(probe, domain_where=where)
        for key, group in (("shapes", shapes), ("extra_shapes", extra), ("held_out_shapes", held)):
            for i, sh in enumerate(group):
                why = probe.in_domain(sh)
                if why:
                    self.err(("op", key, i), f"outside op.domain: {why}")
        try:
            grid = grid_points(dom, symbols, per_octave, DTYPE_BYTES[dtype], where)
        except ExprError as e:
            self.err(("op", "domain"), f"a tuning point's `tune` value: {e}")
            return None, [], None
        if where is not None and not grid:
            self.err(("op", "domain_where"), f"'{where.text}' holds at no tuning point of op.domain's grid")
        listed = [dict(sh) for sh in shapes]
        return dom, listed + [g for g in grid if g not in listed], where

    def reference(self, ref: str, inputs: list) -> None:
        try:  # from the spec's folder first (no PYTHONPATH needed), then sys.path
            fn = userpath.load_callable(ref, self.near)
        except userpath.ModuleLookupError as e:  # an import error in user code is a spec problem here
            self.err(("op", "reference"), str(e))
            return
        # `widens`: floating inputs the reference makes float64 itself (the judge's copies of them
        # keep their dtype): a name that is not one would leave a copy float64 or an input unwidened
        widens = getattr(fn, "widens", ())
        floating = {t.name for t in inputs if t is not None and t.dtype not in INT_DTYPES}
        names = list(widens) if isinstance(widens, (tuple, list, set, frozenset)) else None
        if names is None or any(not isinstance(w, str) or w not in floating for w in names):
            self.err(("op", "reference"), f"{ref}.widens must name floating inputs of the op "
                                          f"({', '.join(sorted(floating)) or 'none'}); it is {widens!r}")

    def space(self, symbols: set[str], op: OpSpec | None) -> tuple[dict, Space | None]:
        s = self.d["search"]
        params: dict[str, Param] = {}
        for name, p in s["params"].items():
            base = ("search", "params", name)
            if name in symbols or name in render.DTYPE_VARS or name == "elem":
                self.err(base, f"parameter '{name}' shadows a shape symbol or a runner variable", prefer_key=True)
                continue
            if "range" in (p if isinstance(p, dict) else {}) and p["range"]["min"] > p["range"]["max"]:
                self.err(base + ("range",), "min is greater than max")
                continue
            if "range" in (p if isinstance(p, dict) else {}):
                r = p["range"]
                n = (r["max"] - r["min"]) // max(1, r.get("step", 1)) + 1
                if n > MAX_PARAM_VALUES:  # a tuning axis, not a sweep of every integer (it would load for minutes)
                    self.err(base + ("range",), f"{n} values; a parameter takes at most {MAX_PARAM_VALUES} "
                                                "(a larger step, or pow2)")
                    continue
            if "pow2" in (p if isinstance(p, dict) else {}):
                lo, hi = p["pow2"]["min"], p["pow2"]["max"]
                for k, v in (("min", lo), ("max", hi)):
                    if v & (v - 1):
                        self.err(base + ("pow2", k), f"{v} is not a power of two")
                if lo > hi:
                    self.err(base + ("pow2",), "min is greater than max")
                    continue
            vals = param_values(p)
            problem = domain_problem(vals)
            if problem:
                self.err(base, problem)
                continue
            params[name] = Param(name, vals)
        scope = set(params) | symbols
        cons = []
        for i, c in enumerate(s.get("constraints", [])):
            e = self.expr(("search", "constraints", i), c, scope)
            if e is not None:
                cons.append(e)
        if len(params) != len(s["params"]) or len(cons) != len(s.get("constraints", [])) or op is None:
            return params, None
        space = Space(tuple(params.values()), tuple(cons), tuple(op.all_shapes))
        try:
            empty = next(iter(space), None) is None if space.size <= 200_000 else space.sample(
                __import__("random").Random(0), 20_000) is None
        except ExprError as e:
            self.err(("search", "constraints"), str(e))
            return params, None
        if empty:
            self.err(("search", "constraints"), "no configuration satisfies the constraints")
        return params, space

    def kernel(self, hw, op, params, symbols, space: Space | None = None) -> KernelSpec | None:
        k = self.d["kernel"]
        backend = k.get("backend", hw.kind if hw else "cpu")
        if hw and backend != hw.kind:
            self.err(("kernel", "backend"), f"backend '{backend}' does not run on hardware '{hw.name}' ({hw.kind})")
        tpath, tried = userpath.find_template(k["template"], self.near)
        if tpath is None:
            self.err(("kernel", "template"), f"template '{k['template']}' not found; tried, in order: "
                                             + ", ".join(str(p) for p in tried))
            return None
        tpath = Path(_show(tpath))
        try:  # include lines replaced by the files they name: what is rendered and hashed
            text, segments = render.flatten(tpath, lambda p: _show(p))
        except render.RenderError as e:
            self.err(("kernel", "template"), str(e))
            return None
        try:
            used = render.template_variables(text)
        except jinja2.TemplateSyntaxError as e:
            hint = render.syntax_hint(text, e.lineno or 1)
            where = render.locate(segments, e.lineno or 1) or (str(tpath), e.lineno or 1)
            self.diags.append(Diagnostic(where[0], where[1], 1, "", f"template syntax error: {e.message}"
                                         + (f"; {hint}" if hint else "")))
            self.err(("kernel", "template"), f"template {tpath} does not parse (see above)")
            return None
        derive, scope_d = [], set(params) | symbols
        for name, src in k.get("derive", {}).items():
            if name in scope_d or name in render.DTYPE_VARS:
                self.err(("kernel", "derive", name), f"derived value '{name}' shadows a parameter or shape symbol",
                         prefer_key=True)
                continue
            e = self.expr(("kernel", "derive", name), src, scope_d)
            if e is not None:
                derive.append((name, e))
            scope_d.add(name)
        scratch = self.scratch(k, op, params, symbols, derive)
        tmaps = self.tensor_maps(k, op, params, symbols, derive, backend)
        # (a parameter declared with an error of its own, reported there, is no error of the template)
        declared = set(((self.d.get("search") or {}).get("params") or {})) if isinstance(self.d, dict) else set()
        available = set(params) | declared | symbols | set(render.DTYPE_VARS) | {n for n, _ in derive}
        # (with the op's own errors its shape symbols are unknown: their use is no error of the template)
        for v in sorted(used - available) if op is not None else ():
            line, col = render.variable_position(text, v)
            where = render.locate(segments, line) or (str(tpath), 1)
            self.diags.append(Diagnostic(
                where[0], where[1], col, "",
                f"template uses '{v}', which is no search parameter, shape symbol or dtype variable "
                f"of {self.loc.file}"))
        if not re.search(r"\b" + re.escape(k["entry"]) + r"\b", text):
            self.err(("kernel", "entry"), f"entry '{k['entry']}' does not appear in template {tpath}")
        if op is not None:
            names = {t.name for t in op.inputs} | {t.name for t in op.outputs} | \
                    {s.name for s in op.scalars} | set(op.symbols) | set(k.get("scratch", {})) | \
                    set(k.get("tensor_maps", {}))
            for i, a in enumerate(k["args"]):
                if a not in names:
                    self.err(("kernel", "args", i), f"'{a}' is no input, output, scalar, scratch buffer, tensor "
                                                    "map or shape symbol of the op")
                elif a in k["args"][:i]:
                    self.err(("kernel", "args", i), f"'{a}' is passed twice (first as argument "
                                                    f"{k['args'].index(a)}): each is one parameter of the entry")
            mapped = {m["tensor"] for m in k.get("tensor_maps", {}).values() if isinstance(m, dict)}
            for t in (*op.inputs, *op.outputs):
                if t.name not in k["args"] and t.name not in mapped:
                    self.err(("kernel", "args"), f"tensor '{t.name}' is not passed to the kernel")
        scope = set(params) | symbols | {n for n, _ in derive}
        geo = {}
        for key in ("grid", "block", "cluster"):
            v = k.get(key)
            if v is None:
                if backend == "cuda" and key != "cluster":
                    self.err(("kernel",), f"'{key}' is required for the cuda backend")
                geo[key] = ()
                continue
            items = v if isinstance(v, list) else [v]
            exprs = [self.expr(("kernel", key) + ((i,) if isinstance(v, list) else ()), x, scope)
                     for i, x in enumerate(items)]
            geo[key] = tuple(e for e in exprs if e is not None)
        if geo["cluster"] and backend != "cuda":
            self.err(("kernel", "cluster"), "thread-block clusters need the cuda backend")
        smem = self.expr(("kernel", "shared_mem"), k["shared_mem"], scope) if "shared_mem" in k else None
        serves = self.expr(("kernel", "serves"), k["serves"], scope) if "serves" in k else None
        # a parameter is used where the template reads it, or the launch (grid, block, cluster,
        # shared memory, scratch and tensor map sizes), each directly or through derived values;
        # kernel.serves alone is no use
        # (it picks sizes, the kernel is the same)
        launch = [*geo["grid"], *geo["block"], *geo["cluster"], smem, *(d for sc in scratch for d in sc.shape),
                  *(d for m in tmaps for d in (*m.box, m.when))]  # the workspaces' and maps' sizes too
        reads = set(used) | {n for e in launch if e is not None for n in e.names}
        for name, e in reversed(derive):  # a derived value read makes its own names read
            if name in reads:
                reads |= set(e.names)
        for p in sorted(set(params) - reads):
            self.err(("search", "params", p), f"parameter '{p}' is not used by template {tpath} nor by the launch "
                                              "(kernel.grid, block, cluster, shared_mem)", prefer_key=True)
        if op is not None and op.domain:
            for s, chain in render.read_symbols(used, op.symbols, derive).items():
                if s in op.domain:
                    how = " through " + " -> ".join(chain[:-1]) if len(chain) > 1 else ""
                    where = render.locate(segments, render.variable_line(text, chain[0])) or (str(tpath), 1)
                    self.diags.append(Diagnostic(
                        where[0], where[1], 1, "",
                        f"the template reads '{s}'{how}, but op.domain of {self.loc.file} gives '{s}' a range: "
                        "a size known at run time must reach the kernel as an argument only"))
            for s in op.domain:
                if s not in k["args"]:
                    self.err(("kernel", "args"), f"'{s}' ranges over op.domain, so the kernel takes it at run "
                                                 "time: add it to kernel.args")
        elif serves is not None:
            self.err(("kernel", "serves"), "kernel.serves needs op.domain (the sizes it picks from)",
                     prefer_key=True)
        if op is not None and op.batch_axis and op.batch_axis not in op.domain:  # a domain symbol: above
            chain = render.read_symbols(used, op.symbols, derive).get(op.batch_axis)
            if chain:
                how = " through " + " -> ".join(chain[:-1]) if len(chain) > 1 else ""
                where = render.locate(segments, render.variable_line(text, chain[0])) or (str(tpath), 1)
                self.diags.append(Diagnostic(
                    where[0], where[1], 1, "",
                    f"the template reads '{op.batch_axis}'{how}, but op.batch_invariant of {self.loc.file} names "
                    f"'{op.batch_axis}' the batch axis: one binary must serve every batch size (the judge calls "
                    "it on sub-batches of other sizes), so the size may reach the kernel as an argument only"))
        if space is not None and op is not None and len(derive) == len(k.get("derive", {})):
            exprs = [(("kernel", "derive", n), e) for n, e in derive]
            for key in ("grid", "block", "cluster"):
                v = k.get(key)
                exprs += [(("kernel", key) + ((i,) if isinstance(v, list) else ()), e)
                          for i, e in enumerate(geo[key])]
            if smem is not None:
                exprs.append((("kernel", "shared_mem"), smem))
            for sc in scratch:  # each dimension must come out a whole number of at least 1
                exprs += [(("kernel", "scratch", sc.name, "shape", i), _checked_dim(d, sc.name, i))
                          for i, d in enumerate(sc.shape)]
            for tm in tmaps:  # each box must be one the tensor copy can move, the tensor one it can address
                # (where the configuration reads the map: `when`)
                used = (lambda env, tm=tm: tm.when is None or bool(tm.when(env)))
                if tm.when is not None:
                    exprs.append((("kernel", "tensor_maps", tm.name, "when"), tm.when))
                exprs.append((("kernel", "tensor_maps", tm.name, "box"),
                              lambda env, tm=tm, used=used: tensor_map_box([d(env) for d in tm.box], tm)
                              if used(env) else None))
                exprs.append((("kernel", "tensor_maps", tm.name, "tensor"),
                              lambda env, tm=tm, used=used: tensor_map_strides([d(env) for d in tm.dims], tm)
                              if used(env) else None))
            self.evaluate_over_space(space, op, exprs)
        ks = KernelSpec(backend=backend, template_path=str(tpath), template=text, template_segments=tuple(segments),
                        entry=k["entry"],
                        args=tuple(k["args"]), grid=geo["grid"], block=geo["block"], cluster=geo["cluster"],
                        shared_mem=smem,
                        options=tuple(k.get("options", [])), derive=tuple(derive), serves=serves,
                        scratch=tuple(scratch), tensor_maps=tuple(tmaps))
        if serves is not None and op is not None and op.domain and space is not None:
            self.served_somewhere(ks, op, space)
        return ks

    def served_somewhere(self, ks: "KernelSpec", op, space: Space) -> None:
        """kernel.serves that no configuration of the space meets at any timed shape (the
        listed sizes and the tuning points) prunes every trial a run makes: an error here. A
        space too large to walk (over 200k configurations before its constraints) is not
        judged: a sample could miss the few that serve."""
        if space.size > 200_000:
            return
        elem = op.shape_env({})["elem"]
        failure = None
        try:
            for cfg in space:
                for shape in op.shapes:
                    try:
                        if ks.serves_or_raise(dict(cfg), shape, elem):
                            return
                    except ExprError as e:  # (serves_shape reads this as "does not serve")
                        failure = failure or e
        except ExprError:  # a constraint that fails at some configuration: the constraints' own check says so
            return
        why = f"; evaluating it failed: {failure}" if failure else ""
        self.err(("kernel", "serves"), f"no configuration of the space serves any of the {len(op.shapes)} "
                                       f"timed shapes (the listed sizes and the tuning points of op.domain): "
                                       f"every trial would be pruned{why}")

    def scratch(self, k: dict, op, params, symbols, derive) -> list[ScratchSpec]:
        """kernel.scratch: each buffer's name (no other name of the spec), its place in
        kernel.args, `zero` (true is the only mode) and its shape's expressions, over the
        scope of the launch geometry (parameters, shape symbols, derived values)."""
        taken = _taken_names(op, params, symbols, derive)
        scope = set(params) | set(symbols) | {n for n, _ in derive}
        out = []
        for name, sd in k.get("scratch", {}).items():
            base = ("kernel", "scratch", name)
            if name in taken:
                self.err(base, f"scratch buffer '{name}' has the name of {taken[name]}: give it a name of its own",
                         prefer_key=True)
                continue
            if sd.get("zero", True) is not True:
                self.err(base + ("zero",), "only `zero: true` is supported (the default): the runner zeroes a "
                                           "scratch buffer once, when it allocates it, and the kernel must leave it "
                                           "zero after every call")
            if name not in k["args"]:
                self.err(base, f"scratch buffer '{name}' is not passed to the kernel: add it to kernel.args",
                         prefer_key=True)
            dims = [self.expr(base + ("shape", i), x, scope) for i, x in enumerate(sd["shape"])]
            if all(d is not None for d in dims):
                out.append(ScratchSpec(name, tuple(dims), sd["dtype"]))
        return out

    def tensor_maps(self, k: dict, op, params, symbols, derive, backend: str) -> list[TensorMapSpec]:
        """kernel.tensor_maps: each map's name (no other name of the spec), its place in
        kernel.args, the op tensor it describes and a box of that tensor's rank, over the scope
        of the launch geometry; the cuda backend only (the tensor copy is Hopper's)."""
        maps = k.get("tensor_maps", {})
        if not maps:
            return []
        if backend != "cuda":
            self.err(("kernel", "tensor_maps"), "tensor maps (TMA) need the cuda backend", prefer_key=True)
            return []
        taken = {**_taken_names(op, params, symbols, derive), **{n: "a scratch buffer" for n in k.get("scratch", {})}}
        tensors = {t.name: t for t in (*op.inputs, *op.outputs)} if op is not None else {}
        scope = set(params) | set(symbols) | {n for n, _ in derive}
        out = []
        for name, md in maps.items():
            base = ("kernel", "tensor_maps", name)
            if name in taken:
                self.err(base, f"tensor map '{name}' has the name of {taken[name]}: give it a name of its own",
                         prefer_key=True)
                continue
            if name not in k["args"]:
                self.err(base, f"tensor map '{name}' is not passed to the kernel: add it to kernel.args",
                         prefer_key=True)
            t = tensors.get(md["tensor"])
            if op is not None and t is None:
                self.err(base + ("tensor",), f"'{md['tensor']}' is no input or output of the op (a tensor map "
                                             f"describes one of: {', '.join(tensors) or 'none'})")
                continue
            if t is not None and len(md["box"]) != len(t.shape):
                self.err(base + ("box",), f"the box has {len(md['box'])} dimensions; '{t.name}' has {len(t.shape)} "
                                          "(one a dimension, outermost first)")
                continue
            dims = [self.expr(base + ("box", i), x, scope) for i, x in enumerate(md["box"])]
            when = self.expr(base + ("when",), md["when"], scope) if "when" in md else None
            if all(d is not None for d in dims) and t is not None and ("when" not in md or when is not None):
                out.append(TensorMapSpec(name, t.name, tuple(dims), int(md.get("swizzle", 0)), t.dtype,
                                         tuple(t.shape), when))
        return out

    def probe_configs(self, space: Space, limit: int = 4096) -> list[dict]:
        """The configurations `pipe validate` evaluates derived values and geometry on: the whole
        product when it has at most `limit` points, else every value of each parameter with the
        others at the spec's start (or their first values). Those outside the space (a constraint
        fails) are left out: the judge never renders them."""
        if space.size <= limit:
            return list(space)
        st = self.d["search"].get("start")
        st = st[0] if isinstance(st, list) and st else st
        base = {p.name: (st[p.name] if isinstance(st, dict) and st.get(p.name) in p.values else p.values[0])
                for p in space.params}
        out, seen = [], set()
        for p in space.params:
            for v in p.values:
                cfg = {**base, p.name: v}
                key = json.dumps(cfg, sort_keys=True)
                if key not in seen and space.violated(cfg) is None:
                    seen.add(key)
                    out.append(cfg)
        return out

    def evaluate_over_space(self, space: Space, op: OpSpec, exprs: list) -> None:
        """Derived values and geometry evaluated for each probed configuration on every listed shape
        (tuned, extra and held-out), in the order the judge evaluates them: the first failure of each
        key is a spec error at that key (a division by zero for one parameter value would otherwise
        pass validation and fail at render)."""
        shapes = [("shapes", i, s) for i, s in enumerate(op.shapes)] + \
                 [("extra_shapes", i, s) for i, s in enumerate(op.extra_shapes)] + \
                 [("held_out_shapes", i, s) for i, s in enumerate(op.held_out_shapes)]
        n_derive = sum(1 for path, _ in exprs if path[1] == "derive")
        failed: set = set()
        try:
            configs = self.probe_configs(space)
        except ExprError:
            return  # a constraint that does not evaluate is reported by space()
        for cfg in configs:
            for group, i, shape in shapes:
                env = {**shape, **cfg}
                for j, (path, e) in enumerate(exprs):
                    try:
                        v = e(env)
                    except ExprError as ex:
                        if path not in failed:
                            failed.add(path)
                            where = ", ".join(f"{k}={v!r}" for k, v in cfg.items())
                            self.err(path, f"fails for {where} on op.{group}[{i}] "
                                           f"({', '.join(f'{k}={v}' for k, v in shape.items())}): {ex}")
                        if j < n_derive:
                            break  # later derived values and the geometry need this one
                        continue
                    if j < n_derive:
                        env[path[2]] = v
                if len(failed) == len(exprs):
                    return

    def runtime(self) -> RuntimeSpec:
        r = self.d.get("runtime", {})
        return RuntimeSpec(**r)

    def forbidden(self, params, symbols, kernel) -> ForbiddenSpec:
        named, patterns, rules = [], [], []
        for i, f in enumerate(self.d.get("forbidden", [])):
            path = ("forbidden", i)
            if isinstance(f, str):
                if f not in forbid_mod.NAMED:
                    close = difflib.get_close_matches(f, list(forbid_mod.NAMED), n=1)
                    self.err(path, f"unknown forbidden action '{f}'"
                                   + (f"; did you mean '{close[0]}'?" if close else
                                      f" (known: {', '.join(forbid_mod.NAMED)})"))
                else:
                    named.append(f)
            elif "pattern" in f:
                try:
                    re.compile(f["pattern"])
                    patterns.append(forbid_mod.Pattern(f["pattern"], f["reason"]))
                except re.error as e:
                    self.err(path + ("pattern",), f"bad regular expression: {e}")
            else:
                e = self.expr(path + ("rule",), f["rule"], set(params) | symbols)
                if e is not None:
                    rules.append(forbid_mod.Rule(e, f["reason"]))
        if kernel is not None:
            v = forbid_mod.check_source("", kernel.options, kernel.backend, named, [])
            if v:
                self.err(("kernel", "options"), f"compile options break a forbidden action: {v}")
        mode = self.d.get("runtime", {}).get("mode")
        if "disable_cuda_graphs" in named and mode == "direct":
            self.err(("runtime", "mode"), "runtime.mode 'direct' contradicts forbidden 'disable_cuda_graphs'")
        return ForbiddenSpec(tuple(named), tuple(patterns), tuple(rules))

    def agent(self) -> AgentSpec:
        import os

        from ..search.agents import DEFAULT_STRATEGY, STRATEGIES, option_problems

        a = self.d.get("agent", {"strategy": DEFAULT_STRATEGY})
        opts = dict(a.get("options", {}))
        if a["strategy"] not in STRATEGIES:
            close = difflib.get_close_matches(a["strategy"], list(STRATEGIES), n=1)
            self.err(("agent", "strategy"), f"unknown strategy '{a['strategy']}'"
                     + (f"; did you mean '{close[0]}'?" if close else f" (known: {', '.join(STRATEGIES)})"))
        for path, msg in option_problems(a["strategy"], opts, os.environ):  # the strategy's declared options
            self.err(("agent", "options", *path), msg)
        if a["strategy"] == "command":
            self.agent_confinement(opts)
        return AgentSpec(a["strategy"], a.get("seed", 0), opts)

    def agent_confinement(self, opts: dict) -> None:
        """A command agent's confinement options (search/agents/confine.py): folders as absolute
        paths (relative ones from the spec's folder), none of them what the runner owns; ports."""
        from ..build.backends import cache_dir
        from ..search.agents import confine

        try:
            cache = cache_dir()
        except OSError:  # a cache that cannot be made: the run says so; nothing to check against
            cache = None
        owned = confine.owned_paths(None, None, cache)
        owned += [(self.near, "is the spec's folder (its reference modules and templates)")]

        def folder(path: tuple, v) -> str | None:
            if not isinstance(v, str) or not v.strip():
                self.err(path, f"expected a folder's path, got {v!r}")
                return None
            p = (self.near / Path(v).expanduser()).resolve()
            why = confine.clash(p, owned) or confine.unsafe(p)
            if why:
                self.err(path, f"the agent may not write {p}: it {why}")
                return None
            return str(p)

        if opts.get("workdir") is not None:
            opts["workdir"] = folder(("agent", "options", "workdir"), opts["workdir"])
        w = opts.get("writable")
        if w is not None:
            if not isinstance(w, list):
                self.err(("agent", "options", "writable"), f"expected a list of folders, got {w!r}")
            else:
                opts["writable"] = [folder(("agent", "options", "writable", i), v) for i, v in enumerate(w)]
                given = [Path(p) for p in [opts.get("workdir"), *opts["writable"]] if p]
                why = confine.nested(given)
                if why:
                    self.err(("agent", "options", "writable"), why)
        ports = opts.get("connect_ports")
        if ports is not None and ports != "any" and (
                not isinstance(ports, list)
                or not all(isinstance(x, int) and not isinstance(x, bool) and 0 < x < 65536 for x in ports)):
            self.err(("agent", "options", "connect_ports"),
                     f"expected a list of TCP ports (1 to 65535) or 'any', got {ports!r}")

    # the goal metrics that are a floor over a time: at most 1 / (1 - the profile's limit_slack),
    # since a time further under the floor is refused as impossible (figures.below_floor)
    FRACTIONS = ("bandwidth_fraction", "flops_fraction", "limit_fraction")

    def goal(self, hw, op) -> GoalSpec:
        g = self.d["goal"]
        t = g.get("target", {})
        metric = t.get("metric")
        if metric == "speedup" and self.d.get("baseline") == "none":
            self.err(("goal", "target", "metric"), "metric 'speedup' needs a baseline")
        if metric == "flops_fraction" and op is not None and op.flops is None:
            self.err(("goal", "target", "metric"), "metric 'flops_fraction' needs op.flops")
        if metric and metric != "time_us" and "at_most" in t:
            self.err(("goal", "target", "at_most"), f"'{metric}' grows as kernels get faster: use at_least")
        if metric == "time_us" and "at_least" in t:
            self.err(("goal", "target", "at_least"), "'time_us' shrinks as kernels get faster: use at_most")
        v = t.get("at_least")
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0:  # no kernel's figure misses it
            self.err(("goal", "target", "at_least"),
                     f"{v} is met by any kernel: every {metric or 'metric'} is positive")
        w = t.get("at_most")
        if isinstance(w, (int, float)) and not isinstance(w, bool) and w <= 0:
            self.err(("goal", "target", "at_most"), f"{w} can never be met: every {metric or 'metric'} is positive")
        slack = hw.limit_slack if hw is not None else None
        if (metric in self.FRACTIONS and isinstance(v, (int, float)) and slack is not None and slack < 1
                and v > 1 / (1 - slack)):
            self.err(("goal", "target", "at_least"),
                     f"{metric} {v} can never be met: a time under the physical floor by more than the profile's "
                     f"limit_slack ({slack:g}) is refused as impossible, so {metric} stays at most "
                     f"{1 / (1 - slack):.4g}")
        b = g["budget"]
        if not b:
            self.err(("goal", "budget"), "give at least one of trials and minutes")
        return GoalSpec(metric, t.get("at_least"), t.get("at_most"), b.get("trials"), b.get("minutes"),
                        g.get("patience"), g.get("stop_when_met", True))

    def starts(self, space: Space | None) -> tuple:
        """search.start: one configuration or a list of them (for instance each shape's best of
        an earlier sweep), each in the space; a configuration listed twice is an error."""
        st = self.d["search"].get("start")
        if st is None:
            return ()
        many = isinstance(st, list)
        out, keys = [], {}
        for i, cfg in enumerate(st if many else [st]):
            path = ("search", "start", i) if many else ("search", "start")
            why = space.contains(cfg) if space is not None else None
            if why:
                self.err(path, f"start configuration is not in the space: {why}")
                continue
            k = json.dumps(cfg, sort_keys=True)
            if k in keys:
                self.err(path, f"start configuration listed twice (also item {keys[k]})")
                continue
            keys[k] = i
            out.append(dict(cfg))
        return tuple(out)


def load_spec(path: str | Path) -> Spec:
    """Load and validate a spec; raise SpecError with every diagnostic found."""
    loc = yamlsrc.load_file(str(path))
    if not isinstance(loc.data, dict):
        raise SpecError([loc.diag((), "a spec is a mapping of keys (name, hardware, op, ...)")])
    diags = schema_diagnostics(loc, SPEC)
    if diags:
        raise SpecError(sorted(diags + _reference_lookup(loc, diags), key=lambda d: (d.line, d.col)))
    checker = _Checker(loc)
    spec = checker.build()
    if spec is None:
        raise SpecError(checker.diags)
    return spec


def _reference_lookup(loc, diags: list) -> list:
    """op.reference's own lookup error beside the schema's diagnostics (which stop the checks
    that would find it), where the key itself is well formed: a spec is fixed in one pass, not
    one error a pass."""
    op = loc.data.get("op")
    ref = op.get("reference") if isinstance(op, dict) else None
    if not isinstance(ref, str) or any(d.path.startswith("op.reference") for d in diags):
        return []
    try:
        userpath.load_callable(ref, Path(loc.file).resolve().parent)
    except userpath.ModuleLookupError as e:  # (load_callable reports any error of the module so)
        return [loc.diag(("op", "reference"), str(e))]
    return []


def parse_value(text: str):
    """A value given on the command line (--set, --only), read as YAML reads it (a string
    where it does not parse)."""
    try:
        return yamlsrc.load(f"v: {text}\n", "--set").data["v"]
    except SpecError:
        return text


def restrict(spec: Spec, only: list[str]) -> Spec:
    """The spec with some parameters limited to the given values (`NAME=V1,V2,...`, a subspace
    to sweep); ValueError says what is wrong with an item."""
    params = {p.name: p for p in spec.space.params}
    for item in only:
        name, eq, vals = item.partition("=")
        name = name.strip()
        if not eq or name not in params:
            raise ValueError(f"--only {item}: expected NAME=V1,V2,... with NAME one of {', '.join(params)}")
        want = [parse_value(v.strip()) for v in vals.split(",") if v.strip()]
        if not want:
            raise ValueError(f"--only {item}: no values given; {name}'s values are {list(params[name].values)}")
        bad = [v for v in want if v not in params[name].values]
        if bad:
            raise ValueError(f"--only {item}: {bad} not among {name}'s values {list(params[name].values)}")
        params[name] = Param(name, tuple(v for v in params[name].values if v in want))
    space = dataclasses.replace(spec.space, params=tuple(params.values()))
    starts = tuple(st for st in spec.starts if space.contains(st) is None)  # those of the subspace only
    return dataclasses.replace(spec, space=space, starts=starts, start=starts[0] if starts else None)


def sweep(spec: Spec) -> Spec:
    """pipe record's spec: the grid over the whole space, no start configurations, a trial
    budget of the space's size and no goal."""
    n = sum(1 for _ in spec.space)
    return dataclasses.replace(spec, agent=AgentSpec("grid"), start=None, starts=(),
                               goal=GoalSpec(None, None, None, n, None, None))
