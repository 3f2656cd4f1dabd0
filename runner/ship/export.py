"""`pipe export RUN`: from a tuned run to an importable package.

The dispatch table: for every tuned shape, the kernel to use or the fallback
(the op's torch reference). A shape's kernel is the winner of `pipe compare`
when the run has a `compare.json` (a fresh side-by-side timing), else the
fastest trial the ledger recorded on that shape; it is used only where it beat
torch eager by more than the noise margin, and the fallback is taken
otherwise. The table states its rule for shapes that were not tuned: the sizes
compiled into a kernel (the shape symbols its template reads, directly or
through derived values) must match a tuned shape exactly; the other symbols
(typically the number of rows) are free. Anything else falls back.

The package holds `__init__.py` (registers the op with torch.library and
exposes it as a function), `_runtime.py` (see runner/ship/exported_runtime.py),
`_reference.py` (a copy of the reference's module, for the fallback),
`table.json` and the cubins: importing it needs torch and cuda.core, no
compiler and no pipe.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import re
import shutil
import tempfile
from pathlib import Path

from ..core.errors import PipeError
from .exported_runtime import choose, nearest, nearest_all  # noqa: F401 (the package's own rules, used by pipe compare too)

NOISE = 0.02  # a kernel must beat torch eager by more than this to be used
NOISE_RECORDED = 0.05  # without pipe compare, against the run's recorded baseline


class ExportError(PipeError):
    pass


def baked_symbols(spec) -> list[str]:
    """Shape symbols whose values are compiled into the kernel: those the template
    reads, directly or through the derived values it reads."""
    from ..build import render

    used = render.template_variables(spec.kernel.template)
    return list(render.read_symbols(used, spec.op.symbols, spec.kernel.derive))


def table_entry(shape: dict, row: dict, baked: list[str]) -> dict:
    """What `choose` needs of a tuned shape's dispatch row."""
    return {"key": [shape[s] for s in baked], "shape": dict(shape), "use": row["use"], "trial": row["trial"]}


def dispatch_table(spec, history, compare: dict | None, baseline: list[float] | None) -> list[dict]:
    from ..core.figures import per_shape_best

    by_id = {t.id: t for t in history}
    rows = []
    best = per_shape_best(history, len(spec.op.shapes))
    for i, shape in enumerate(spec.op.shapes):
        row = {"shape": dict(shape), "use": "fallback", "trial": None, "params": None, "variant": None}
        if compare is not None:
            c = compare["shapes"][i]
            t, eager = c.get("tuned"), c["arms"].get("torch eager", {})
            row["evidence"] = "pipe compare"
            if t:  # the kernel compare.json names is built from the ledger's trial: they must agree
                judged_as(by_id, t["trial"], t["params"], t.get("variant"), f"shape {i}")
            if t and eager.get("time_s") and not eager.get("error"):
                # the smaller of the two eager figures (compare's, the run's own baseline): conservative
                ref = min(eager["time_s"], baseline[i]) if baseline else eager["time_s"]
                row.update(time_s=t["time_s"], baseline_s=ref)
                if t["time_s"] < ref * (1 - NOISE):
                    row.update(use="kernel", trial=t["trial"], params=t["params"], variant=t.get("variant"))
                else:
                    row["why"] = f"torch eager is within {NOISE:.0%} or faster"
            else:
                row["why"] = "no correct tuned kernel" if not t else "no eager figure to beat"
        elif best[i] is not None:
            b = best[i]
            row["evidence"] = "ledger (recorded times)"
            base = baseline[i] if baseline else None
            row.update(time_s=b["time_s"], baseline_s=base)
            if base and b["time_s"] < base * (1 - NOISE_RECORDED):
                row.update(use="kernel", trial=b["trial"], params=b["params"], variant=b["variant"])
            else:
                row["why"] = "no recorded baseline" if not base else f"not {NOISE_RECORDED:.0%} faster than the baseline"
        else:
            row["why"] = "no correct trial"
        if row["use"] == "kernel" and row["trial"] in by_id and by_id[row["trial"]].status != "ok":
            row.update(use="fallback", why="the trial is not ok")
        if row["use"] == "kernel" and spec.op.batch_axis:  # the judge's check of the trial (op.batch_invariant)
            row["batch_invariant"] = by_id[row["trial"]].details.get("batch_invariant") \
                if row["trial"] in by_id else None
        rows.append(row)
    return rows


