"""Where a kernel's time goes: one configuration of a spec's template, timed on the spec's
backend (the GPU for the CUDA specs) beside diagnostic variants of its own rendered source,
other versions of the template, and a copy of the same bytes.

Variants (edits of the rendered CUDA source; a variant that does not change the source
stops the run, so a template change cannot silently turn it into a second "real"):
  real       the kernel as a trial runs it, checked against the spec's reference first
  cheap-exp  every exp2f is one FMA: no MUFU and no range fix-ups (the output is wrong)
  no-reduce  every cross-thread row reduction (row_reduce<...>(...); row_sum(v, ...) -> v)
             removed: no shuffles, block barriers or cluster exchange for the row
             (the output is wrong)
  bare       both: loads, the per-element passes without exp, and the stores
Only "real" is a softmax; the others time what is left when a part is taken out, so the
differences give each part's share of the time (Nsight Compute is not on the device image).

--grid LABEL=EXPR launches the real source on another grid, an expression over the shape, the
parameters and the spec's derived values (as the spec's own grid is), as arm 'cN LABEL',
checked like "real": a persistent kernel's grid against the spec's choice.

--rows keeps the compiled sizes and changes the number of rows (a runtime argument): with a
persistent grid of G row slots, M = k * G rows is k whole rounds, and M = k * G + 4 shows
what a nearly empty last round costs.

Every arm is timed as the judge times: warm-up first, the L2 flushed clean before each
call, event times, medians of each round, arms in alternating order over the rounds;
inputs from the spec's first distribution (never zeros).

    python benchmarks/anatomy.py --spec pipelines/softmax-h200.yaml --shape 4096x32768 \\
        --config '{"EPT": 64, "TMAX": 512, "MINB": 1, "VEC": 8, "HOLD": "ring", "LOAD": "default", "STORE": "default"}' \\
        [--config EPT=64,TMAX=1024,...] [--template old=PATH.cu.j2] [--grid g132=132] [--rows 3960,4092,4096,4224] \\
        [--variants real,cheap-exp,no-reduce,bare] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = ("real", "cheap-exp", "no-reduce", "bare")

_CHEAP_EXP = (
    "\n// anatomy: exp2f is one FMA here (the output is not a softmax)\n"
    "__device__ __forceinline__ float anatomy_cheap_exp2(float v) { return fmaf(v, 0.0f, 1.0f); }\n"
    "#define exp2f(v) anatomy_cheap_exp2(v)\n")
_REDUCE_CALL = re.compile(r"\brow_reduce<\w+>\([^;]*\);")
_ROW_SUM = re.compile(r"\brow_sum\(\s*(\w+)\s*,[^;]*?\)(?=\s*/)")


class VariantError(Exception):
    pass


def variant_source(src: str, variant: str) -> str:
    """The rendered source with the variant's parts taken out."""
    out = src
    if variant in ("cheap-exp", "bare"):
        if "exp2f(" not in out:
            raise VariantError("cheap-exp: the source calls no exp2f")
        includes = list(re.finditer(r"^#include[^\n]*\n", out, re.M))
        at = includes[-1].end() if includes else 0
        out = out[:at] + _CHEAP_EXP + out[at:]
    if variant in ("no-reduce", "bare"):
        body = out.split("extern \"C\" __global__", 1)
        if len(body) != 2:
            raise VariantError("no-reduce: no extern \"C\" __global__ kernel in the source")
        head, kern = body
        kern, n1 = _REDUCE_CALL.subn("/* anatomy: no row reduction */;", kern)
        kern, n2 = _ROW_SUM.subn(r"(\1)", kern)
        if n1 + n2 == 0:
            raise VariantError("no-reduce: the kernel calls no row_reduce or row_sum")
        out = head + "extern \"C\" __global__" + kern
    if variant != "real" and out == src:
        raise VariantError(f"{variant}: the source did not change")
    return out


