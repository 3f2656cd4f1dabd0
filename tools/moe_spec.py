"""The MoE grouped-GEMM specs (issue 22) for the tools and tests of the kernel side, and the
float64 answer they check against.

`load_moe_spec(path)` loads a spec with pipe's own loader. Until the reference side of issue 22
lands (offs's routing dists and rows/topk keys, tolerance.gemm_k, runner.ops.reference's
moe_gemm), that loader refuses those keys; then the spec is loaded through a stand-in: the
same YAML with offs drawn as `randint`, tolerance as atol/rtol and a local reference module,
in a temporary folder (the template path made absolute). The kernel section, the space and
the geometry, all the kernel side needs, are the spec's own either way; `standin` says which.

`routing(...)` and `grouped_ref(...)` are this side's own: offsets for skewed routings, and
y = x w[e]^T (SwiGLU optionally) in float64 with a bound on fp32 accumulation's error.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ROOT / "pipelines"
SPECS = ["moe-fine-h200.yaml", "moe-fine-swiglu-h200.yaml", "moe-coarse-h200.yaml",
         "moe-fine-down-h200.yaml", "moe-coarse-down-h200.yaml"]

_STANDIN = '''"""A stand-in reference for loading a MoE spec before runner.ops.reference has moe_gemm."""
import torch


def _groups(offs):
    ends = offs.tolist()
    starts = [0] + ends[:-1]
    return list(zip(starts, ends))


def moe_gemm(x, w, offs):
    y = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    for e, (a, b) in enumerate(_groups(offs)):
        y[a:b] = x[a:b] @ w[e].T
    return y


def moe_gemm_swiglu(x, w, offs):
    h = moe_gemm(x, w, offs)
    g, u = h.chunk(2, dim=-1)
    return torch.nn.functional.silu(g) * u
'''


@dataclass
class MoeSpec:
    spec: object          # runner.spec.spec.Spec
    path: Path            # the checked-in spec
    standin: bool         # loaded through the stand-in op section
    sizes: dict           # E, N, K, TOPK, ACT: the compiled-in values


def load_moe_spec(path: str | Path) -> MoeSpec:
    from runner.core.errors import SpecError
    from runner.spec.spec import load_spec

    path = Path(path).resolve()
    try:
        sp = load_spec(path)
        standin = False
    except SpecError as e:
        text = str(e)
        if not any(k in text for k in ("routing", "gemm_k", "rows", "topk", "moe_gemm")):
            raise
        sp = load_spec(_standin_file(path))
        standin = True
    start = dict(sp.start)
    sizes = {k: start[k] for k in ("E", "N", "K", "TOPK", "ACT")}
    return MoeSpec(sp, path, standin, sizes)


def _standin_file(path: Path) -> Path:
    import yaml

    d = yaml.safe_load(path.read_text())
    op = d["op"]
    offs = op["inputs"]["offs"]
    op["inputs"]["offs"] = {"shape": offs["shape"], "dtype": "int32", "dist": "randint", "low": 0, "high": 1}
    op["tolerance"] = {"atol": 1e-2, "rtol": 1e-2}
    fn = op["reference"].partition(":")[2]
    op["reference"] = f"moe_standin:{fn}"
    d["kernel"]["template"] = str((ROOT / d["kernel"]["template"]).resolve())
    tmp = Path(tempfile.mkdtemp(prefix="moe_spec_"))
    (tmp / "moe_standin.py").write_text(_STANDIN)
    out = tmp / path.name
    out.write_text(yaml.safe_dump(d, sort_keys=False))
    return out


# -- routings ---------------------------------------------------------------------------------
def routing(kind: str, T: int, E: int, topk: int, seed: int = 0) -> list[int]:
    """offs (cumulative end rows, length E, last = T * topk) for a routing of T tokens:
    uniform   each token's topk distinct experts drawn uniformly (what op.bytes assumes)
    one       every row on one expert (the middle one)
    empty     only every fourth expert gets rows (ragged counts), the rest empty
    single    one row each for min(R, E) experts, then the rest on the last expert
    ragged    counts drawn from a skewed (Zipf-like) law, not multiples of any tile
    first     every row on expert 0; last: every row on expert E - 1"""
    import random

    rng = random.Random(seed * 1000003 + T * 31 + E)
    R = T * topk
    counts = [0] * E
    if kind == "uniform":
        for _ in range(T):
            for e in rng.sample(range(E), min(topk, E)):
                counts[e] += 1
    elif kind == "one":
        counts[E // 2] = R
    elif kind == "first":
        counts[0] = R
    elif kind == "last":
        counts[E - 1] = R
    elif kind == "empty":
        live = list(range(1, E, 4))
        for _ in range(R):
            counts[rng.choice(live)] += 1
    elif kind == "single":
        for e in range(min(R, E)):
            counts[e] = 1
        counts[E - 1] += R - sum(counts)
    elif kind == "ragged":
        wts = [1.0 / (1 + rng.random() * 8) ** 2 for _ in range(E)]
        for _ in range(R):
            counts[rng.choices(range(E), wts)[0]] += 1
    else:
        raise ValueError(kind)
    offs, s = [], 0
    for c in counts:
        s += c
        offs.append(s)
    assert offs[-1] == R
    return offs


def active_experts(offs: list[int]) -> int:
    prev, n = 0, 0
    for o in offs:
        n += o > prev
        prev = o
    return n


# -- the float64 answer -----------------------------------------------------------------------
def grouped_ref(x, w, offs, act: str = "none"):
    """(y in float64, the error budget of a bf16 kernel with fp32 accumulation, per element).

    Budget: the products of bf16 values are exact in fp32, so the kernel's error before its one
    rounding is at most K * 2^-24 * sum_k |x_k w_k| (the classic bound on a sum of K terms,
    whatever order the tiles and splits add in), and the rounding to bf16 at most 2^-9 |y|
    (2^-8 taken). SwiGLU: silu(g) u's error from those of g and u (|silu'| <= 1.1), plus the
    fp32 activation's own (a few ulps)."""
    import torch

    xd, wd = x.double(), w.double()
    R, K = x.shape
    E, N, _ = w.shape
    h = torch.zeros(R, N, dtype=torch.float64, device=x.device)
    s = torch.zeros_like(h)
    prev = 0
    for e, end in enumerate(offs.tolist() if hasattr(offs, "tolist") else offs):
        if end > prev:
            h[prev:end] = xd[prev:end] @ wd[e].T
            s[prev:end] = xd[prev:end].abs() @ wd[e].T.abs()
        prev = end
    acc_err = K * 2.0 ** -24 * s + 1e-30
    if act == "none":
        return h, 2.0 ** -8 * h.abs() + acc_err
    g, u = h[:, : N // 2], h[:, N // 2:]
    eg, eu = acc_err[:, : N // 2], acc_err[:, N // 2:]
    sg = torch.sigmoid(g)
    silu = g * sg
    y = silu * u
    bound = 2.0 ** -8 * y.abs() + 1.1 * (u.abs() + eu) * eg + (silu.abs() + 1.1 * eg) * eu + 1e-6 * y.abs() + 1e-30
    return y, bound


# -- the kernel's tile mapping, on the host -----------------------------------------------------
def mt_bound(T: int, cfg: dict) -> int:
    """The grid's bound on row tiles (the spec's derived MT, the kernel's `mtb`)."""
    R = T * cfg["TOPK"]
    return min(R, (R + cfg["E"] * (cfg["BM"] - 1)) // cfg["BM"])


SMS = 132  # the H200's SMs: PERSIST's grid (the specs' kernel.grid)


def grid_size(T: int, cfg: dict) -> int:
    tiles = mt_bound(T, cfg) * (cfg["N"] // cfg["BN"])
    return min(tiles, SMS) if cfg.get("PERSIST") else tiles * cfg["SPLITK"]


def block_tiles(T: int, cfg: dict) -> list[int]:
    """The tile ids (find_tile's `bid`) the grid's blocks take, in order: a block a tile, or,
    PERSIST, block b's tiles b, b + grid, b + 2 grid, ... of the MT * NT (moe_wgmma_tma.cuh.j2)."""
    g = grid_size(T, cfg)
    if not cfg.get("PERSIST"):
        return list(range(g))
    tiles = mt_bound(T, cfg) * (cfg["N"] // cfg["BN"])
    return [t for b in range(g) for t in range(b, tiles, g)]


def find_tile(bid: int, offs: list[int], T: int, cfg: dict):
    """moe_tile.cuh.j2's find_tile, step for step (the lanes' scan as a plain prefix sum):
    (expert, row0, rows, mt, nt, split), rows <= 0 for a block with no work."""
    E, BM, GM, SPLITK = cfg["E"], cfg["BM"], cfg["GM"], cfg["SPLITK"]
    NT = cfg["N"] // cfg["BN"]
    R = T * cfg["TOPK"]
    split, tile = bid % SPLITK, bid // SPLITK
    mtb = mt_bound(T, cfg)
    grp = tile // (GM * NT)
    first = grp * GM
    gsz = min(GM, mtb - first)
    inr = tile - grp * GM * NT
    mt, nt = first + inr % gsz, inr // gsz
    clamp = [min(max(o, 0), R) for o in offs]
    base = 0
    for e in range(E):
        lo = clamp[e - 1] if e else 0
        n = max(clamp[e] - lo, 0)
        c = -(-n // BM)
        if base <= mt < base + c:
            row0 = lo + (mt - base) * BM
            return e, row0, min(BM, clamp[e] - row0), mt, nt, split
        base += c
    return 0, 0, 0, mt, nt, split


def coverage(offs: list[int], T: int, cfg: dict) -> str | None:
    """Whether the blocks of the grid cover every (row, column tile, split) of every expert
    exactly once, each row with its own expert's weight, and (mt, nt) pairs are unique (the
    split-K counters). None when they do, else what is wrong."""
    R = T * cfg["TOPK"]
    NT = cfg["N"] // cfg["BN"]
    owner = []
    prev = 0
    for e, o in enumerate(offs):
        owner += [e] * (o - prev)
        prev = o
    seen = {}
    counters = set()
    for bid in block_tiles(T, cfg):
        e, row0, rows, mt, nt, split = find_tile(bid, offs, T, cfg)
        if not 0 <= nt < NT:
            return f"block {bid}: column tile {nt} outside 0..{NT - 1}"
        if rows <= 0:
            continue
        if rows > cfg["BM"]:
            return f"block {bid}: {rows} rows"
        if (mt, nt, split) in counters:
            return f"block {bid}: tile ({mt}, {nt}, split {split}) twice"
        counters.add((mt, nt, split))
        for r in range(row0, row0 + rows):
            if owner[r] != e:
                return f"block {bid}: row {r} of expert {owner[r]} computed with expert {e}"
            key = (r, nt, split)
            if key in seen:
                return f"row {r} column tile {nt} split {split}: blocks {seen[key]} and {bid}"
            seen[key] = bid
    want = R * NT * cfg["SPLITK"]
    if len(seen) != want:
        return f"{len(seen)} of {want} (row, column tile, split) covered"
    return None