def unanchored(rd, run_dir: Path, what: str = "") -> None:
    """Refuse a compare.json that is not the file pipe compare last wrote, by the sha256 the
    ledger recorded of it (ship/rundata.compare_problem): its range table's lists and bounds,
    drops and verified counts, each shape's pick and the held-out ships are compare's verdicts,
    and the ledger's check of its trials cannot vouch for them."""
    why = rd.compare_changed(run_dir)
    if why:
        raise ExportError(what + why)


def judged_as(by_id: dict, tid, params: dict, variant, where: str) -> None:
    """compare.json names a kernel by trial id, parameters and variant; export builds what it
    names. It must be an ok trial of the ledger with those very parameters and that variant,
    else compare.json was edited or made for another run (ExportError): what ships is what
    the judge judged."""
    t = by_id.get(tid) if isinstance(tid, int) else None
    if t is None or t.status != "ok" or t.params != params or (t.variant or None) != (variant or None):
        raise ExportError(f"compare.json ({where}) names trial #{tid} with parameters {params} and variant "
                          f"{variant}, which is not an ok trial of this run's ledger: run pipe compare again")


def range_section(spec, rt: dict, history, ship) -> dict:
    """The package's table by range (from pipe compare's range_table): its ranges and exact
    shapes with their kernel lists, and each listed kernel's parameters and cubin
    (`ship(tid, trial)` compiles one into the package)."""
    by_id = {t.id: t for t in history}
    used = [int(t) for r in rt["ranges"] + rt["exact"] for t in r["use"]] + \
        [int(t) for r in rt["ranges"] for w in r.get("rows", ()) for t in w["use"]]
    kernels = {}
    for tid in dict.fromkeys(used):
        t = by_id.get(tid)
        if t is None or t.status != "ok":
            raise ExportError(f"the range table names trial #{tid}, which is not an ok trial of this run: "
                              "run pipe compare again")
        kernels[str(tid)] = {"params": t.params, "cubin": ship(tid, t)}
        if spec.op.batch_axis:  # whether the judge found its rows independent of the batch (or None: unchecked)
            kernels[str(tid)]["batch_invariant"] = t.details.get("batch_invariant")
    from ..spec.spec import ROWS_CAP

    return {"axes": rt["axes"], "domain": {s: [d.min, d.max] for s, d in spec.op.domain.items()},
            # a `tune` symbol with no max serves up to ROWS_CAP times its tuning value (Op.row_cap):
            # what the judge verified; above it, the fallback
            "caps": {s: f"{ROWS_CAP} * max({d.min}, int({d.tune.text}))" for s, d in spec.op.domain.items()
                     if d.tune is not None and d.max is None},
            # op.domain_where: a size where it does not hold is outside the domain (the fallback)
            "where": spec.op.domain_where.text if spec.op.domain_where is not None else None,
            "elem": spec.op.shape_env({})["elem"],  # what `elem` stands for in it (the dtype's bytes)
            "serves": spec.kernel.serves.text if spec.kernel.serves is not None else None,
            # rows (several `tune` levels): below a value of the level symbol, another kernel list
            **({"levels": rt["levels"]} if rt.get("levels") else {}),
            # op.fallbacks: a range (or level row, or named shape) whose fallback is one of the
            # spec's arms names it (`fallback`); the package ships the arm's module
            # (`fallbacks`: name -> {"module": file, "fn": function}; export_package copies them)
            "ranges": [{"lo": r["lo"], "hi": r["hi"], "use": [int(t) for t in r["use"]],
                        **_fallback_key(r),
                        **({"rows": [{"below": w["below"], "use": [int(t) for t in w["use"]], **_fallback_key(w)}
                                     for w in r["rows"]]}
                           if r.get("rows") else {})} for r in rt["ranges"]],
            "exact": [{"shape": e["shape"], "use": [int(t) for t in e["use"]], **_fallback_key(e)}
                      for e in rt["exact"]],
            # pipe compare's check of every listed kernel over its ranges (None: a compare made before it)
            "verified": rt.get("verified"),
            **({"fallbacks": {name: {"module": f"_fallback_{i}.py", "fn": target.rpartition(":")[2],
                                     "target": target}
                              for i, (name, target) in enumerate(sorted(rt["fallbacks"].items()))}}
               if rt.get("fallbacks") else {}),
            "kernels": kernels}


