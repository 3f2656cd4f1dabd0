"""Fresh, seeded inputs from several distributions; never zeros in timed calls.

Besides the everyday ones (normal, uniform, positive, large, masked, outliers),
some exist to stress the numerics, and each op's spec lists those that apply:
`offset` (each row a large common offset, 1e3 to 1e4 times its spread: E[x^2] -
E[x]^2 and other cancellations fail), `spike` (one element of each row 1e2 to 1e4
times the rest), `huge` (magnitudes up to a quarter of the dtype's largest: safe
for ops that subtract the row maximum first, not for squares) and `tiny` (around
the dtype's smallest normal, subnormals included), `scaled` (normal rows, each times its own
scale, log-uniform over twelve decades: no cheap test of a few elements tells where an
absolute term such as eps matters). In verification's value sets a sixteenth of the rows of
a floating input of two or more dimensions come from its other listed distributions at secret
rows (witness rows), so every distribution is drawn at every verified shape in every check
round, not only where the rounds' rotation puts it; where the spec forbids fast_math, one row in
16 more of every floating input whose dists do not list `tiny` is drawn around the smallest
normal (subnormal witnesses: `_subnormal`); one row in 16 more holds exact zeros or values on
a coarse grid (structured witnesses: `_structured`, exact repeats and zeros, which no continuous
draw makes); in two value sets of three of an everyday draw a few secret columns of every row are
tens to hundreds of times the rest (outlier channels, as an LLM's hidden states hold:
`_outlier_channels`; a GEMM's in its activation, its weights small there: `gemm_roles`);
which round of a shape draws which dist is the trial's secret (worker._turn).
Integer tensors take `randint` (low, high) or `perm`: a random permutation of 0 .. numel - 1
laid out in the tensor's shape, so that every value appears once (a block table over a pool of
pages, each page owned by one sequence, in shuffled order).

An offsets input of a mixture-of-experts GEMM (int32 [E], `rows` and `topk` in the spec)
takes a routing dist: the cumulative END row of each expert's group in the expert-sorted
rows (torch._grouped_mm's `offs`: non-decreasing, the last equal to `rows`, a group empty
where two ends are equal). `routing` is what a real router gives: each of rows / topk tokens
picks topk distinct experts uniformly at random, redrawn until exactly `experts_used(E, T, k)`
experts are in use (the expected count, rounded: at a few tokens the count varies by a
quarter from draw to draw, and op.bytes counts it; core/expr.py); `routing_one` puts every row on one random
expert (all others empty), `routing_empty` leaves about half the experts empty and gives the
rest uneven sizes (one row, sizes that are no multiple of 16), and `routing_single` gives one
expert a single row and one other expert the rest. Every draw holds for any rows >= 1 (fewer
rows than experts, one row); `routing` with rows not a multiple of topk (the spec refuses it
at the shapes it lists) gives the rows left over to one more token with fewer experts.
"""

from __future__ import annotations

import math

import torch

from ..core.expr import experts_used
from .verify import NARROW

TORCH_DTYPES = {
    "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64,
    "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64,
    "bool": torch.bool,
}


def shape_of(t, env: dict) -> tuple[int, ...]:
    return tuple(int(d(env)) for d in t.shape)


def make_tensor(t, env: dict, dist: str, gen: torch.Generator, device: str, form=None,
                picks: list | None = None) -> torch.Tensor:
    """`picks`: a list that a `routing` draw fills with each token's experts (routing_counts)."""
    x = _draw(t, env, dist, gen, device, form, picks)
    special = getattr(t, "special", None)
    if special is not None:  # e.g. ignore indices among targets: a random share of the elements
        value, fraction = special
        mask = torch.rand(x.shape, generator=gen, device=device) < fraction
        x = torch.where(mask, torch.full_like(x, value), x)
    return x


ROUTING = ("routing", "routing_one", "routing_empty", "routing_single")


def routing_counts(dist: str, experts: int, rows: int, topk: int, gen: torch.Generator, form=None,
                   picks: list | None = None) -> torch.Tensor:
    """Rows per expert (int64 [experts], on the CPU, summing to `rows`) for a routing dist,
    drawn from `gen` (the judge's seeded generator: the same seed gives the same routing).
    `form`: routing_empty's structure from the trial's plan (worker.feature_plan), in place of its
    draws: (a count that picks how many experts have rows, whether one holds a single row, whether
    the groups are tile-aligned). `picks`: a list given each token's experts (a list of lists, one a
    token in order) by a `routing` draw, which a gathered input's rows follow (`_gathered`); the
    draws from `gen` are the same with it or without."""
    counts = torch.zeros(experts, dtype=torch.int64)
    if rows <= 0 or experts <= 0:
        return counts
    if dist == "routing":  # each token picks topk distinct experts, uniformly
        k = max(1, min(topk, experts))
        tokens, left = divmod(rows, k)
        if tokens:  # the first k of a random permutation of the experts, per token
            got = _picks(experts, tokens, k, experts_used(experts, tokens, k), gen)
            counts += torch.bincount(got.reshape(-1), minlength=experts)
            if picks is not None:
                picks.extend(got.tolist())
        if left:  # rows not a multiple of topk: one more token with fewer experts
            extra = torch.randperm(experts, generator=gen)[:left]
            counts[extra] += 1
            if picks is not None:
                picks.append(extra.tolist())
        return counts
    order = torch.randperm(experts, generator=gen)  # which experts, in random places
    if dist == "routing_one" or experts == 1 or rows == 1:
        counts[order[0]] = rows
        return counts
    if dist == "routing_single":  # one expert a single row, one other the rest
        counts[order[0]] = 1
        counts[order[1]] = rows - 1
        return counts
    # routing_empty: some experts empty, and the routing's structure drawn rather than fixed (a
    # fixed one left whole classes unverified: with 4 experts, 2 of them in use and each >= 2 rows
    # was never drawn, and a kernel that skipped an expert there passed, session 55's red team):
    # how many experts have rows (2 to E - 1, uniform, at most the rows), whether one of them holds
    # a single row (one draw in two; else every group holds 2 or more where the rows allow), and
    # the others' sizes from squared uniform weights (uneven: most no multiple of 16, 64 or 128,
    # some far larger than others)
    top = min(experts - 1, rows)
    n = int(torch.randint(min(2, top), top + 1, (1,), generator=gen))  # one expert: routing_one's
    if form is not None:
        n = min(2, top) + form[0] % (top - min(2, top) + 1)
    live = order[:n]
    sizes = torch.ones(n, dtype=torch.int64)
    single = n > 1 and bool(torch.rand(1, generator=gen) < 0.5)
    if form is not None:
        single = n > 1 and bool(form[1])
    share_of = sizes[1:] if single else sizes  # the experts that share what is left (a view)
    if not single and rows >= 2 * n:
        share_of += 1  # no group of a single row: two each at least
    left = rows - int(sizes.sum())
    if left:
        wts = torch.rand(share_of.numel(), generator=gen, dtype=torch.float64) ** 2 + 1e-3
        share = torch.floor(wts / wts.sum() * left).to(torch.int64)
        share[torch.argmax(wts)] += left - int(share.sum())  # the remainder to the largest
        share_of += share
    # tile-aligned groups, one draw in two: a router that pads its groups to the GEMM's tile hands
    # the op groups that end on tile boundaries, which uneven weights almost never draw (every
    # group a multiple of 16 in 0 to 0.25% of draws, of 128 never: session 56's red team), so a
    # kernel's path for aligned groups went unverified. Every group but the largest (and a group
    # of a single row) rounded to a multiple of a secret tile, the largest taking the rest
    # (a smaller tile where the rows cannot give every group the one drawn)
    align = bool(torch.rand(1, generator=gen) < 0.5)
    if align if form is None else form[2]:
        first = int(torch.randint(0, len(ALIGN_TILES), (1,), generator=gen))
        big = int(torch.argmax(sizes))
        for tile in ALIGN_TILES[first::-1]:
            aligned = sizes.clone()
            for i in range(n):
                if i != big and not (single and i == 0):
                    aligned[i] = max(1, round(int(sizes[i]) / tile)) * tile
            aligned[big] = rows - (int(aligned.sum()) - int(aligned[big]))
            if int(aligned[big]) >= 2:
                sizes = aligned
                break
    counts[live] = sizes
    return counts


