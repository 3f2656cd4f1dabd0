# Does verification's serving draw make unread K/V rows and past-last-page table entries
# recognisable (always poison / always out of pool), where a user's memory holds stale finite data?
import torch, math
from runner.spec.spec import load_spec
from runner.judge.inputs import make_inputs
from runner.ops import reference as R
spec = load_spec("pipelines/decode-attention-paged16-h200.yaml")
op = spec.op
shape = {"B": 3, "MAXP": 9}
pois_vals, finite_unread, inpool_past, sets_with_past = 0, 0, 0, 0
for seed in range(200):
    x = make_inputs(op, shape, seed, 0, "cpu", serving=R.decode_attention_paged.serving)
    t, ln, kc = x["block_table"].long(), x["lens"].long(), x["k_cache"]
    page = kc.shape[1]; npool = kc.shape[0]
    for b in range(t.shape[0]):
        used = (int(ln[b]) + page - 1) // page
        if int(ln[b]) % page:  # the row at lens[b] in the last page
            row = kc[t[b, used - 1], int(ln[b]) % page].float()
            big = torch.finfo(kc.dtype).max
            if bool((~torch.isfinite(row)).all() | (row.abs() == big).all()): pois_vals += 1
            else: finite_unread += 1
        if used < t.shape[1]:
            sets_with_past += 1
            if 0 <= int(t[b, used]) < npool: inpool_past += 1
print(f"row at lens[b] in a partial last page: poison {pois_vals}, ordinary finite {finite_unread}")
print(f"table entry right past the last page: sequences {sets_with_past}, in-pool {inpool_past}")
# contiguous op
spec2 = load_spec("pipelines/decode-attention-h200.yaml")
sh = spec2.op.extra_shapes[0]; print("contiguous shape", sh)
p = f = 0
for seed in range(200):
    x = make_inputs(spec2.op, sh, seed, 0, "cpu", serving=R.decode_attention.serving)
    k, ln = x["k"], x["lens"].long()
    for b in range(k.shape[0]):
        if int(ln[b]) < k.shape[1]:
            row = k[b, int(ln[b])].float()
            if bool((~torch.isfinite(row)).all() | (row.abs() == torch.finfo(k.dtype).max).all()): p += 1
            else: f += 1
print(f"contiguous: K row at lens[b]: poison {p}, ordinary {f}")