def _fallback_key(r: dict) -> dict:
    return {"fallback": r["fallback"]} if r.get("fallback") else {}


def same_op(s) -> tuple:
    """What an --exact run must share with the main run: the op (reference, dtype, tensors,
    scalars with their values), the hardware and the backend. The scalars' values too: the table
    keeps one value a scalar, and its kernels run at it alone (exported_runtime.Op.verified_scalars),
    so both runs' kernels must have been verified there."""
    return (s.op.reference, s.op.dtype, [(t.name, t.dtype, [d.text for d in t.shape]) for t in s.op.inputs],
            [(t.name, t.dtype, [d.text for d in t.shape]) for t in s.op.outputs],
            [(x.name, x.type, x.value) for x in s.op.scalars], s.hw.name, s.kernel.backend)


def open_exact(spec, run_dir: Path, spec_path: str | None, force: bool):
    """The --exact run: the same op (reference, tensors, scalars, dtype), the same hardware,
    its sizes compiled in, and a pipe compare of it."""
    from .rundata import open_run

    rd = open_run(run_dir, spec_path, "export packages", force=force)
    unanchored(rd, run_dir, "--exact ")
    es = rd.spec
    if same_op(es) != same_op(spec):
        raise ExportError(f"--exact {run_dir}: {es.name} is not the same op on the same hardware as {spec.name} "
                          "(reference, tensors, scalars and their values, dtype, profile and backend must agree)")
    if es.op.domain:
        raise ExportError(f"--exact {run_dir}: {es.name} has op.domain; --exact takes a run with sizes compiled in")
    if rd.compare is None or rd.compare.get("spec_hash") != es.hash:
        raise ExportError(f"--exact {run_dir}: run pipe compare on it first (its kernels take a size only where "
                          "a fresh side-by-side timing found them faster)")
    return rd


def exact_entries(spec, rt: dict, ex, ship_src) -> list[dict]:
    """Entries for the --exact run's kernels: each tuned size whose kernel beat torch eager
    (its pipe compare), and, where the range run timed the same shape, beat the table's
    choice there too. Each carries its own launch section (its spec's derived values,
    geometry and arguments) and its sizes compiled in (`key`)."""
    from ..build.builder import Builder

    es = ex.spec
    rows = dispatch_table(es, ex.history, ex.compare, ex.baseline)
    baked = baked_symbols(es)
    builder = Builder(es)
    builder.variants = ex.variants
    out = []
    for i, row in enumerate(rows):
        if row["use"] != "kernel":
            continue
        shape = es.op.shapes[i]
        ranged = next((e for e in rt["exact"] if e["shape"] == shape), None)
        why = "faster than torch eager (pipe compare of the exact run)"
        if ranged is not None:
            mine = row["time_s"]
            theirs = ranged["times_s"].get(str(ranged["use"][0])) if ranged["use"] else ranged.get("eager_s")
            if theirs is not None and mine >= theirs:
                continue  # the range table is as fast there
            why += f" and than the range table there ({theirs * 1e6:.1f} us against {mine * 1e6:.1f} us)" \
                if theirs else ""
        cubin = ship_src(builder.render_all(row["params"], row["variant"])[i],
                         f"kernels/exact{i}-trial{row['trial']}.cubin",
                         f"exact run trial #{row['trial']} does not compile any more")
        out.append({"key": [shape[s] for s in baked], "baked": baked, "shape": dict(shape), "use": "kernel",
                    "trial": row["trial"], "params": row["params"], "cubin": cubin, "time_s": row.get("time_s"),
                    **({"batch_invariant": row.get("batch_invariant")}
                       if es.op.batch_axis and es.op.batch_axis == spec.op.batch_axis else {}),
                    "baseline_s": row.get("baseline_s"), "evidence": f"exact run {es.name}: {why}",
                    "launch": {**launch_table(es), "args": list(es.kernel.args), "entry": es.kernel.entry}})
    return out