ALIGN_TILES = (16, 32, 64, 128)  # rows of the tiles grouped GEMMs pad their groups to


def _picks(experts: int, tokens: int, k: int, used: int, gen: torch.Generator) -> torch.Tensor:
    """[tokens, k] distinct experts a token, uniform draws redrawn until exactly `used` experts
    are in use; if 64 draws miss (a count far from the expected one), a draw that covers a
    random set of `used` experts: each in turn to the next token, the tokens' other picks
    uniform within the set."""
    for _ in range(64):
        picks = torch.rand((tokens, experts), generator=gen).argsort(dim=1)[:, :k]
        if int(torch.unique(picks).numel()) == used:
            return picks
    chosen = torch.randperm(experts, generator=gen)[:used]
    rows = []
    for t in range(tokens):
        own = [int(chosen[j]) for j in range(t, used, tokens)]  # at most k: used <= tokens * k
        rest = [int(e) for e in chosen[torch.randperm(used, generator=gen)] if int(e) not in own]
        rows.append(own + rest[:k - len(own)])
    return torch.tensor(rows, dtype=torch.int64)


def _routing(t, env: dict, dist: str, gen: torch.Generator, device: str, form=None,
             picks: list | None = None) -> torch.Tensor:
    """A routing dist's offsets: the cumulative row ends of `routing_counts`, in the input's
    dtype, on the device (drawn on the CPU: a few hundred numbers, with any generator)."""
    (experts,) = shape_of(t, env)
    rows, topk = int(t.rows(env)), int(t.topk)
    cpu = gen if gen.device.type == "cpu" else torch.Generator().manual_seed(
        int(torch.randint(0, 2 ** 62, (1,), generator=gen, device=gen.device).item()))
    counts = routing_counts(dist, experts, rows, topk, cpu, form, picks)
    return torch.cumsum(counts, 0).to(device=device, dtype=TORCH_DTYPES[t.dtype])


def _draw(t, env: dict, dist: str, gen: torch.Generator, device: str, form=None,
          picks: list | None = None) -> torch.Tensor:
    dtype = TORCH_DTYPES[t.dtype]
    if dist in ROUTING:
        return _routing(t, env, dist, gen, device, form, picks)
    shape = shape_of(t, env)
    # the everyday distributions are drawn in a 16-bit dtype directly (a third of the bytes
    # of drawing in float32 and rounding); the numerics' own ones in float32 or float64
    direct = dtype if dtype in NARROW else torch.float32
    if dist == "randint":
        lo, hi = int(t.low(env)), int(t.high(env))
        return torch.randint(lo, hi, shape, generator=gen, device=device, dtype=torch.int64).to(dtype)
    if dist == "perm":  # 0 .. numel - 1 in random order, row-major in the shape: a shuffled page table
        n = math.prod(shape)
        return torch.randperm(n, generator=gen, device=device, dtype=torch.int64).view(shape).to(dtype)
    if dist == "uniform":  # [-1, 1) pushed away from zero
        x = torch.rand(shape, generator=gen, device=device, dtype=torch.float32) * 2 - 1
        x = torch.where(x.abs() < 1e-3, torch.full_like(x, 0.5), x)
    elif dist == "positive":
        x = torch.rand(shape, generator=gen, device=device, dtype=torch.float32) + 0.5
    elif dist == "large":
        x = torch.randn(shape, generator=gen, device=device, dtype=direct).mul_(30)
    elif dist == "masked":  # normal, a quarter of the values -inf (attention masks); the first column never
        x = torch.randn(shape, generator=gen, device=device, dtype=direct)
        mask = torch.rand(shape, generator=gen, device=device, dtype=direct) < 0.25
        if len(shape) >= 1 and shape[-1] > 0:
            mask[..., 0] = False  # every row keeps a finite value
        x = x.masked_fill(mask, float("-inf"))
    elif dist == "offset":  # rows: a common offset of 1e3 to 1e4 spreads, either sign
        rows = (*shape[:-1], 1) if len(shape) >= 1 else ()
        off = torch.rand(rows, generator=gen, device=device, dtype=torch.float32) * 9e3 + 1e3
        sign = torch.where(torch.rand(rows, generator=gen, device=device) < 0.5, -1.0, 1.0)
        x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) + off * sign
    elif dist == "spike":  # normal, and one element of each row 1e2 to 1e4 times larger, either sign
        x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        if len(shape) >= 1 and shape[-1] > 0 and x.numel():
            rows = (*shape[:-1], 1)
            col = torch.randint(0, shape[-1], rows, generator=gen, device=device)
            mag = 10 ** (torch.rand(rows, generator=gen, device=device) * 2 + 2)
            sign = torch.where(torch.rand(rows, generator=gen, device=device) < 0.5, -1.0, 1.0)
            x.scatter_(-1, col, (mag * sign).to(x.dtype))
    elif dist in ("huge", "tiny"):  # in float64, so that the target dtype's extremes are reachable
        info = torch.finfo(dtype)
        u = torch.rand(shape, generator=gen, device=device, dtype=torch.float64)
        sign = torch.where(torch.rand(shape, generator=gen, device=device) < 0.5, -1.0, 1.0).to(torch.float64)
        if dist == "huge":  # |x| in [max/64, max/4]
            x = sign * info.max / 4 * torch.exp2(-4 * u)
        else:  # |x| in [smallest normal / 64, smallest normal * 64]
            x = sign * info.tiny * torch.exp2(12 * u - 6)
    elif dist == "scaled":  # normal, each row times its own scale, log-uniform over 12 decades
        rows = (*shape[:-1], 1) if len(shape) >= 1 else ()
        lo, hi = SCALED_DECADES.get(dtype, (-6.0, 6.0))
        exp = torch.rand(rows, generator=gen, device=device, dtype=torch.float64) * (hi - lo) + lo
        x = (torch.randn(shape, generator=gen, device=device, dtype=torch.float64) * torch.pow(10.0, exp))
    elif dist == "outliers":  # mostly normal, 0.1% of values 50x larger
        x = torch.randn(shape, generator=gen, device=device, dtype=direct)
        mask = torch.rand(shape, generator=gen, device=device) < 1e-3
        x = torch.where(mask, x * 50, x)
    else:  # normal
        x = torch.randn(shape, generator=gen, device=device, dtype=direct)
    return x.to(dtype)


# `scaled`: the decades a row's scale spans, per dtype (fp16: its range is five decades of normals)
SCALED_DECADES = {torch.float16: (-2.0, 2.0)}

# Witness rows (verification's value sets only): a share of the rows of a floating input drawn
# from the input's other distributions, at secret rows (s42 red team: every listed distribution
# was drawn only at some shapes, the check rounds rotating over them, so a kernel wrong on
# `offset` or `tiny` rows at the timed shapes alone was verified `ok`).
WITNESS_SHARE = 16  # one row in this many, at secret positions; none below this many rows
FLOATING_DISTS = ("normal", "uniform", "outliers", "positive", "large", "masked", "offset", "spike", "huge",
                  "tiny", "scaled")
POSITIVE_DISTS = {"positive"}
# Subnormal witnesses (`make_inputs`' `subnormal`): a spec that forbids fast_math forbids
# flushing subnormals to zero, and an instruction may flush by its own definition with no mode
# set (x86's vdpbf16ps and vcvtneps2bf16 read and write subnormals as 0; session 48's red team
# had both `ok` on moe-cpu, which draws none). Only values show it, so the judge draws them.
# The CUDA backend too since session 50: what refused an honest rmsnorm-h200 rewrite with the
# rows on (session 49) was ties of the float32 reference, which the paired error now excuses
# (verify._ties).
SUBNORMAL_BACKENDS = ("cpu", "cuda")


def _side_generator(seed: int, which: int, mul: int, add: int) -> torch.Generator:
    """A CPU generator of a draw's own, seeded from the value set's seed and the input's place
    (`which`), so that the value set's other draws are the same with that draw or without."""
    g = torch.Generator(device="cpu")
    g.manual_seed((seed * mul + add * (which + 1)) & ((1 << 62) - 1))
    return g


