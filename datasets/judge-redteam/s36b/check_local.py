"""GPU-less check of session 36b's reproducers: each variant rendered, ruled on and compiled
(NVRTC, sm_90a per the h200 profile) through the runner's own Builder, its compiled code judged
against the approved template's build, as `pipe eval --variant` does before any GPU work.

    python datasets/judge-redteam/s36b/check_local.py      (from the repo root, venv active)
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
S36 = HERE.parent / "s36"
sys.path.insert(0, str(HERE.parents[2]))

from runner.build.builder import Builder  # noqa: E402
from runner.spec.spec import load_spec  # noqa: E402

CASES = [  # (spec, params, [variant files])
    (HERE / "xent-memo.yaml", {"BLOCK": 1024}, [HERE / "v_xent_lse_memo.cu.j2"]),
    (S36 / "softmax-stash.yaml", {"BLOCK": 256}, [S36 / "v_slowed.cu.j2", HERE / "v_softmax_lse_memo.cu.j2"]),
]


def main() -> int:
    bad = 0
    for spec_path, params, variants in CASES:
        sp = load_spec(spec_path)
        b = Builder(sp)
        base = b.build(b.render_all(params), b.geometry(params))
        print(f"{spec_path.name}: approved template: {base.status} {base.reason or ''}")
        bad += base.status != "ok"
        for path in variants:
            name = path.stem
            b.variants[name] = path.read_text()
            got = b.build(b.render_all(params, name), b.geometry(params), b.approved_sources(params, name))
            print(f"  {name}: {got.status}" + (f" ({got.reason})" if got.reason else ""))
            bad += got.status != "ok"
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