def range_rule(spec) -> str:
    dom = ", ".join(f"{s} {d.min}..{d.max if d.max is not None else 'any'}" for s, d in spec.op.domain.items())
    if spec.op.domain_where is not None:
        dom += f", where {spec.op.domain_where.text}"
    return (f"a shape inside the domain ({dom}) takes the kernel of its range (a named shape: its own list): "
            "the first of the list that serves it (kernel.serves), else the torch reference; any other shape, "
            "CPU tensors and non-contiguous inputs use the torch reference")


def rule_text(baked: list[str], symbols: list[str]) -> str:
    free = [s for s in symbols if s not in baked]
    sizes = ", ".join(baked) or "sizes"
    return (f"a shape uses the kernel tuned for the same {sizes} (compiled into it); "
            f"{', '.join(free) or 'no size'} may differ, and among several such tuned shapes the nearest in "
            f"{', '.join(free) or 'size'} (log scale) decides; for a {sizes} nobody tuned but pipe compare "
            f"timed on a held-out shape, the configuration of the nearest tuned {sizes} (of equally near ones, "
            "the faster there), compiled for it, where it beat torch eager there; any other shape, CPU tensors "
            "and non-contiguous inputs use the torch reference")


def held_out_entries(compare: dict | None, baked: list[str], history=None) -> list[dict]:
    """Table rows for held-out shapes where pipe compare found the nearest tuned configuration,
    compiled for that shape, faster than torch eager (its `ship` record). With `history`, each
    must be an ok trial of the ledger with the parameters and variant compare.json names."""
    out: list[dict] = []
    by_id = {t.id: t for t in history} if history is not None else None
    for h in (compare or {}).get("held_out") or []:
        sh = h.get("ship")
        if not sh:
            continue
        if by_id is not None:
            judged_as(by_id, sh["trial"], sh["params"], sh.get("variant"), f"held-out shape {h.get('label')}")
        key = [h["shape"][s] for s in baked]
        same = [o for o in out if o["key"] == key]
        if same:  # pipe compare ships one kernel per size; a compare.json that does not is refused
            if same[0]["trial"] != sh["trial"]:
                raise ExportError(f"compare.json ships trials #{same[0]['trial']} and #{sh['trial']} for the same "
                                  f"compiled-in sizes {key}; run pipe compare again")
            continue
        out.append({"key": key, "shape": dict(h["shape"]), "use": "kernel",
                    "trial": sh["trial"], "params": sh["params"], "variant": sh.get("variant"),
                    "time_s": sh["time_s"], "baseline_s": sh["baseline_s"],
                    "evidence": "pipe compare (held-out shape)", "why": h.get("via")})
    return out


def describe(pkg: Path) -> list[str]:
    """What pipe export prints of a package it wrote: where it is, its rule, and each shape's
    kernel or the torch reference."""
    from ..core.figures import shape_label

    table = json.loads((pkg / "table.json").read_text())
    out = [f"exported {table['op']} to {pkg} (import it with {pkg.parent} on the path: import {pkg.name})",
           f"rule: {table['rule']}"]
    bi = table.get("batch_invariant")
    if bi:
        out.append(f"deterministic mode ({pkg.name}.set_deterministic(True) or PIPE_DETERMINISTIC=1): the "
                   f"batch-invariant kernels only, each size looked up at the smallest {bi['axis']}; "
                   "[inv]: batch-invariant")

    def inv(e: dict) -> str:
        return " [inv]" if bi and e.get("batch_invariant") is True else ""

    br = table.get("by_range")
    if br:
        for r in br["ranges"]:
            span = ", ".join(f"{a} {r['lo'][a]}..{r['hi'][a] - 1}" for a in br["axes"])
            out.append(f"  {span}: " + (", ".join(f"#{t} {json.dumps(br['kernels'][str(t)]['params'])}"
                                                  + inv(br["kernels"][str(t)])
                                                  for t in r["use"][:1]) or "torch reference"))
        for e in br["exact"]:
            out.append(f"  exactly {shape_label(e['shape'])}: " + (f"#{e['use'][0]}" if e["use"] else "torch reference"))
        v = br.get("verified")
        out.append(f"  verified over their ranges: {v['kernels']} kernels at {v['shapes']} sizes" if v else
                   "  not verified over their ranges (compare.json was made before pipe compare checked them): "
                   "run pipe compare again to check every kernel at up to 48 sizes of each range")
    for e in table["entries"]:
        label = shape_label(e["shape"])
        if e["use"] == "kernel":
            out.append(f"  {label}: trial #{e['trial']} {json.dumps(e['params'])}{inv(e)} "
                       f"({e['baseline_s'] / e['time_s']:.2f}x torch eager, {e['evidence']})")
        else:
            out.append(f"  {label}: torch reference ({e.get('why')})")
    return out