def parse_shape(text: str, symbols: list[str]) -> dict:
    vals = [int(v) for v in text.lower().split("x")]
    if len(vals) != len(symbols):
        raise SystemExit(f"--shape {text}: the spec's shapes have {len(symbols)} sizes ({', '.join(symbols)})")
    return dict(zip(symbols, vals))


def parse_config(text: str, space, start: dict | None = None) -> dict:
    """A parameter fill: JSON, or NAME=VALUE pairs joined by commas (values typed by the
    parameter's domain), which passes through a shell and tools/device-run.sh unquoted. The
    parameters it leaves out take `start`'s values (the spec's start, as `pipe render`)."""
    text = text.strip()
    if text.startswith("{"):
        try:
            got = json.loads(text)
        except ValueError as e:
            raise SystemExit(f"--config {text}: not JSON ({e})") from None
        return {**(start or {}), **got}
    domains = {p.name: list(p.values) for p in space.params}
    out = {}
    for part in text.split(","):
        name, _, raw = part.partition("=")
        name = name.strip()
        if name not in domains:
            raise SystemExit(f"--config {text}: {name!r} is not a parameter (known: {', '.join(domains)})")
        match = [v for v in domains[name] if str(v) == raw.strip()]
        if not match:
            raise SystemExit(f"--config {text}: {name}={raw} is not in its domain {domains[name]}")
        out[name] = match[0]
    return {**(start or {}), **out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, required=True)
    ap.add_argument("--shape", required=True, help="sizes joined by x, in the order of the spec's symbols")
    ap.add_argument("--config", action="append", required=True,
                    help="a parameter fill, as JSON or NAME=VALUE,... (repeat for more)")
    ap.add_argument("--template", action="append", default=[],
                    help="LABEL=PATH: also time each configuration rendered from this template (another "
                         "version of the spec's), as arm 'cN LABEL', checked like 'real'")
    ap.add_argument("--grid", action="append", default=[],
                    help="LABEL=EXPR: also time the real source of each configuration on this grid (an "
                         "expression over the shape, parameters and derived values), as arm 'cN LABEL'")
    ap.add_argument("--rows", default="", help="numbers of rows to time besides the shape's own, joined by commas")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    import torch

    from runner.core import figures
    from runner.core.errors import ExprError
    from runner.core.expr import compile_expr
    from runner.judge.timing import bench
    from runner.judge.worker import Judge
    from runner.spec.spec import load_spec
    from runner.build.builder import Builder

    spec = load_spec(str(a.spec))
    builder = Builder(spec)
    symbols = list(spec.op.symbols)
    base = parse_shape(a.shape, symbols)
    rows_sym = symbols[0]
    counts = [base[rows_sym]] + [int(v) for v in a.rows.split(",") if v.strip()]
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"--variants: unknown {', '.join(bad)} (known: {', '.join(VARIANTS)})")
    # the judge's own plumbing, in this process: the spec's backend runtime (CUDA on the GPU;
    # the CPU one runs this in the tests), inputs, poisoned outputs, launch values, reference
    judge = Judge(spec)
    rt = judge.rt
    rt.flush_mode = "clean"
    dev = rt.device

    # one set of buffers per number of rows, shared by every arm
    bufs = {}
    for m in counts:
        shape = {**base, rows_sym: m}
        ins = judge._shared(judge._inputs(shape, 1234, 0, timed=True))  # the timed calls' values
        outs = judge._outputs(shape)
        nbytes = figures.floors(spec, [shape])[0]["bytes"]
        half = int(nbytes) // 2
        src = torch.randint(0, 256, (half,), dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        bufs[m] = (shape, ins, outs, nbytes, (src, dst))

    arms = {}  # (label, m) -> call
    info = {}
    others = []
    for t in a.template:
        name, _, path = t.partition("=")
        if not path or not Path(path).is_file():
            raise SystemExit(f"--template {t}: expected LABEL=PATH of a template file")
        builder.variants[f"template {name}"] = Path(path).read_text()  # rendered as the spec's template is
        others.append(name)
    grids = []
    for t in a.grid:
        name, _, text = t.partition("=")
        try:
            grids.append((name, compile_expr(text), t))
        except ExprError as e:
            raise SystemExit(f"--grid {t}: {e}")
        if not name:
            raise SystemExit(f"--grid {t}: expected LABEL=EXPR")
    for ci, text in enumerate(a.config):
        params = parse_config(text, spec.space, spec.start)
        src = builder.render_all(params, None, shapes=[base])[0]
        arms_src = []  # (label, variant, source, grid expression or None for the spec's)
        for v in variants:
            try:
                arms_src.append((f"c{ci} {v}", v, variant_source(src, v), None))
            except VariantError as e:
                print(f"c{ci} {v}: skipped: {e}")
        for name in others:  # the same configuration from another version of the template
            arms_src.append((f"c{ci} {name}", "real", builder.render_all(params, f"template {name}", shapes=[base])[0],
                             None))
        for name, expr, raw in grids:  # the real source on another grid
            arms_src.append((f"c{ci} {name}", "real", src, (expr, raw)))
        for label, v, code, gexpr in arms_src:
            c = builder.backend.compile(code, spec.kernel.entry, spec.kernel.options, spec.hw)
            if not c.ok:
                print(f"{label}: compile error: {c.reason}")
                continue
            info[label] = {"config": params, "variant": v, "registers": c.resources.get("registers"),
                           "spill_stores": c.resources.get("spill_stores")}
            kern = rt.load(c.artifact, spec.kernel.entry, judge.kinds)
            for m in counts:
                shape, ins, outs, _, _ = bufs[m]
                geo = builder.geometry(params, shapes=[shape])[0]
                if gexpr is not None:
                    env = {**shape, **params}
                    env.update(spec.kernel.derived(env))
                    try:
                        geo["grid"] = [int(gexpr[0](env))]
                    except ExprError as e:
                        raise SystemExit(f"--grid {gexpr[1]}: {e}")
                info[label].setdefault("geometry", {})[m] = geo
                ws = judge._workspace(geo)  # kernel.scratch, zeroed (kept alive with the call)
                call = rt.prepare(kern, judge._values(shape, ins, outs, ws), geo, mode="direct")
                if v == "real":  # the real kernel must be the op before its time means anything
                    for o in outs:
                        o.fill(0)
                    rt.sync()
                    call()
                    rt.sync()
                    why = judge._check(outs, judge._reference(ins, shape), 0)
                    if why:
                        raise SystemExit(f"{label} at {m} rows: the output does not match the reference: {why}")
                arms[(label, m)] = call
    for m in counts:
        s, d = bufs[m][4]
        arms[("copy of the same bytes", m)] = (lambda s=s, d=d: d.copy_(s))

    times: dict[tuple, list[float]] = {k: [] for k in arms}
    for rnd in range(a.rounds):
        order = list(arms.items())
        if rnd % 2:
            order.reverse()
        for key, call in order:
            rt.walls = []
            ts = bench(call, rt.sync, 10, 40, before=rt.flush, timer=rt.timer, min_reps=10)
            times[key].append(statistics.median(ts))

    out = {"device": torch.cuda.get_device_name() if dev == "cuda" else dev, "torch": torch.__version__, "spec": str(a.spec),
           "shape": base, "rounds": a.rounds, "arms": info, "times": []}
    print(f"{'arm':28s} {'rows':>7s} {'time':>10s} {'TB/s':>6s} {'vs real':>8s}")
    for (label, m), ts in times.items():
        t = statistics.median(ts)
        nbytes = bufs[m][3]
        real = times.get((label.split(" ", 1)[0] + " real", m))
        rel = f"{t / statistics.median(real):8.3f}" if real and not label.endswith(" real") else ""
        print(f"{label:28s} {m:7d} {t * 1e6:8.1f}us {nbytes / t / 1e12:6.2f} {rel}")
        out["times"].append({"arm": label, "rows": m, "median_s": t, "tbps": nbytes / t / 1e12, "rounds_s": ts})
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
