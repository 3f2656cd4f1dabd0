"""Session 44 red team (CUDA build rules). For every variant vN_*/variant.cu.j2:
 1. `pipe render vN/spec.yaml --compile` on a copy of the shipped spec whose kernel.template is the
    variant (the route the brief asked for);
 2. the variant judged as the trial path judges it: Builder.build(render_all(params, vid), geometry,
    approved_sources(params, vid)) against the SHIPPED spec and template (datasets/judge-redteam/cuda_build.py);
 3. evidence: how often the forbidden construct occurs in the accepted build's PTX / SASS.
No GPU (NVRTC 13 + cuobjdump only)."""
import json, re, subprocess, sys
from pathlib import Path
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]  # the repo root (datasets/judge-redteam/s44-cuda)
sys.path.insert(0, str(ROOT / "datasets/judge-redteam"))
import cuda_build as cb  # noqa: E402
from runner.build import sass  # noqa: E402

def run(vdir: Path):
    meta = json.loads((vdir / "meta.json").read_text())
    spec, sets = meta["spec"], meta.get("set", {})
    text = (vdir / "variant.cu.j2").read_text()
    print(f"=== {vdir.name}: {meta['what']}")
    args = [str(ROOT / ".venv/bin/pipe"), "render", str(vdir / "spec.yaml"), "--compile"]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    print(f"  [1] pipe render --compile (copied spec): rc={r.returncode}: {(r.stdout + r.stderr).strip()[:300]}")
    ev = cb.builder(spec)
    params = {**ev.spec.starts[0], **sets}
    b = cb.build(spec, text, params)
    print(f"  [2] as a variant of the shipped template: {cb.verdict(b)}")
    if b.ptx is not None:
        print(f"      PTX counts (compiler code / asm / extern), variant: {b.ptx.get('code')} / {b.ptx.get('asm')} / {b.ptx.get('extern')}")
        if b.ptx_approved is not None:
            print(f"      approved: {b.ptx_approved.get('code')} / {b.ptx_approved.get('asm')} / {b.ptx_approved.get('extern')}")
    if b.status == "ok":
        arts, _ = ev.compiled(ev.render_all(params, list(ev.variants)[-1]))
        for a in list(dict.fromkeys(arts))[:1]:  # the first shape's build
            ptx_text = Path(a).with_suffix(".ptx").read_text()
            print(f"  [3] PTX /{meta['ptx_rx']}/: {len(re.findall(meta['ptx_rx'], ptx_text))} match(es)")
            if meta.get("sass_rx"):
                s = sass.disassemble(a)
                print(f"      SASS /{meta['sass_rx']}/: {len(re.findall(meta['sass_rx'], s))} match(es)")

if __name__ == "__main__":
    for d in sorted(HERE.glob("v*_*/")) if len(sys.argv) < 2 else [HERE / a for a in sys.argv[1:]]:
        run(d)