def _is_export(path: Path) -> bool:
    try:
        return json.loads((path / "table.json").read_text()).get("format") == "pipe-dispatch/1"
    except (OSError, ValueError):
        return False


def _ident(name: str) -> str:
    s = re.sub(r"\W+", "_", name).strip("_").lower()
    return s if s and not s[0].isdigit() else f"op_{s}"


def launch_table(spec) -> dict:
    """The spec's derived values and launch geometry as expression texts, for the exported
    runtime to evaluate per shape (Op.geometry), its scratch buffers (kernel.scratch: name,
    dtype, shape expressions), which the exported op allocates (Op.workspace), and its tensor
    maps (kernel.tensor_maps: name, tensor, box expressions, swizzle), which it builds per call
    (Op.arguments)."""
    k = spec.kernel
    return {"derive": [[n, e.text] for n, e in k.derive],
            "geometry": {"grid": [e.text for e in k.grid], "block": [e.text for e in k.block],
                         **({"cluster": [e.text for e in k.cluster]} if k.cluster else {}),
                         **({"shared_mem": [k.shared_mem.text]} if k.shared_mem else {})},
            **({"scratch": [{"name": s.name, "dtype": s.dtype, "shape": [d.text for d in s.shape]}
                            for s in k.scratch]} if k.scratch else {}),
            # kernel.tensor_maps: the exported op builds each descriptor on the caller's tensor
            **({"tensor_maps": [{"name": m.name, "tensor": m.tensor, "box": [d.text for d in m.box],
                                 "swizzle": m.swizzle, **({"when": m.when.text} if m.when is not None else {})}
                                for m in k.tensor_maps]} if k.tensor_maps else {})}