def _witnessed(x: torch.Tensor, t, env: dict, main: str, seed: int, which: int, device: str,
               avoid: list | None = None) -> torch.Tensor:
    """`x` (drawn from `main`) with a secret 1/WITNESS_SHARE of its rows (its leading index)
    drawn again from the input's other floating distributions, each row's own chosen at random.
    From a generator of their own (seeded from the value set's seed and the input's place), so
    the value set's other draws are the same with witnesses or without. Not a 1-D input's
    elements: a weight vector's witness elements put large outputs in every row of a `tiny`
    round, and the budget's floor (a share of the output's mean magnitude) then covered a wrong
    element among the tiny ones (session 49); which round draws which dist is secret instead
    (worker._turn). `avoid`: rows (of a 2-D input) left as they are: the structured rows each
    value set takes one of each kind of, and their sources (`_structured`'s `keep`): a witness row
    in their place broke the kinship, and a trial's only set of every kind lacked a row alike the
    one before it in 1 trial in 300 (session 59). The other witness rows are drawn as without it."""
    others = [d for d in dict.fromkeys(t.dists) if d != main and d in FLOATING_DISTS]
    rows = x.shape[0] if x.dim() >= 2 else 0
    if main not in FLOATING_DISTS or not others or rows < WITNESS_SHARE:
        return x
    g = _side_generator(seed, which, 0x9E3779B1, 0x632BE5AB)
    k = rows // WITNESS_SHARE
    where = torch.randperm(rows, generator=g)[:k]
    pick = torch.randint(0, len(others), (k,), generator=g)
    # drawn as without `avoid`, then left out where it says: the other rows' values stay the same
    free = _free(where, avoid) if x.dim() == 2 else None
    gdev = torch.Generator(device=device)
    gdev.manual_seed(int(torch.randint(0, 1 << 62, (1,), generator=g)))
    for j, dist in enumerate(others):
        at = where[pick == j]
        if at.numel():
            part = _draw(_Rows(t, int(at.numel())), env, dist, gdev, device)
            if free is not None:
                ok = free[pick == j]
                at, part = at[ok], part[ok.to(part.device)]
            x[at.to(x.device)] = part.to(x.dtype)
    return x


def _free(where: torch.Tensor, avoid: list | None) -> torch.Tensor | None:
    """Which of `where` are no row of `avoid` (None where nothing is avoided)."""
    if not avoid:
        return None
    return ~torch.isin(where, torch.tensor(sorted(set(avoid)), dtype=where.dtype))


