"""How many distinct kernels a spec's space holds: every configuration is built (rendered,
checked against the forbidden rules, compiled for every shape, checked against the
profile's limits) and configurations whose binaries and launches are byte for byte the same
are counted once, as the runner judges them (judge.evaluator.Evaluator: "the same kernels as #K"). Needs
no GPU. It tells what an exhaustive sweep (`pipe record`) will cost:
    python3 tools/count_kernels.py pipelines/softmax-h200.yaml
"""

import json
import sys
import time

from runner.spec.spec import load_spec
from runner.build.builder import Builder
from runner.build.render import RenderError
from runner.core.errors import ExprError


def main(path: str) -> int:
    spec = load_spec(path)
    builder = Builder(spec)
    groups: dict[str, int] = {}
    statuses: dict[str, int] = {}
    first: dict[str, str] = {}  # status -> the first configuration's reason, for a space none of which builds
    t0 = time.time()
    for n, cfg in enumerate(spec.space, 1):
        try:
            sources, geometry = builder.render_all(cfg), builder.geometry(cfg)
            b = builder.build(sources, geometry)
            status, reason = b.status, b.reason
        except (RenderError, ExprError) as e:  # as a trial: this configuration fails, the count goes on
            status, reason = "render_error", str(e)
        statuses[status] = statuses.get(status, 0) + 1
        first.setdefault(status, f"{dict(cfg)}: {reason}")
        if status == "ok":
            key = builder.binary_key(b.artifacts, geometry)
            groups[key] = groups.get(key, 0) + 1
        if n % 100 == 0:
            print(f"{n} configurations, {len(groups)} distinct kernels, {time.time() - t0:.0f} s", file=sys.stderr)
    print(json.dumps({"spec": spec.name, "configurations": sum(statuses.values()), "builds": statuses,
                      "distinct_kernels": len(groups), "seconds": round(time.time() - t0)}))
    if not groups:  # nothing a sweep could time: say why, and fail
        for status, why in first.items():
            print(f"count_kernels: {status}, first at {why[:800]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    import argparse

    from runner.core.errors import PipeError

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", help="a spec file (pipelines/*.yaml)")
    try:
        sys.exit(main(ap.parse_args().spec))
    except PipeError as e:
        sys.exit(f"count_kernels: {e}")
