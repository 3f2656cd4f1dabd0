"""Batch invariance (op.batch_invariant): is a row's output the same, bit for bit, whatever
batch it is computed in?

A serving engine that needs reproducible outputs wants a sequence's answer not to depend on
the batch it happens to share a step with, nor on how many SMs are free: a kernel that picks
its split of the work, its reduction order or its code path from the batch size (B == 1 taken
apart, say) gives other bits for the same row. The judge checks it at verification, on every
trial, for a spec that names its batch axis:

- **Run to run.** Each check round already calls the kernel twice on the same inputs (with
  two different decoys in the outputs); with a batch axis the two outputs must agree bit
  for bit (`run_to_run`), on every shape and round.
- **Sub-batches.** On up to SHAPES verified shapes with a batch of at least 3 (drawn from
  the trial's secret seed), after the last check round's two calls, the kernel is called
  again on batches built from the same rows (`plan`): row i alone (a batch of one), every
  row in another order, and a smaller batch of some of the rows at other places, the rest
  fresh random rows. The row, the order, the size and the places come from the seed, which
  is drawn after the build. Each call is on a shape of its own (the batch differs): its
  launch geometry and scratch buffers are worked out for that shape, its outputs and
  scratch freshly allocated (a decoy in the outputs, the scratch zeroed), and every rule of
  a checked call holds there (guard bands, scratch left zero, inputs unchanged, no thread
  outliving the call). Each row of the original batch is compared with its output in the
  full batch, as raw bits (a NaN's payload counts).

A kernel whose rows differ is not wrong for it: it lacks the property, and the trial records
`batch_invariant: false` with the reason (which row, which composition). A differing row is
still held to the error budget against the reference (a kernel wrong on a batch of one is
wrong). Under `op.batch_invariant: {axis, require: true}` a kernel that is not invariant is
judged wrong.
"""

from __future__ import annotations

import random

SHAPES = 2  # verified shapes (batch >= 3) checked on sub-batches, per trial


def derangement(n: int, rng: random.Random) -> list[int]:
    """A random order of range(n) that moves every element (n >= 2)."""
    while True:
        p = list(range(n))
        rng.shuffle(p)
        if all(i != x for i, x in enumerate(p)):
            return p


def plan(axis: str, shapes: list[dict], seed: int, serves=None, n_shapes: int = SHAPES) -> list[dict]:
    """The sub-batch checks of one trial: per checked shape (an index into `shapes`),
    {"index", "row", "subs": [{"kind", "shape", "rows"}]}; `rows[p]` is the row of the full
    batch at place p of the sub-batch, or None for a fresh random row. `serves(shape)` says
    whether the configuration serves a sub-batch's shape (kernel.serves, op.domain); a
    composition it does not serve is left out (`skipped`)."""
    rng = random.Random(seed)
    cands = [i for i, s in enumerate(shapes) if s.get(axis, 0) >= 3]
    picks = sorted(rng.sample(cands, min(n_shapes, len(cands))))
    out = []
    for si in picks:
        shape = dict(shapes[si])
        b = shape[axis]

        def ok(k: int, shape=shape) -> bool:
            return serves is None or bool(serves({**shape, axis: k}))

        i = rng.randrange(b)
        subs, skipped = [], []
        if ok(1):
            subs.append({"kind": "alone", "shape": {**shape, axis: 1}, "rows": [i]})
        else:
            skipped.append(f"alone: the configuration does not serve {axis}=1")
        subs.append({"kind": "reordered", "shape": shape, "rows": derangement(b, rng)})
        sizes = [k for k in range(2, b) if ok(k)]
        if sizes:
            k = rng.choice(sizes)
            n_own = rng.randint(1, k - 1)  # at least one fresh row
            own = [i] + rng.sample([x for x in range(b) if x != i], n_own - 1)
            rows: list = [None] * k
            for p, x in zip(rng.sample(range(k), n_own), own):
                rows[p] = x
            subs.append({"kind": "mixed", "shape": {**shape, axis: k}, "rows": rows})
        else:
            skipped.append(f"mixed: the configuration serves no {axis} between 2 and {b - 1}")
        out.append({"index": si, "row": i, "subs": subs, **({"skipped": skipped} if skipped else {})})
    return out


def describe(sub: dict) -> str:
    """A composition in words, for reasons: 'row 3 alone', 'the 6 rows in the order [...]'."""
    rows = sub["rows"]
    if sub["kind"] == "alone":
        return f"row {rows[0]} alone (a batch of 1)"
    if sub["kind"] == "reordered":
        return f"the {len(rows)} rows in the order {rows}"
    return (f"a batch of {len(rows)}: " + ", ".join("fresh" if r is None else f"row {r}" for r in rows))


def sub_inputs(op, axis: str, inputs: dict, rows: list, fresh: dict | None) -> dict:
    """The inputs of a sub-batch: for every input with the batch axis, a new tensor whose place
    p holds row rows[p] of `inputs` (or of `fresh` where rows[p] is None); the other inputs
    copied whole. Every tensor is a new allocation."""
    import torch

    out = {}
    own = [p for p, r in enumerate(rows) if r is not None]
    for t in op.inputs:
        x = inputs[t.name]
        if not any(axis in d.names for d in t.shape):
            out[t.name] = x.clone()
            continue
        if fresh is not None:
            y = fresh[t.name].clone()
        else:
            y = torch.empty((len(rows), *x.shape[1:]), dtype=x.dtype, device=x.device)
        if own:
            idx = torch.tensor([rows[p] for p in own], device=x.device)
            y[torch.tensor(own, device=x.device)] = x.index_select(0, idx)
        out[t.name] = y
    return out


def differing_rows(full, sub, rows: list):
    """[(place p, row r)] where the sub-batch's output at p differs from the full batch's row r,
    bit for bit (raw bytes: -0.0 is not 0.0, and NaNs are compared by their payload)."""
    import torch

    from .verify import bits

    own = [(p, r) for p, r in enumerate(rows) if r is not None]
    if not own:
        return []
    dev = full.device
    a = full.index_select(0, torch.tensor([r for _, r in own], device=dev))
    b = sub.index_select(0, torch.tensor([p for p, _ in own], device=dev))
    n = len(own)
    diff = (bits(a).view(n, -1) != bits(b).view(n, -1)).any(dim=1).cpu().tolist()
    return [pr for pr, d in zip(own, diff) if d]


def first_difference(a, b) -> str:
    """Where two tensors of the same shape first differ in their bits, and how many do."""
    from .verify import bits

    ba, bb = bits(a), bits(b)
    ne = ba != bb
    n = int(ne.sum())
    if not n:
        return "no element differs"
    i = int(ne.nonzero()[0])
    va, vb = a.reshape(-1)[i].item(), b.reshape(-1)[i].item()
    w = a.element_size() * 2
    m = (1 << (4 * w)) - 1
    return (f"{n} of {ne.numel()} elements differ, first at flat index {i}: {va!r} (bits "
            f"0x{int(ba[i]) & m:0{w}x}) vs {vb!r} (bits 0x{int(bb[i]) & m:0{w}x})")