def _secret_rows(g: torch.Generator, n: int, lo: int, hi: int) -> torch.Tensor | None:
    """Secret rows among lo .. hi - 1 of an input's n: n / WITNESS_SHARE of them, or with fewer
    rows than that one of them in half the value sets (a decode step's few rows), else None."""
    if n >= WITNESS_SHARE:
        return lo + torch.randperm(hi - lo, generator=g)[:n // WITNESS_SHARE]
    if float(torch.rand((), generator=g)) < 0.5:
        return torch.randint(lo, hi, (1,), generator=g)
    return None


def _subnormal(x: torch.Tensor, t, seed: int, which: int, avoid: list | None = None) -> torch.Tensor:
    """`x` with a secret 1/WITNESS_SHARE of its rows, as its last dimension makes them (every
    index but the last: an expert's weight rows too, not only its leading index; a 1-D input's
    elements), drawn around the smallest normal, most of them subnormal, the sign a positive
    input's or either; with fewer rows than that, one secret row in half the value sets (a
    kernel that flushed only at a decode step's few rows was `ok`: session 48's second red
    team). For an input whose dists do not list `tiny` (one that lists it meets it at some
    shape of every trial, worker._turn; subnormal rows in
    its other rounds, tried in session 49, put a weight's last element below the budget's floor
    now and then, where a zeroed last element then passed). From a generator of their own, so
    the value set's other draws are the same with them or without."""
    if "tiny" in t.dists or not x.is_floating_point() or x.numel() == 0:
        return x
    rows = x.reshape(-1, x.shape[-1]) if x.dim() >= 2 else x.reshape(-1, 1)
    n = rows.shape[0]
    g = _side_generator(seed, which, 0x85EBCA77, 0x27D4EB2F)
    where = _secret_rows(g, n, 0, n)
    if where is None:
        return x
    # each row its own scale, 2^-6 to 2^2 times the smallest normal, and its elements within a
    # factor of 2 of it: whole rows subnormal (a flush of the inputs shows) and rows whose sums
    # and products land subnormal (a flush of the results shows), not rows whose largest
    # elements carry them into the normal range
    # the values on the input's own device, from a generator seeded by this one: an expert
    # weight's witness rows are 23M elements, whose draw and exponentials on the host took
    # about a second a value set (moe-fine-h200's trial outgrew the judge's 120 s with them)
    d = torch.Generator(device=x.device)
    d.manual_seed(int(torch.randint(0, 1 << 62, (), generator=g)))
    u = torch.rand((where.numel(), 1), generator=d, dtype=torch.float64, device=x.device)
    e = torch.rand((where.numel(), rows.shape[1]), generator=d, dtype=torch.float64, device=x.device)
    mag = torch.finfo(x.dtype).tiny * torch.exp2(8 * u - 6) * torch.exp2(2 * e - 1)
    if not set(t.dists) <= POSITIVE_DISTS:
        mag = torch.where(torch.rand(mag.shape, generator=d, device=x.device) < 0.5, -mag, mag)
    free = _free(where, avoid)  # the structured rows of one of each kind, and their sources, left alone
    if free is not None:
        where, mag = where[free], mag[free.to(mag.device)]
    rows = rows.clone()
    rows[where.to(x.device)] = mag.to(dtype=x.dtype)
    return rows.view(x.shape)


# Structured witness rows (verification's value sets only, `make_inputs`' `structured`): values
# no continuous draw makes, which users pass all the same: rows of exact zeros (padding tokens,
# a masked batch entry) and rows on a coarse grid (4 significant bits of the row's largest
# element: exact repeats and exact zeros, as quantized or one-hot data has them). A kernel that
# was wrong only on them passed before session 54 (its red team: NaN where a row's elements were
# all 0, a tell on two equal neighbours), since the judge drew neither.
STRUCTURED_BITS = 4


def _structured(x: torch.Tensor, t, seed: int, which: int, kinds=None, keep: list | None = None) -> torch.Tensor:
    """`x` with a secret 1/WITNESS_SHARE of its rows, as its last dimension makes them (every
    index but the last; with fewer rows than that, one secret row in half the value sets), each
    at random all 0 (ZERO_SHARE of them), or else a third each: a bitwise copy of another row (the
    one before it, the one half the batch away, or any), a row alike another (`alike` below), or
    rounded to STRUCTURED_BITS significant bits of the row's largest finite magnitude (-inf stays
    -inf, so a masked row keeps its mask). Never the first or the last row (where tails are
    handled: a zero there would hide a tail's error), never a 1-D
    input's elements (a zero weight element hides its output column in every row: a tail bug at
    the last column went unseen one value set in 30), never an input drawn only `positive` (a
    zero there may be outside the op's domain, a logarithm's). From a generator of its own, so the
    value set's other draws are the same with them or without. `kinds`: the trial's plan for this
    value set (worker.feature_plan), places in STRUCTURED_CELLS: every such row of one of those
    kinds alone (a user's padded batch holds zero rows and no copies), in place of the draw of
    every kind. `keep`: a list given the rows `_cells` made and their sources (rows, as the last
    dimension makes them), which the witness rows then leave alone."""
    if not structurable(x, t) or kinds == ():
        return x
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    if n < 3:
        return x
    g = _side_generator(seed, which, 0x1B873593, 0x68E31DA5)
    where = _secret_rows(g, n, 1, n - 1)
    if where is None:
        return x
    zero = torch.rand(where.numel(), generator=g) < ZERO_SHARE
    # a third of the others a bitwise copy of another row (`src` below). A user's batch repeats
    # rows (a token twice at layer 0, a prompt batched twice, padding by the last row); no
    # continuous draw does, and a kernel wrong only where a row equals the one before it was `ok`
    # (session 56's red team)
    kind = torch.rand(where.numel(), generator=g)
    pick = torch.rand(where.numel(), generator=g)
    copy = ~zero & (kind < 1 / 3)
    # a third a row alike another but not equal: the other row plus this row's own values times
    # 2^1 to 2^-21 of the other's magnitude (a cosine of about 0.45 to 1 - 1e-13). A user's batch
    # holds such rows (a prompt twice at other positions, beams that share a prefix, a token's
    # embedding plus another position's); the judge's rows were independent draws or exact copies,
    # and a kernel wrong only where a row was near the one before it was `ok` (session 58's red team)
    alike = ~zero & ~copy & (kind < 2 / 3)
    # the source: the row before in half of them, the row half the batch away in a quarter (a
    # batch of two halves, as classifier-free guidance or a prompt sampled twice makes; review of
    # session 58), else any row
    src = torch.where(pick < 0.5, where - 1, torch.where(pick < 0.75, (where + n // 2) % n,
                                                         torch.randint(0, n, (where.numel(),), generator=g)))
    src = torch.where(src == where, where - 1, src)  # never a row copied onto itself (where >= 1)
    if kinds is not None:  # the plan's kinds alone, each row one of them at random
        cell = torch.tensor(list(kinds))[torch.randint(0, len(kinds), (where.numel(),), generator=g)]
        flags = torch.tensor([c[:3] for c in STRUCTURED_CELLS])[cell]
        zero, copy, alike = flags[:, 0].clone(), flags[:, 1].clone(), flags[:, 2].clone()
        source = torch.tensor([2 if c[3] is None else c[3] for c in STRUCTURED_CELLS])[cell]
        src = torch.where(source == 0, where - 1, torch.where(source == 1, (where + n // 2) % n, src))
        src = torch.where(src == where, where - 1, src)
    if where.numel() >= 2:
        made = _cells(where, n, zero, copy, alike, src, g, kinds)
        if keep is not None:
            keep.extend(int(where[j]) for j in made)
            keep.extend(int(src[j]) for j in made if copy[j] or alike[j])
    mix = torch.exp2(1 - 22 * torch.rand(where.numel(), 1, generator=g, dtype=torch.float64))
    out = _structure_rows(x, rows, where[zero], where[~zero & ~copy & ~alike], g)
    if bool((copy | alike).any()):
        flat = out.reshape(-1, x.shape[-1]).clone()
        if bool(alike.any()):
            at, of = where[alike].to(x.device), src[alike].to(x.device)
            a, own = flat[of].to(torch.float64), flat[at].to(torch.float64)
            tiny = torch.finfo(torch.float64).tiny
            scale = mix[alike].to(x.device) * _mean_finite(a) / _mean_finite(own).clamp_min(tiny)
            scale = torch.nan_to_num(scale, posinf=1.0)  # a source of normal size over a zero row's tiny
            # -inf stays -inf (no +inf is drawn): a mask's union. Not own * scale there: a source that is
            # a zero row (a structured row drawn before it) has scale 0, and 0 * -inf put NaN in the
            # input where a masked row was alike it; the float64 reference answered NaN and every
            # kernel was `wrong` (softmax-range-h200 on an H100, session 61: tools/verify_probe.py)
            got = a + torch.where(torch.isneginf(own), own, own * scale)
            # a row whose sum would pass a quarter of the dtype's largest value (huge rows) a copy
            big = (got.abs() > torch.finfo(x.dtype).max / 4) & torch.isfinite(a) & torch.isfinite(own)
            flat[at] = torch.where(big.any(1, keepdim=True), a, got).to(x.dtype)
        flat[where[copy].to(x.device)] = flat[src[copy].to(x.device)]
        out = flat.view(x.shape)
    return out


SIGNED_ZERO_SHARE = 1 / 2  # of the zero rows: each element's sign kept (a mask's product)
ZERO_SHARE = 3 / 8  # of the structured rows: all 0; the others a third each copies, alike rows, grid rows
# The kinds of structured row every value set of two or more such rows takes one of each of (as
# many as it has rows for, in a secret order), the rest drawn each on its own: (zero, copy, alike,
# source), source 0 the row before, 1 the row half the batch away, 2 any row. Drawn each alone, a
# set of 32 such rows held no copy of the row before in 5% of sets, and a trial whose one value
# set of many rows was such a set passed a kernel wrong only on such rows (audit of session 59).
STRUCTURED_CELLS = ((True, False, False, None), (False, True, False, 0), (False, False, True, 0),
                    (False, True, False, 1), (False, False, True, 1), (False, True, False, 2),
                    (False, False, True, 2), (False, False, False, None))


def _cells(where: torch.Tensor, n: int, zero, copy, alike, src, g: torch.Generator, kinds=None) -> set:
    """Gives rows of `where` (in its secret order) one each of STRUCTURED_CELLS (`kinds` of them
    where given; a secret choice of as many as `where` has rows; up to three each where it has more),
    in place in the masks and `src`: a copy or alike row only where its source is no row of `where`
    (whose values the other kinds replace, so that the kinship holds in what the kernel is given).
    The places in `where` it gave a kind."""
    ordered = torch.sort(where).values

    def taken(r: int) -> bool:
        i = int(torch.searchsorted(ordered, r))
        return i < ordered.numel() and int(ordered[i]) == r

    pool = list(kinds) if kinds is not None else list(range(len(STRUCTURED_CELLS)))
    chosen = [pool[c] for c in torch.randperm(len(pool), generator=g)[:where.numel()].tolist()]
    # up to three of each where the rows allow: a witness row drawn later takes the place of one,
    # or of its source, one time in 8, and with one each a trial's only set of every kind lacked a
    # copy of the row before in 1 trial in 300 (session 59)
    chosen = chosen * max(1, min(3, where.numel() // max(1, len(pool))))
    used: set = set()
    # those with a source first: the rows whose source is free are fewer than the rows
    for c in sorted(chosen, key=lambda c: STRUCTURED_CELLS[c][3] is None):
        z, cp, al, source = STRUCTURED_CELLS[c]
        for j in range(where.numel()):
            if j in used:
                continue
            at = int(where[j])
            if source == 2:  # any row that keeps its own values (a sixteenth of the rows are taken)
                of = next((r for r in torch.randint(0, n, (64,), generator=g).tolist() if not taken(r)), None)
            else:
                of = at - 1 if source == 0 else (at + n // 2) % n if source == 1 else -1
            if of is None or (of >= 0 and taken(of)):
                continue
            zero[j], copy[j], alike[j] = z, cp, al
            if of >= 0:
                src[j] = of
            used.add(j)
            break
    return used



def _mean_finite(rows: torch.Tensor) -> torch.Tensor:
    """Each row's mean finite magnitude (non-finite elements counted as 0), as a column."""
    return torch.where(torch.isfinite(rows), rows.abs(), torch.zeros_like(rows)).mean(1, keepdim=True)


# Weight vectors (verification's value sets, `make_inputs`' `structured`): a 1-D floating input (a
# norm's gamma, a bias) drawn `positive` took values in [0.5, 1.5) only, never the small, zero or
# negative elements a trained model's weights hold (a Llama's first layers have most of their gamma
# below 0.1), and a kernel wrong only where an element of w was 0 or of normal size below 0.25 was
# `ok` on rmsnorm-cpu in 5 evals of 5 (session 58's red team). In a secret share of the value sets,
# a secret share of the elements (all, or 1/8 to all) scaled by 2^-1 to 2^-7, and, where the input
# is not drawn `positive` alone, an eighth negated and one set to 0 (never the first or the last: a
# zero hides its column, and tails are handled there). The first and last are scaled and negated as
# the others are: kept as drawn, they were a tell (a kernel wrong only where w[0] is small passed).
# Not below 2^-7: a bf16 spec's budget has a floor of 2^-7 times the output's mean magnitude, and a
# column whose weight is far under it holds outputs under the floor in every row, where a bug in
# that column passes (the reason 1-D inputs take no structured rows). Only on the everyday draws
# (`tiny` keeps its purpose, and a vector's large elements among tiny ones put the budget's floor
# above them, session 49).
SPREAD_SHARE = 3 / 4
SPREAD_DISTS = ("positive", "normal", "uniform", "outliers", "large")
SPREAD_MIN = 16  # elements


def _spread(x: torch.Tensor, t, dist: str, seed: int, which: int, share: bool | None = None) -> torch.Tensor:
    """`x` (a 1-D floating input drawn from `dist`) with, in a secret SPREAD_SHARE of the value sets,
    small elements and, unless the input is drawn `positive` alone, negative ones and a zero, at
    secret places (the zero never the first or the last). From a generator of its own, so the
    value set's other draws are the same with them or without. `share`: the trial's plan for this
    value set (worker.feature_plan), in place of the share's draw."""
    n = x.numel()
    if not spreads(t, x.shape, dist):
        return x
    g = _side_generator(seed, which, 0x27D4EB2D, 0x3C6EF372)
    drawn = float(torch.rand((), generator=g)) < SPREAD_SHARE
    if not (drawn if share is None else share):
        return x
    y = x.to(torch.float64).cpu()
    # the share of small elements the value set's own: all of them in a third of the sets, else
    # 1/8 to all. A fixed quarter never made a vector mostly small, as a trained gamma often is (a
    # Llama's first layers: 98% of it under 0.25), and a kernel wrong only where most of w is small
    # was `ok` (review of session 58)
    u, v = (float(torch.rand((), generator=g)) for _ in range(2))
    share = 1.0 if u < 1 / 3 else 1 / 8 + 7 / 8 * v
    small = torch.rand(n, generator=g) < share
    y = torch.where(small, y * torch.exp2(-1 - 6 * torch.rand(n, generator=g, dtype=torch.float64)), y)
    if not set(t.dists) <= POSITIVE_DISTS:
        y = torch.where(torch.rand(n, generator=g) < 0.125, -y, y)
        y[1 + int(torch.randint(0, n - 2, (), generator=g))] = 0
    return y.to(dtype=x.dtype, device=x.device)


# Outlier channels (verification's value sets, `make_inputs`' `outliers`): an LLM's hidden
# states hold large values in the same few columns of every row (a few channels of thousands,
# tens to hundreds of times the others, of one sign mostly); no draw above made them, so a kernel
# wrong only where one column is large across rows was `ok` (session 56's red team). In a secret
# share of the value sets, a few secret columns of every row but the witness rows drawn after.
# A GEMM's (op.tolerance.gemm_k) in its activation alone, its weights made small at the same
# channels (`gemm_roles`, `_outlier_weights`): against random weights such a column put every output
# tens of times its usual size (silu's flat ends), where a model's learned weights keep it small,
# and the paired tests lost their power (an approximate exp2 on moe-swiglu-cpu's T = 1 passed).
OUTLIER_SHARE = 2 / 3  # of the eligible value sets (a tell with 4 of them in a trial is met in all but 1 trial in 80)
OUTLIER_MIN_COLS = 16  # rows shorter than this have no "few of many" columns
OUTLIER_MAX = 8  # columns at most (and one in 64 of a row's)
# only on the everyday draws: on `offset` rows (nearly equal squares, each rounded the same way
# when added to an outlier's) an honest sequential fp32 sum of squares erred by 1.4e-5 on
# rmsnorm-cpu, past its rtol, as `spike` rows did; the numerics' own draws keep their purpose
OUTLIER_DISTS = ("normal", "uniform", "outliers", "large", "masked")


def _outlier_channels(x: torch.Tensor, seed: int, which: int, always: bool = False,
                      share: bool | None = None) -> torch.Tensor:
    """`x` (an input `_structured` takes) with, in a secret OUTLIER_SHARE of the value sets, 1 to
    OUTLIER_MAX secret columns of its last dimension set in every row to a sign of the column's
    times 2^4 to 2^7 (the column's own secret factor) times the row's mean finite magnitude m
    times 1 + a / (a + m), a the element's own magnitude: 16 to 256 times the row's mean, large in
    every row, each row's value its own, with no pile-up at the top. Not m plus the element's own
    whole: an element an `outliers` draw had made 50 times the others became 10^4 times the row's
    mean, and an honest fp32 sum of squares lost its small terms to the big one's rounding, 1.5e-5
    off (rmsnorm-range-cpu at N = 16383, past its rtol; a clean-clone CI failed on it). Nor m plus
    min(a, m): about 4 rows in 10 were 2 f m exactly (review of session 58, below). Non-finite
    elements (a mask's -inf) and zero rows stay as they are; a row where the largest result would
    pass 1/64 of the dtype's largest value is left as drawn (huge rows; fp16's offset rows). From
    a generator of its own, so the value set's other draws are the same with them or without.
    `always`: in this value set whatever the share says (the worker's probe, `Judge._outliers`);
    `share`: the trial's plan for this value set (worker.feature_plan), in place of the share's draw."""
    n = x.shape[-1] if x.dim() >= 2 else 0
    plan = _outlier_plan(n, seed, which, always, share) if x.numel() else None
    if plan is None:
        return x
    cols, fac, sign = plan
    cols = cols.to(x.device)
    rows = x.reshape(-1, n)
    # each row's mean magnitude in one float32 pass (an input of 2^27 elements: no float64 copy
    # of it), non-finite elements counted as 0; then the k columns alone in float64
    mag = rows.abs().float().nan_to_num_(nan=0.0, posinf=0.0)
    mean = mag.mean(dim=1, keepdim=True, dtype=torch.float64)
    del mag
    col = rows[:, cols].double()
    # 1 + a / (a + mean), a the element's magnitude: 1 to 2, smooth in a. 1 + min(a, mean) / mean put
    # about 4 rows in 10 at 2 f times their mean exactly, a pile-up no activation has, and a kernel
    # right only where a channel's ratios piled up (its 99th percentile within 1% of its upper
    # quartile) was `ok` in 2 evals of 2 with 12 check rounds (review of session 58)
    a = torch.where(torch.isfinite(col), col.abs(), torch.zeros_like(col))
    own = a / (a + mean).clamp_min(torch.finfo(torch.float64).tiny)  # 0 in a zero row
    big = (sign * fac).to(x.device) * mean * (1 + own)
    safe = float(fac.max()) * 2 * mean <= torch.finfo(x.dtype).max / 64
    rows[:, cols] = torch.where(torch.isfinite(col) & safe, big, col).to(x.dtype)
    return rows.view(x.shape)


def _outlier_plan(n: int, seed: int, which: int, always: bool = False, share: bool | None = None):
    """The outlier channels of input `which` (rows of `n` columns) in this value set: (columns,
    factors 2^4 to 2^7 in float64, signs in float64), or None where the share leaves it none or
    rows are shorter than OUTLIER_MIN_COLS. A function of the seed and the input's place alone,
    so that a GEMM's weights can take the channels of its activation (`_outlier_weights`)."""
    if n < OUTLIER_MIN_COLS:  # no "few of many" columns
        return None
    g = _side_generator(seed, which, 0xC2B2AE35, 0x165667B1)
    drawn = float(torch.rand((), generator=g)) < OUTLIER_SHARE
    if not (always or (drawn if share is None else share)):
        return None
    k = 1 + int(torch.randint(0, max(1, min(OUTLIER_MAX, n // 64)), (), generator=g))
    cols = torch.randperm(n, generator=g)[:k]
    fac = torch.exp2(4 + 3 * torch.rand(k, generator=g, dtype=torch.float64))
    sign = torch.where(torch.rand(k, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    return cols, fac, sign


# A GEMM's outlier channels (op.tolerance.gemm_k): a trained model's weights are small where its
# activations' channels are large (the products keep their scale: SmoothQuant's observation, which
# is why smoothing moves the one's magnitude into the other), so the judge draws them as a pair. The
# activation (the one input whose last dimension is the reduction, K, and whose other dimensions are
# the output's rows) takes outlier channels as any input does; every other floating input with a
# dimension of length K (a weight: its last such dimension where there are several, the layout of
# nn.Linear's [out, in]) takes the same channels along it divided by the same factors. Outputs keep
# their usual size and the GEMM budget (|x| @ |w| magnitudes) its meaning; before session 58's
# red team a GEMM's inputs took no channels at all, against random weights they put outputs tens of
# times their size (silu's flat ends), and a kernel 1% off only where x held them was `ok`.


def _floating(t) -> bool:
    return TORCH_DTYPES[t.dtype].is_floating_point


def gemm_roles(op, env: dict) -> tuple[int, dict[int, int]] | None:
    """A GEMM op's (op.gemm_k) activation and weights for outlier channels, from the spec's shapes
    at `env`: (the activation's index among op.inputs, {a weight's index: its dimensions of length
    K}), or None
    where the op is no GEMM or no single activation is found (its inputs then take no channels)."""
    if getattr(op, "gemm_k", None) is None or len(op.outputs) != 1:
        return None
    k = int(op.gemm_k(env))
    rows = shape_of(op.outputs[0], env)[:-1]
    shapes = [shape_of(t, env) if _floating(t) else None for t in op.inputs]
    acts = [i for i, s in enumerate(shapes) if s is not None and len(s) >= 2 and s[-1] == k and s[:-1] == rows]
    if len(acts) != 1:
        return None
    weights = {}
    for i, s in enumerate(shapes):
        dims = [d for d, n in enumerate(s or ()) if n == k]
        if i != acts[0] and len(s or ()) >= 2 and dims:
            # every dimension of length K: which one the reference contracts is not in the shapes
            # where a weight is square ([K, K], K first or last), and scaling only the last one
            # (nn.Linear's layout) left a [K, N] weight's channels large (session 58's red team)
            weights[i] = tuple(dims)
    return acts[0], weights


# Paired channels (op.channel_pairs): two inputs multiplied together along their last dimension,
# attention's q and k. Each takes outlier channels as any input does, and each is divided at the
# other's channels by the other's factors (`_outlier_weights`), as a GEMM's weights are at its
# activation's: a model's products keep their scale where one side is large. Unpaired, q's channels
# times k's values (and k's times q's) put decode attention's scores at 3.6e4 to 7.2e4 on `large`
# rows, a hard argmax whose answer hangs on the last bits of an fp32 dot product: an fp32 attention
# came to 0.9 of the budget and an honest tensor-core kernel to 1.2 to 3.0: `wrong` in 4 of the 128
# value sets that gave both channels on `large` rows (tools/attn_numerics.py on an H100, session 61).


def partners(op, i: int) -> tuple[int, ...]:
    """The inputs (places in op.inputs) that input `i` is paired with in op.channel_pairs."""
    return tuple(b if a == i else a for a, b in getattr(op, "channel_pairs", ()) if i in (a, b))


def _divided_at(op, roles, i: int, rank: int) -> list[tuple[int, tuple]]:
    """The inputs at whose outlier channels input `i` (of `rank` dimensions) is made small, each with
    the dimensions of `i` it is divided along: a GEMM weight's activation (`roles`, gemm_roles) along
    its dimensions of length K, and its op.channel_pairs partners along its last dimension."""
    weight = [(roles[0], roles[1][i])] if roles is not None and i in roles[1] else []
    return weight + [(j, (rank - 1,)) for j in partners(op, i)]


def _takes_outliers(t, env: dict, dist: str) -> bool:
    """Whether input `t` drawn from `dist` takes outlier channels: an everyday draw of an input
    `structurable` takes, decided from the spec alone, so that a GEMM's weights ask it of their
    activation whether it is drawn before them or after."""
    return dist in OUTLIER_DISTS and _structurable_shape(t, shape_of(t, env))


def _outlier_weights(w: torch.Tensor, dims, seed: int, which: int, always: bool = False,
                     share: bool | None = None) -> torch.Tensor:
    """`w` (a GEMM's weight, `dims` its dimensions of length K: an int or a tuple) with the elements
    at the outlier channels of input `which` (the activation, `_outlier_plan`) divided by each
    channel's factor along each of them, in place (a square weight's along both: whichever the
    GEMM contracts, its weights are small where the activation is large)."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    plan = _outlier_plan(w.shape[dims[0]], seed, which, always, share) if w.numel() and dims else None
    if plan is None:
        return w
    cols, fac, _ = plan
    idx = cols.to(w.device)
    for dim in dims:
        at = [1] * w.dim()
        at[dim] = idx.numel()
        small = w.index_select(dim, idx).to(torch.float64) / fac.to(w.device).view(at)
        w.index_copy_(dim, idx, small.to(w.dtype))
    return w


def structurable(x: torch.Tensor, t) -> bool:
    """Whether `_structured` gives input `t` (its value `x`) structured rows at all."""
    return _structurable_shape(t, x.shape)


def _structurable_shape(t, shape) -> bool:
    """`structurable` from the spec alone: input `t` of `shape` floating, of two or more dimensions,
    not empty, and not drawn only `positive`."""
    return _floating(t) and len(shape) >= 2 and math.prod(shape) > 0 and not set(t.dists) <= POSITIVE_DISTS


RUN_SHARE = 1 / 2  # of the grid rows: runs of equal values; in those, of the elements: the one before repeated


def _structure_rows(x: torch.Tensor, rows: torch.Tensor, at_zero: torch.Tensor, at_grid: torch.Tensor,
                    g: torch.Generator | None = None) -> torch.Tensor:
    """`x` (viewed as `rows`) with rows `at_zero` all 0 and rows `at_grid` on the coarse grid; with
    `g`, a secret RUN_SHARE of the grid rows (all finite) in runs: each element after the first the
    one before it, at RUN_SHARE of them at secret places. A coarse grid makes equal neighbours only
    by chance (about one pair in 14 of normal values at 4 bits), where data held or repeated
    along a row (a quantized signal's flat stretches, repeat_interleave's pairs, as rotary tables
    have them) has them everywhere: a kernel that zeroed an output where a row's first two elements
    were equal passed 12% of rmsnorm-cpu's trials (session 60's slow run)."""
    rows = rows.clone()
    at_zero, at_grid = at_zero.to(x.device), at_grid.to(x.device)
    if at_zero.numel():
        # with `g`, a secret half of the zero rows as a mask's product leaves them (`hidden * mask`):
        # each element's sign kept, -0.0 where the row was negative. All +0.0 before, and a kernel
        # wrong only on a zero row holding a -0.0 passed whenever the trial's draws held none
        # (session 62's red team: caught 3 evals in 4, by chance)
        z = rows[at_zero]
        signed = torch.zeros(at_zero.numel(), dtype=torch.bool) if g is None else (
            torch.rand(at_zero.numel(), generator=g) < SIGNED_ZERO_SHARE)
        rows[at_zero] = torch.where(signed.to(x.device)[:, None], torch.copysign(torch.zeros_like(z), z),
                                    torch.zeros_like(z))
    if at_grid.numel():
        r = rows[at_grid].to(torch.float64)
        top = torch.where(torch.isfinite(r), r.abs(), torch.zeros_like(r)).amax(dim=1, keepdim=True)
        e = torch.floor(torch.log2(torch.where(top > 0, top, torch.ones_like(top))))
        step = torch.exp2(e - (STRUCTURED_BITS - 1))
        r = torch.round(r / step) * step
        if g is not None and r.shape[1] > 1:
            runs = (torch.rand(r.shape[0], generator=g) < RUN_SHARE).to(r.device) & torch.isfinite(r).all(dim=1)
            held = (torch.rand(r.shape, generator=g) < RUN_SHARE).to(r.device) & runs[:, None]
            held[:, 0] = False
            at = torch.arange(r.shape[1], device=r.device).expand_as(r)
            src = torch.cummax(torch.where(held, torch.zeros_like(at), at), dim=1).values
            r = r.gather(1, src)
        rows[at_grid] = r.to(x.dtype)
    return rows.view(x.shape)


def outlier_probe(op, shape: dict, seed: int, device: str) -> dict[str, torch.Tensor]:
    """Verification's value set at `shape` with outlier channels in every input that takes them
    (`_outlier_channels`, whatever the share): what the judge asks the reference once."""
    out = make_inputs(op, shape, seed, 0, device)
    roles = gemm_roles(op, op.shape_env(shape)) if getattr(op, "gemm_k", None) is not None else None
    for i, t in enumerate(op.inputs):
        # a GEMM: its activation's channels alone, its weights small there; a pair: each its own and
        # small at the other's
        if (roles is None or i == roles[0]) and structurable(out[t.name], t):
            out[t.name] = _outlier_channels(out[t.name], seed, i, always=True)
        for j, dims in _divided_at(op, roles, i, out[t.name].dim()):
            if structurable(out[op.inputs[j].name], op.inputs[j]):
                out[t.name] = _outlier_weights(out[t.name], dims, seed, j, always=True)
    return out


def structured_probe(op, shape: dict, seed: int, device: str) -> dict[str, torch.Tensor]:
    """Verification's value set at `shape` with, in every input `_structured` takes, its first
    row all 0 and its last on the coarse grid, whatever its number of rows, and in every 1-D
    floating input small elements and (unless drawn `positive` alone) negative ones and a zero
    (`_spread`): what the judge asks
    the reference once, to learn whether the op is defined there (worker.Judge._structured)."""
    out = make_inputs(op, shape, seed, 0, device)
    for t in op.inputs:
        x = out[t.name]
        if structurable(x, t):
            rows = x.reshape(-1, x.shape[-1])
            n = rows.shape[0]
            out[t.name] = _structure_rows(x, rows, torch.tensor([0]), torch.tensor([n - 1] if n > 1 else []).long())
        elif x.dim() == 1 and x.is_floating_point() and x.numel() >= SPREAD_MIN:  # `_spread`'s, whatever its share
            y = x.clone()
            y[1:-1:4] *= 2.0 ** -7
            if not set(t.dists) <= POSITIVE_DISTS:
                y[2:-1:8] *= -1
                y[1] = 0
            out[t.name] = y
    return out


class _Rows:
    """The input `t` with its leading dimension set to `n` rows (the witness rows' own draw)."""

    def __init__(self, t, n: int):
        self._t, self._n = t, n

    def __getattr__(self, name):
        return getattr(self._t, name)

    @property
    def shape(self):
        return (lambda env, n=self._n: n, *self._t.shape[1:])


def spreads(t, shape, dist: str) -> bool:
    """Whether input `t` of `shape` drawn from `dist` takes `_spread`'s small, negative and zero
    elements in the value sets whose share says so: a 1-D floating input of SPREAD_MIN elements or
    more, drawn from an everyday dist."""
    return len(shape) == 1 and _floating(t) and math.prod(shape) >= SPREAD_MIN and dist in SPREAD_DISTS


def feature_inputs(op, shape: dict, round_: int, structured: bool, outliers: bool) -> tuple[tuple, tuple, tuple]:
    """The inputs (places in op.inputs) that verification's value set at round index `round_` of
    `shape` gives spread elements, outlier channels where the share says so, and two or more
    structured rows (make_inputs' `structured` and `outliers`): what a trial's plan of them
    (worker.feature_plan) counts, each input on its own."""
    env = op.shape_env(shape)
    roles = gemm_roles(op, env) if outliers and getattr(op, "gemm_k", None) is not None else None
    spread, channels, rows = [], [], []
    for i, t in enumerate(op.inputs):
        v = t.drawn(False)
        dist = v.dists[round_ % len(v.dists)]
        s = shape_of(v, env)
        if structured and spreads(v, s, dist):
            spread.append(i)
        if structured and _structurable_shape(v, s) and math.prod(s[:-1]) >= 2 * WITNESS_SHARE:
            rows.append(i)
        if outliers and (getattr(op, "gemm_k", None) is None or (roles is not None and i == roles[0])):
            if _takes_outliers(v, env, dist) and s[-1] >= OUTLIER_MIN_COLS:
                channels.append(i)
    return tuple(spread), tuple(channels), tuple(rows)


def _share_of(share, i: int):
    """Input `i`'s part of a value set's plan of a feature (make_inputs' `shares`): True, False or
    None (drawn by its share) for every input alike, or ((input, True or False), ...) per input
    (worker.feature_plan), None for an input it does not name."""
    if isinstance(share, tuple):
        return dict(share).get(i)
    return share


# The draws a bare value set (make_inputs' `bare`) takes where an input lists one: values as a user's
# activations and weights are, which no reading of them tells from a user's (an `offset` or `outliers`
# draw's large values, a `tiny` one's small ones, were marks a kernel could key on: session 59)
CALM_DISTS = ("normal", "uniform", "positive")


# The draws where an op's outputs may sit under its tolerance's floor, or at its saturation, so that
# an error there shows little: a round that draws one of them for any floating input is not plain
EXTREME_DISTS = ("tiny", "huge")


def _round_dists(op, round_: int) -> list[str]:
    """The dists verification's value set at round index `round_` draws its floating inputs from."""
    return [v.dists[round_ % len(v.dists)] for v in (t.drawn(False) for t in op.inputs) if _floating(v)]


def plain_round(op, round_: int) -> bool:
    """Whether verification's value set at round index `round_` draws every floating input from a
    dist outside EXTREME_DISTS (inputs of no floating dtype count as plain)."""
    return not set(_round_dists(op, round_)) & set(EXTREME_DISTS)


def everyday_round(op, round_: int) -> bool:
    """Whether verification's value set at round index `round_` draws every floating input from an
    everyday dist (OUTLIER_DISTS, SPREAD_DISTS: those that take outlier channels and spread weights)."""
    return set(_round_dists(op, round_)) <= set(OUTLIER_DISTS) | set(SPREAD_DISTS)


def make_inputs(op, shape: dict, seed: int, round_: int, device: str,
                timed: bool = False, subnormal: bool = False, structured: bool = False,
                serving=None, outliers: bool = False, shares=None) -> dict[str, torch.Tensor]:
    """One value set of the op's inputs. `timed`: the values of timed calls (the candidate's
    timed loop, the baseline's, pipe compare's arms and the checks on their outputs), where an
    input's `timed` override gives its own dist, low or high (say, every sequence at its full
    length, as op.bytes counts it); otherwise verification's. Shapes, dtypes and the draws'
    order are the same either way: only the values differ. `subnormal`: verification's floating
    inputs get subnormal witness rows (`_subnormal`) where their dists do not list `tiny`;
    `structured`: rows of zeros, copies, alike rows and rows on a coarse grid (`_structured`), and
    small, negative and zero elements in 1-D inputs (`_spread`); `outliers`: outlier
    channels in a secret share of the value sets (`_outlier_channels`). `serving`: the
    reference's `serving` draw (verification's values only), called on the finished value set
    with a generator of its own: what a serving engine hands the op that no draw above makes
    (memory the op does not read poisoned, out-of-pool table entries past a sequence's last page,
    pages shared between sequences; runner/ops/reference.py). `shares`: the trial's plan for this
    value set (worker.feature_plan): spread, outlier channels (each True, False or None: drawn by its
    share, for every input alike; or per input, `_share_of`), routing_empty's structure
    (routing_counts' `form`, or None: drawn) and the kinds of structured row (per input, `_structured`'s
    `kinds`, or None: every kind), in place of the draws; and `bare` (True): none of the judge's own
    rows and features (structured, outlier, spread, witness and subnormal rows), each floating input
    drawn from its first CALM_DISTS dist where it lists one, as a user's."""
    spread_share, outlier_share, form, kinds, bare = (tuple(shares or ()) + (None,) * 5)[:5]
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    env = op.shape_env(shape)
    gemm = outliers and not timed and getattr(op, "gemm_k", None) is not None
    roles = gemm_roles(op, env) if gemm else None  # a GEMM's activation and weights
    out = {}
    # a routing that another input's rows gather (`gather`) first: its groups place the gathered rows
    first = {t.gather for t in op.inputs if t.gather is not None}
    order = sorted(range(len(op.inputs)), key=lambda i: op.inputs[i].name not in first)
    picks: dict = {}  # a gathered routing's draw: each token's experts (a `routing` draw's own)
    for i in order:
        t = op.inputs[i]
        v = t.drawn(timed)
        dist = v.dists[round_ % len(v.dists)]
        if bare and not timed and _floating(v):  # a user's: the input's first calm dist where it lists one
            dist = next((d for d in v.dists if d in CALM_DISTS), dist)
        if t.name in first:
            picks[t.name] = []
        out[t.name] = make_tensor(v, env, dist, gen, device, form if dist == "routing_empty" and not timed else None,
                                  picks.get(t.name))
        if t.gather is not None:  # before the judge's own rows, which land on gathered rows as on any
            src = next(u for u in op.inputs if u.name == t.gather)
            out[t.name] = _gathered(out[t.name], out[t.gather], src.topk, seed, i, picks.get(t.gather) or None)
        if not timed and not bare:  # verification's: every listed distribution at every shape, in secret rows
            keep: list = []  # rows the witness rows leave alone (`_structured`'s one of each kind)
            if structured:  # first: a witness row drawn below takes the place of one of these, never the reverse
                out[t.name] = _structured(out[t.name], v, seed, i, _share_of(kinds, i), keep)
            # after the structured rows, whose grid and equal neighbours they keep but in their few
            # columns (before them, a row's large columns put its grid's step past the other
            # elements, which became equal zeros: a tell on equal neighbours was met 6 times in 8);
            # a zero row stays 0 and a copied row stays its source's copy (each row's values its own)
            if outliers and _takes_outliers(v, env, dist) and (
                    not gemm or (roles is not None and i == roles[0])):  # a GEMM's activation alone
                out[t.name] = _outlier_channels(out[t.name], seed, i, share=_share_of(outlier_share, i))
            # a GEMM's weight small at its activation's channels, a paired input at its partner's
            for j, dims in _divided_at(op, roles, i, out[t.name].dim()) if outliers else ():
                other = op.inputs[j].drawn(timed)
                if _takes_outliers(other, env, other.dists[round_ % len(other.dists)]):
                    out[t.name] = _outlier_weights(out[t.name], dims, seed, j, share=_share_of(outlier_share, j))
            if structured:  # weight vectors: small, negative and zero elements (`_spread`)
                out[t.name] = _spread(out[t.name], v, dist, seed, i, _share_of(spread_share, i))
            out[t.name] = _witnessed(out[t.name], v, env, dist, seed, i, device, keep)
            if subnormal:
                out[t.name] = _subnormal(out[t.name], v, seed, i, keep)
        # a bf16 or fp16 checkpoint's weight vector upcast (before a target is taken from it)
        if out[t.name].dim() == 1:
            out[t.name] = _narrowed(out[t.name], seed, i)
        if v.argmax is not None:
            out[t.name] = _argmaxed(out[t.name], out[v.argmax[0]], v, seed, i)
    if serving is not None and not timed:  # last: nothing drawn above overwrites what it poisons
        serving(out, _side_generator(seed, len(op.inputs), 0x7FEB352D, 0x846CA68B))
    return out


GATHER_SHARE = 3 / 4  # of the value sets, each gathered input on its own: rows gathered by token


def _gathered(x: torch.Tensor, ends: torch.Tensor, topk: int, seed: int, which: int,
              picks: list | None = None) -> torch.Tensor:
    """`x` (rows sorted by expert, the groups' cumulative END rows `ends`) as a MoE layer's
    gather makes it, in a secret GATHER_SHARE of the value sets (timed and bare ones too): each
    of ceil(rows / topk) tokens' rows (x's first rows, as drawn) once in the group of each of
    topk experts, so that every row has bitwise twins in other experts' groups, as a user's call
    always has. No draw of the judge's made such rows (0 of 360 value sets of moe-cpu), and a
    kernel 1% off where half the rows had a twin in another group was `ok` in every eval
    (session 62's red team, tests/data/moe_topk_twin_tell.cpp.j2). Which tokens an expert's
    group holds: under a `routing` draw, the experts each token picked in it (`picks`, the
    router's own draw: a real gather's structure, every pair of experts sharing tokens as
    uniform picks share them); under a skewed routing (no router gives one), the groups from the
    largest, each taking the tokens with the most picks left, ties broken at random (Ryser's
    construction: a token in topk distinct groups wherever the sizes allow; a group larger than
    the tokens takes some twice). Each group's tokens in ascending order, as a stable sort by
    expert leaves them. From a generator of its own: the value set's other draws are the same
    with it or without."""
    rows = x.shape[0]
    if rows < 2 or topk < 2 or ends.numel() == 0:
        return x
    g = _side_generator(seed, which, 0x3C6EF372, 0x1B873593)
    if float(torch.rand(1, generator=g)) >= GATHER_SHARE:
        return x
    ends = ends.to("cpu", torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    if int(ends[-1]) != rows or bool((counts < 0).any()):  # not groups of these rows: left as drawn
        return x
    tokens = -(-rows // topk)
    if picks is not None and len(picks) == tokens:  # the router's own draw: each token's experts
        experts = torch.tensor([e for p in picks for e in p], dtype=torch.int64)
        owner = torch.repeat_interleave(torch.arange(tokens), torch.tensor([len(p) for p in picks]))
        if experts.numel() == rows and torch.equal(torch.bincount(experts, minlength=counts.numel()), counts):
            src = owner[torch.sort(experts, stable=True).indices]  # by expert, tokens ascending within
            return x[:tokens][src.to(x.device)]
    left = torch.full((tokens,), topk, dtype=torch.int64)
    left[-1] = rows - (tokens - 1) * topk  # rows not a multiple of topk: one token with fewer picks
    src = torch.empty(rows, dtype=torch.int64)
    starts = ends - counts
    for e in sorted(range(counts.numel()), key=lambda e: (-int(counts[e]), float(torch.rand(1, generator=g)))):
        need, got = int(counts[e]), []
        while need > 0:
            take = min(need, tokens)
            key = left.to(torch.float64) + torch.rand(tokens, generator=g, dtype=torch.float64)
            pick = torch.topk(key, take).indices
            left[pick] -= 1
            got.append(pick)
            need -= take
        if got:
            s0 = int(starts[e])
            src[s0:s0 + int(counts[e])] = torch.cat(got).sort().values
    return x[:tokens][src.to(x.device)]


NARROW_SHARE = 1 / 2  # of the value sets, each float32 or float64 1-D input on its own: a narrower format's


def _narrowed(x: torch.Tensor, seed: int, which: int) -> torch.Tensor:
    """`x`, a float32 or float64 input, rounded to bf16's values (three times in four) or fp16's, in
    a secret NARROW_SHARE of the value sets, each input on its own: what an op gets from a bf16 or
    fp16 checkpoint's tensor upcast to its dtype (a norm's gamma). No draw of the judge's made such
    a set (every value had float32's 24 bits, or at most 5 on the grid rows), and a kernel 1% off
    where the weight vector was bf16-exact (tests/data/bf16_w_tell.cpp.j2) was `ok` in every eval on
    rmsnorm-cpu and rmsnorm-range-cpu (session 62's red team). On timed and bare value sets too: a
    user's. fp16 where its range holds the set, else bf16; left as drawn where the rounding would
    change a nonzero element to zero, a finite one to an infinity, or a sign (a `positive` input's
    smallest values). From a generator of its own, so the value set's other draws are the same
    with it or without. make_inputs narrows 1-D inputs alone: rows of bf16 values summed in an
    honest kernel's fp32 sequential sum err 10 to 50 times more than rows of float32's (few
    distinct squares round the same way: 6e-5 of the sum of squares at N = 16383, against
    rmsnorm-range-cpu's rtol of 1e-5, in test_tells' honest fp32 sum of squares), so narrowing x
    waits for a budget that follows a row sum's error as the GEMM budget follows K."""
    if x.dtype not in (torch.float32, torch.float64) or x.numel() == 0:
        return x
    g = _side_generator(seed, which, 0x5851F42D, 0x14057B7F)
    u = torch.rand(2, generator=g)
    if float(u[0]) >= NARROW_SHARE:
        return x
    for fmt in ((torch.float16, torch.bfloat16) if float(u[1]) < 1 / 4 else (torch.bfloat16,)):
        y = x.to(fmt).to(x.dtype)
        if bool((((y == 0) == (x == 0)) & (torch.isfinite(y) == torch.isfinite(x))
                 & (torch.signbit(y) == torch.signbit(x))).all()):
            return y
    return x


def _argmaxed(x: torch.Tensor, src: torch.Tensor, t, seed: int, which: int) -> torch.Tensor:
    """`x` with a share (`t.argmax`'s fraction) of its elements, at secret places, set to the
    index of the largest value of `src`'s last dimension at the same leading index (a target the
    model predicts; the first of equal maxima); elements equal to `special`'s value are kept.
    From a generator of its own, as the witness rows', so the other draws are unchanged."""
    g = _side_generator(seed, which, 0x2545F491, 0x4F6CDD1D)
    pick = (torch.rand(x.shape, generator=g) < t.argmax[1]).to(x.device)
    if t.special is not None:
        pick &= x != int(t.special[0])
    top = src.argmax(dim=-1).to(x.dtype) if src.numel() else torch.zeros_like(x)
    return torch.where(pick, top, x)