def export(run_dir: Path, out_dir: Path, name: str | None = None, spec_path: str | None = None,
           force: bool = False, exact: Path | None = None, exact_spec: str | None = None) -> Path:
    from .rundata import open_run
    from ..build.builder import Builder

    rd = open_run(run_dir, spec_path, "export packages", force=force)
    unanchored(rd, run_dir)
    spec, history, variants = rd.spec, rd.history, rd.variants
    if spec.kernel.backend != "cuda":
        raise ExportError(f"{spec.name}: only CUDA runs can be exported (this one uses the {spec.kernel.backend} backend)")
    compare, baseline = rd.compare, rd.baseline
    if compare is not None and compare.get("spec_hash") != spec.hash:
        raise ExportError(f"{run_dir / 'compare.json'}: made for another version of the spec; run pipe compare again")
    if spec.op.domain and (compare is None or "range_table" not in compare):
        raise ExportError(f"{run_dir}: a spec with op.domain ships a table by range, and its boundaries are "
                          f"measured by pipe compare: run `pipe compare {run_dir}` first")
    rows = [] if spec.op.domain else dispatch_table(spec, history, compare, baseline)
    if exact is not None and not spec.op.domain:
        raise ExportError("--exact joins a run with sizes compiled in to a table by range: "
                          f"{spec.name} has no op.domain")
    ex = open_exact(spec, exact, exact_spec, force) if exact is not None else None
    name = _ident(name or spec.name)
    final = out_dir / name
    if final.exists() and not _is_export(final):
        raise ExportError(f"{final} exists and is not a package pipe exported: choose another --out or --name")
    out_dir.mkdir(parents=True, exist_ok=True)
    pkg = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out_dir))  # built aside, then moved into place
    try:
        (pkg / "kernels").mkdir(parents=True)
        builder = Builder(spec)
        builder.variants = variants
        baked = baked_symbols(spec)

        def ship(src: str, cubin: str, what: str) -> str:
            """Compile one source into the package as `cubin`, with the source beside it."""
            arts, bad = builder.compiled([src])
            if bad is not None:
                raise ExportError(f"{what}: {bad.reason}")
            shutil.copyfile(arts[0], pkg / cubin)
            (pkg / cubin).with_suffix(".cu").write_text(src)
            return cubin

        entries = []
        for i, row in enumerate(rows):
            shape = spec.op.shapes[i]
            entry = {**table_entry(shape, row, baked), "why": row.get("why"), "evidence": row.get("evidence"),
                     "time_s": row.get("time_s"), "baseline_s": row.get("baseline_s"), "params": row["params"],
                     **({"batch_invariant": row["batch_invariant"]} if "batch_invariant" in row else {})}
            if row["use"] == "kernel":
                entry["cubin"] = ship(builder.render_all(row["params"], row["variant"])[i],
                                      f"kernels/shape{i}-trial{row['trial']}.cubin",
                                      f"trial #{row['trial']} does not compile any more")
            entries.append(entry)
        for i, entry in enumerate(held_out_entries(compare, baked, history)):
            if any(e["key"] == entry["key"] for e in entries):
                raise ExportError(f"compare.json ships a held-out kernel for tuned sizes {entry['key']}: it was made "
                                  "by another version of the table; run pipe compare again")
            cubin = ship(builder.render_all(entry["params"], entry["variant"], shapes=[entry["shape"]])[0],
                         f"kernels/held{i}-trial{entry['trial']}.cubin",
                         f"trial #{entry['trial']} does not compile for held-out shape {entry['shape']}")
            entries.append({**{k: v for k, v in entry.items() if k != "variant"}, "cubin": cubin})
        op = spec.op
        if ex is not None:
            entries += exact_entries(spec, compare["range_table"], ex, ship)
        by_range = None
        if op.domain:
            by_range = range_section(spec, compare["range_table"], history,
                                     lambda tid, t: ship(builder.render_all(t.params, t.variant, [op.shapes[0]])[0],
                                                         f"kernels/trial{tid}.cubin",
                                                         f"trial #{tid} does not compile any more"))
        table = {
            "format": "pipe-dispatch/1", "spec": spec.name, "spec_hash": spec.hash, "hardware": spec.hw.name,
            "arch": spec.hw.arch, "namespace": f"pipe_{name}", "name": _ident(op.reference.rpartition(":")[2]),
            "op": f"pipe_{name}.{_ident(op.reference.rpartition(':')[2])}", "entry": spec.kernel.entry,
            "args": list(spec.kernel.args), "symbols": list(op.symbols), "baked": baked,
            "rule": range_rule(spec) if op.domain else rule_text(baked, list(op.symbols)),
            "inputs": [{"name": t.name, "dtype": t.dtype, "shape": [d.text for d in t.shape]} for t in op.inputs],
            "outputs": [{"name": t.name, "dtype": t.dtype, "shape": [d.text for d in t.shape]} for t in op.outputs],
            # each scalar's value, the one every verified call had: the kernels run at it alone
            "scalars": [{"name": s.name, "type": s.type, "value": s.value} for s in op.scalars],
            # op.batch_invariant: the batch axis, for the exported op's deterministic mode (each
            # kernel's own `batch_invariant` says whether the judge found it so)
            "batch_invariant": {"axis": op.batch_axis, "required": op.batch_required} if op.batch_axis else None,
            **launch_table(spec),
            "entries": entries,
            **({"by_range": by_range} if by_range else {}),
            "compare": {"date": compare.get("date"), "machine": compare.get("machine")} if compare else None,
            # the judge's tolerance, for the runtime's check of a share of a user's calls (Op.check_call)
            "check": {"atol": op.atol, "rtol": op.rtol, "ulps": op.ulps,
                      "floor": None if math.isinf(op.floor) else op.floor,  # None: .inf (strict JSON has no Infinity)
                      "gemm_k": op.gemm_k.text if op.gemm_k is not None else None, "in_place": op.in_place},
            # every shipped cubin's sha256: the runtime loads none that differs (exported_runtime.Op._cubin)
            "digests": {f"kernels/{c.name}": hashlib.sha256(c.read_bytes()).hexdigest()
                        for c in sorted((pkg / "kernels").glob("*.cubin"))},
        }
        (pkg / "table.json").write_text(json.dumps(table, indent=1) + "\n")
        shutil.copyfile(Path(__file__).with_name("exported_runtime.py"), pkg / "_runtime.py")
        # the judge's error budgets, for the runtime's checks (it imports nothing but math and torch)
        shutil.copyfile(Path(__file__).parents[1] / "judge" / "verify.py", pkg / "_verify.py")
        mod, _, fn = op.reference.partition(":")
        from ..core.userpath import load_callable

        ref_mod = inspect.getmodule(load_callable(op.reference, spec.home))
        (pkg / "_reference.py").write_text(inspect.getsource(ref_mod))
        # op.fallbacks the range table takes somewhere: each arm's module, copied as the
        # reference's is (it must stand alone: the package imports nothing of pipe)
        for fb in ((by_range or {}).get("fallbacks") or {}).values():
            arm_mod = inspect.getmodule(load_callable(fb["target"], spec.home))
            (pkg / fb["module"]).write_text(inspect.getsource(arm_mod))
        (pkg / "__init__.py").write_text(_INIT.format(spec=spec.name, name=table["name"], qual=f"{table['namespace']}::{table['name']}",
                                                      fn=fn, rule=table["rule"],
                                                      qual_dot=f"{table['namespace']}.{table['name']}"))
    except BaseException:
        shutil.rmtree(pkg, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    pkg.rename(final)
    final.chmod(0o755)  # mkdtemp made it private
    return final


_INIT = '''"""{spec}, exported by pipe: `{name}` dispatches by shape to the tuned kernels
shipped here, or to the torch reference. Rule: {rule}.

    import <this package> as ops
    y = ops.{name}(...)                 # also torch.ops.{qual}
"""

from pathlib import Path

import torch

from . import _reference, _runtime

ROOT = Path(__file__).parent
op, _lib = _runtime.register(ROOT, _reference.{fn})
table = op.t
InputError = _runtime.InputError


def set_deterministic(on=True):
    """The deterministic mode (a spec with op.batch_invariant): only the kernels the judge found
    batch-invariant, each size looked up as if the batch were at its smallest, so a sequence
    gets the same bits in any batch; elsewhere the torch reference, which is not guaranteed
    to be batch-invariant. PIPE_DETERMINISTIC=1 at import turns it on too."""
    op.set_deterministic(on)


def deterministic():
    return op.deterministic


def set_check(share, action="fallback"):
    """Check `share` (0 to 1) of the kernels' calls, at random, against the float64 reference
    under the judge's error budget; `action` on a failure: "fallback" (the kernel leaves dispatch,
    the call returns the reference's answer, a RuntimeWarning says why), "raise" or "warn".
    PIPE_CHECK=SHARE (and PIPE_CHECK_ACTION) at import set it too. `checks()` says what they found."""
    op.set_check(share, action)


def checks():
    return dict(op.checks)


KernelCheckError = _runtime.KernelCheckError


def {name}(*args, **kwargs):
    """The op through torch.library (works under CUDA graph capture and torch.compile)."""
    names = [t["name"] for t in table["inputs"]] + [s["name"] for s in table["scalars"]]
    bound = dict(zip(names, args))
    bound.update(kwargs)
    missing = [n for n in names if n not in bound]
    if missing or len(bound) != len(names):
        raise InputError(f"{{table['op']}}: takes {{', '.join(names)}}")
    if torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in bound.values()):
        raise InputError(f"{{table['op']}}: forward only (no backward is exported); call it under "
                         "torch.no_grad() or torch.inference_mode(), or on tensors that do not require grad")
    return torch.ops.{qual_dot}(*[bound[n] for n in names])
'''

