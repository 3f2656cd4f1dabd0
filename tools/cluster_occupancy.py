"""How many clusters of a spec's kernel the GPU holds at once (cuda.core's
max_active_clusters), against the grid the spec launches: a persistent kernel
(HOLD = "tma") must fit in one wave. Run on the GPU machine:
    python3 tools/cluster_occupancy.py pipelines/softmax-h200.yaml HOLD=tma TMAX=1024 EPT=32 MINB=1
At the spec's tuning shapes, or at the ones named with SHAPES=M1xN1/M2xN2 (a 2-D op's M and N):
    python3 tools/cluster_occupancy.py pipelines/softmax-range-h200.yaml SHAPES=512x262144 TPR=256 ITEMS=8 CL=16 PF=3
Clusters past the portable 8 blocks get the kernel's non-portable opt-in, as the runner gives them.
CLUSTERS=3/5/6 asks the same of the same compiled kernel (its registers and shared memory) launched
in clusters of each of those sizes instead: which sizes fill every SM of the GPU (the kernel need not
be correct at those sizes; nothing is launched):
    python3 tools/cluster_occupancy.py pipelines/softmax-range-h200.yaml SHAPES=512x262144 TPR=512 ITEMS=8 CL=8 PF=3 CLUSTERS=2/3/4/5/6/7/8
"""

import sys

from runner.build.backends import cuda
from runner.spec.spec import load_spec
from runner.build.builder import Builder


def main(argv):
    spec = load_spec(argv[0])
    # the spec's start, else (a range spec has none) each parameter's first value; NAME=VALUE
    # arguments override, in the parameter's type
    first = {p.name: p.values[0] for p in spec.space.params}
    cfg = dict(spec.start or first)
    shapes = spec.op.shapes
    sizes: list[int] = []
    for a in argv[1:]:
        k, _, v = a.partition("=")
        if k == "CLUSTERS":
            sizes = [int(c) for c in v.split("/") if c]
            continue
        if k == "SHAPES":
            shapes = [dict(zip(("M", "N"), map(int, s.split("x")))) for s in v.split("/")]
            continue
        cfg[k] = type(first[k])(v)
    from cuda.core import Device, ObjectCode

    from runner.ship.exported_runtime import launch_config, raise_smem

    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    builder = Builder(spec)
    for shape, src, geo in zip(shapes, builder.render_all(cfg, shapes=shapes), builder.geometry(cfg, shapes=shapes)):
        r = cuda.compile(src, spec.kernel.entry, spec.kernel.options, spec.hw)
        if not r.ok:
            print(shape, "compile error", r.reason)
            continue
        k = ObjectCode.from_cubin(r.artifact).get_kernel(spec.kernel.entry)
        smem = int(geo.get("shared_mem", 0))
        raise_smem(k, smem, dev.device_id, {}, None, geo.get("cluster"))
        cl = geo["cluster"][0] if geo.get("cluster") else 1
        grid = geo["grid"][0]
        conf = launch_config(geo["grid"], geo["block"], geo.get("cluster"), smem)
        most = k.occupancy.max_active_clusters(conf, stream=stream) if cl > 1 else \
            k.occupancy.max_active_blocks_per_multiprocessor(geo["block"][0], smem) * dev.properties.multiprocessor_count
        print(f"{shape}: grid {grid} blocks in clusters of {cl}, shared {smem} B: "
              f"{grid // cl} launched, {most} resident at once{'  (MORE THAN ONE WAVE)' if grid // cl > most else ''}")
        sms = dev.properties.multiprocessor_count
        for c in sizes:  # the same kernel in clusters of c: how many SMs those clusters hold
            cg = (c * sms,) + tuple(geo["grid"][1:])
            raise_smem(k, smem, dev.device_id, {}, None, (c, 1, 1))
            n = k.occupancy.max_active_clusters(launch_config(cg, geo["block"], (c, 1, 1), smem), stream=stream)
            per = max(1, int(k.occupancy.max_active_blocks_per_multiprocessor(geo["block"][0], smem)))
            print(f"  clusters of {c}: {n} resident at once, {n * c} blocks, {n * c / per:.0f} of {sms} SMs "
                  f"at {per} block(s) an SM")


if __name__ == "__main__":
    main(sys.argv[1:])
