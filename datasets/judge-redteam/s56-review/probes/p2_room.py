# The room poisoned() adds (lead before the front band, room-lead after the back band) is inside the
# judge's buffer but never checked: a write there is unseen, at an offset a kernel can compute.
import torch
from runner.judge.verify import poisoned, GUARD, user_alignment
for numel, dt in ((1000, torch.float32), ((1 << 20) // 2, torch.bfloat16)):
    p = poisoned((numel,), dt, "cpu")
    isz = p.buf.element_size()
    after = p.buf.numel() - (p.front + p.numel + GUARD)
    print(f"numel {numel} {dt}: align {user_alignment(numel*isz)} lead {p.lead} unchecked tail {after} elems; "
          f"buf ptr%512={p.buf.data_ptr()%512} out ptr%align={p.view.data_ptr()%user_alignment(numel*isz)}")
    # stash a marker just past the back band and before the front band
    tail = p.buf[p.front + p.numel + GUARD:]
    tail[:min(64, tail.numel())] = 123.0
    if p.lead: p.buf[:p.lead] = 7.0
    print("  guards_intact after writes to the room:", p.guards_intact())
    p.buf[p.front + p.numel + GUARD - 1] = 1.0
    print("  guards_intact after a write to the last band element:", p.guards_intact())
