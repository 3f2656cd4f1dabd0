"""Outputs with guard bands, the error budget, and the comparison with the reference.

Each output lives in the middle of a larger buffer. The rest (the guard bands)
is filled once with secret values a user's memory could hold (`guard_values`; a
fixed sentinel told a kernel it was judged) and must still hold them bit for bit
after every checked call: a kernel that writes out of bounds is caught. A kernel's scratch
buffers (kernel.scratch, `Scratch`) live in guard bands the same way; they are
zeroed once, when allocated, and must be zero again after every checked call.

Before a checked call the output holds a plausible wrong answer, never NaN
poison a kernel could test for: in verification one run of each check round finds the
kernel's own output for another value set, the other, in secret shares, what else a
user's output holds (`prior_kinds`): zeros, a *decoy* (the reference's answer for a
value set the kernel is never given, cast to the output dtype; reversed and scaled by
17/16 in the second run) or stale values; in the timed calls whatever the kernel's
previous call left there (the other value set's output).
A kernel that skips elements, or stores only when the buffer looks empty, leaves
a wrong answer there, and the error budget is tight enough to see it:

    |out - ref| <= (rtol + ulps * eps) * |ref| + max(min(atol, floor * mean|ref|), ulps * tiny)

eps is the output dtype's relative spacing (2^-7 for bf16, 2^-23 for fp32), tiny
its smallest subnormal, mean|ref| the mean magnitude of that output's reference.
The spec's atol is an absolute floor for values near zero only: it never exceeds
`floor` (2^-7 unless the spec says) times the output's typical magnitude, so an
output whose values all sit far below atol (softmax, about 1/N) is still checked
to a few units of its own rounding.

Snapshots (`Snapshot`) keep a checked call's output for comparison with a reference
computed later (no reference exists while candidate code runs); a host-held
checksum (the sum of the bit patterns and a sample at secret positions) shows that
the kernel did not rewrite the copy in the meantime.
"""

from __future__ import annotations

import math

import secrets
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

GUARD = 4096  # elements on each side of an output
USER_BIG = 1 << 20  # bytes: torch's caching allocator serves tensors this large from large segments
USER_BIG_ALIGN = 2 << 20  # ... which start on 2 MiB boundaries
USER_SMALL_ALIGN = 512  # the allocator's rounding of smaller blocks
# A shape verified and not timed takes all its buffers (outputs, and the inputs of every round
# with new buffers) at secret offsets of 16 bytes, up to PLACE_SPAN bytes past the allocator's
# alignment, or all of them where the allocator puts them: a secret half of a trial's such shapes
# each way (Placement). The exported op serves any 16-byte aligned tensor (x[1:] of a user's
# rows), so a kernel must be right there; with every verified pointer on the allocator's 512-byte
# (CPU arena: page) boundary, a kernel wrong off it was `ok` (session 55's red team). Decided a
# shape and not a buffer, so that shapes whose every pointer is aligned stay as common as the
# others; split across the trial's shapes and not drawn for each, since a draw for each left a
# trial of 6 such shapes with none placed, or none off a 64-byte line, in 6% of trials (a kernel
# wrong only off one was `ok` there: session 58's CI).
PLACE_SPAN = 4096
GUARD_POISON = -31337.0  # the guard bands' sentinel (floating outputs)
INT_GUARD_POISON = -0x5A5A5A5A
DEFAULT_FLOOR = 2.0 ** -7
DEFAULT_ULPS = 1.0
# (mantissa bits, smallest subnormal) per floating dtype
FLOAT_INFO = {torch.bfloat16: (7, 2.0 ** -133), torch.float16: (10, 2.0 ** -24),
              torch.float32: (23, 2.0 ** -149), torch.float64: (52, 2.0 ** -1074)}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
SAMPLE = 1 << 16  # elements of a snapshot sampled into its checksum
# The lean of the error (`lean`): over a sample of a narrow output, the mean of its difference
# from the reference rounded to nearest, along the reference's sign, in units of the output's
# rounding. Rounding to nearest leaves it at zero; a value cut toward zero on its way (the
# output, or an intermediate truncated to fewer bits whose shrink reaches the output) pulls it
# toward -1/2 of a unit.
LEAN_MAX = 0.125  # units of the output's rounding: a quarter of a truncation's -1/2
LEAN_SIGMAS = 6.0  # and beyond this many standard errors of the sample's mean
LEAN_SAMPLE = 1 << 20  # elements drawn (at secret positions) from a larger output
LEAN_MIN = 1024  # fewer elements of normal size than this: no verdict on the output alone (pooled_lean)
LEAN_CLIP = 2.0  # each element's error clipped to +-2 units: cancellation's large, symmetric errors
NORMAL_MIN = {torch.bfloat16: 2.0 ** -126, torch.float16: 2.0 ** -14}


LINE = 64  # bytes: the line whose classes of offset (0, 16, 32, 48 bytes into it) Placement cycles


class Placement:
    """Where a trial's `n` verified-only shapes put their buffers. A secret half of them (the odd
    one's side a secret coin) take every buffer at a secret offset (`shift`), the rest where the
    allocator puts them, so that a trial of two or more such shapes meets both kinds of call a
    user makes. A buffer's offset (named by `key`: an input's name, an output's) steps through
    the four 16-byte classes of a 64-byte line from a secret start, one class for each placement
    of it, each class at a secret place among PLACE_SPAN's (class 0: off a 512-byte boundary, where
    the CUDA allocator's own pointers are, or on one off a 4 KiB page, where the CPU arena's are
    not: place_shift): two placements of a buffer meet at least one offset
    off a 64-byte line, four meet every class (`rng`: a random.Random, for tests; the judge's
    own: the system's secret source)."""

    def __init__(self, n: int, rng=None):
        self._rng = rng if rng is not None else secrets.SystemRandom()
        k = n // 2 + (n % 2 if self._rng.random() < 0.5 else 0)
        kinds = [True] * k + [False] * (n - k)
        self._rng.shuffle(kinds)
        self.kinds = kinds
        self._turns: dict = {}

    def timed_rounds(self, rounds: list[list]) -> set[tuple[int, int]]:
        """Where a trial places none of its verified-only shapes (it has none, or its one drew the
        aligned side), every verified pointer would sit where the allocator puts it, though the
        exported op serves any 16-byte aligned input (`x[1:]` of a user's batch): then two secret
        new-buffer rounds (even ones) of the timed shapes (`rounds`: their rounds, in order) take
        their inputs at secret offsets, so that the buffer's two placements meet an offset off a
        64-byte line. One round where the timed shapes have no second. (shape, round) pairs."""
        if any(self.kinds):
            return set()
        evens = [(si, r) for si, rs in enumerate(rounds) for r in range(0, len(rs), 2)]
        return set(self._rng.sample(evens, min(2, len(evens))))

    def placed(self, i: int) -> bool:
        """Whether verified-only shape `i` (0 for the first) takes its buffers at secret offsets."""
        return 0 <= i < len(self.kinds) and self.kinds[i]

    def shift(self, element_size: int, key) -> int:
        """Elements buffer `key` starts past its allocation at its next placement: a multiple of 16
        bytes from 16 to PLACE_SPAN - 16, in the next class of its turn; 0 where 16 bytes are no
        whole number of elements."""
        if element_size <= 0 or 16 % element_size:
            return 0
        start, used = self._turns.get(key) or (self._rng.randrange(LINE // 16), 0)
        self._turns[key] = (start, used + 1)
        cls = (start + used) % (LINE // 16)
        # class 0 on 512 bytes (off a page) only once the buffer has met an offset off 512 bytes:
        # its first placement is always off them, a boundary every allocator's pointer is on
        return place_shift(element_size, self._rng, cls, block=used > 0)


def place_shift(element_size: int, rng=None, cls: int | None = None, block: bool = False) -> int:
    """Elements a placed buffer starts past its allocation: a secret multiple of 16 bytes, from 16
    to PLACE_SPAN - 16 (`rng`: a random.Random, for tests); with `cls`, one `cls` * 16 bytes past a
    64-byte line (LINE) and, for class 0, off a 512-byte boundary or, with `block`, in a secret half
    on one but off a 4 KiB page. 0 where 16 bytes are no whole number of elements."""
    if element_size <= 0 or 16 % element_size:
        return 0
    rng = rng if rng is not None else secrets.SystemRandom()
    per = LINE // 16
    if cls is None:
        k = rng.randrange(1, PLACE_SPAN // 16)
    elif cls % per:
        k = cls % per + per * rng.randrange(PLACE_SPAN // LINE)
    elif not block or rng.random() < 0.5:  # 64-byte steps, none a multiple of 512 bytes
        k = per * rng.choice([m for m in range(1, PLACE_SPAN // LINE) if m % (512 // LINE)])
    else:  # or (`block`, a secret coin) on 512 bytes off a 4 KiB page: the CPU arena's own pointers are all
        # on a page, so with class 0 never on 512 bytes no verified pointer was there, where a
        # user's CPU tensor (torch aligns to 64 bytes) is one time in nine, and a kernel wrong only
        # there was `ok` in every trial (review of session 59, tests/data/block_tell.cpp.j2)
        k = (512 // 16) * rng.randrange(1, PLACE_SPAN // 512)
    return k * 16 // element_size


def placed(t: torch.Tensor, shift: int, share=None) -> torch.Tensor:
    """A copy of contiguous `t` starting `shift` elements into a buffer of its own (`share`: the
    runtime's, where a candidate's buffers live apart from the judge's: the CPU kernel host's
    arena); `t` itself, shared, at shift 0."""
    if shift <= 0 or t.numel() == 0:
        return share(t) if share else t
    buf = torch.empty(t.numel() + shift, dtype=t.dtype, device=t.device)
    # the pad holds nothing of the judge's (a freed tensor's values, say), and nothing a kernel could
    # tell from a user's memory either: elements of `t` itself at secret places, as the rows before
    # `x[1:]` of a user's batch hold such values. Zeros there were a tell (session 56's red team: a
    # kernel 1% off wherever x was off a 64-byte boundary with anything but zeros in the 16 bytes
    # before it was `ok`, and off on every such view of a user's batch)
    flat = t.reshape(-1)
    pick = torch.randint(0, flat.numel(), (shift,), generator=_secret_generator(), device="cpu")
    buf[:shift].copy_(flat[pick.to(flat.device)])
    if share:
        buf = share(buf)
    view = buf[shift:shift + t.numel()].view(t.shape)
    view.copy_(t)
    return view


@dataclass
class Poisoned:
    buf: torch.Tensor
    view: torch.Tensor
    numel: int
    front: int = GUARD  # the front guard's elements (GUARD, and a placement's shift)

    def fill(self, value) -> None:
        """Fill the output (not the guards) with one value."""
        self.view.fill_(value)

    def put(self, values: torch.Tensor) -> None:
        """The output holds `values` (a decoy) before a call."""
        self.view.copy_(values)

    def moved(self, buf: torch.Tensor) -> "Poisoned":
        """The same buffer (guards and all) over `buf`, a copy of `self.buf` elsewhere (the CPU
        kernel host's arena)."""
        f = self.front
        return Poisoned(buf, buf[f:f + self.numel].view(self.view.shape), self.numel, f, self.guard, self.lead)

    guard: torch.Tensor | None = None  # the bits of every element outside the output as filled, on the host
    lead: int = 0  # elements before the front guard (the room that puts the output at a user's alignment)

    def guards_intact(self, which: int = 0) -> bool:
        g = torch.cat([self.buf[:self.front], self.buf[self.front + self.numel:]])
        if self.guard is None:  # (a buffer made by hand, not by `poisoned`: the sentinel)
            return bool((g == _poison(self.buf.dtype)).all())
        return bool(torch.equal(bits(g).cpu(), self.guard))

    def restore_guards(self) -> None:
        """Every element outside the output put back as filled (from the bands' host copy): where
        another candidate's write changed them, so that the change is charged to that candidate
        alone (Judge._bystanders), never to this buffer's at its next check."""
        f, n = self.front, self.numel
        if self.guard is None:
            self.buf[:f].fill_(_poison(self.buf.dtype))
            self.buf[f + n:].fill_(_poison(self.buf.dtype))
            return
        g = self.guard.to(self.buf.device)
        bits(self.buf[:f]).copy_(g[:f])
        bits(self.buf[f + n:]).copy_(g[f:])


def _poison(dtype: torch.dtype):
    if dtype.is_floating_point:
        return GUARD_POISON
    if dtype == torch.bool:
        return True
    info = torch.iinfo(dtype)
    if info.min == 0:  # unsigned (uint8): the sentinel's low bits, never 0, which a kernel writes most often
        return INT_GUARD_POISON % (info.max + 1)
    return max(info.min, min(info.max, INT_GUARD_POISON))


def user_alignment(nbytes: int) -> int:
    """Where torch's CUDA caching allocator may start a tensor of `nbytes`: on 512 bytes always
    (its rounding), and a large one (USER_BIG or more) often on a 2 MiB boundary, at the start of
    a segment (of its own past 10 MiB; inside a 20 MiB one from 1 to 10 MiB, or split from a cached
    one, it need not be). A secret draw for a large one: a 2 MiB boundary in half the outputs, so
    that a kernel wrong at either placement is seen (the review of session 56: always 2 MiB made
    the other a place no verification reached)."""
    if nbytes >= USER_BIG and secrets.randbelow(2):
        return USER_BIG_ALIGN
    return USER_SMALL_ALIGN


def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: str, shift: int = 0) -> Poisoned:
    """An output inside guard bands of at least GUARD elements (`guard_values`). Unplaced (`shift`
    0), it starts where a user's `torch.empty` output of its size could (`user_alignment`: a
    large output on a 2 MiB boundary in a secret half, the front band as long as it takes);
    placed, `shift` elements past the front band (place_shift). Every element outside the output
    is checked. Every judged output once sat GUARD elements into its allocation, never on a 2 MiB
    boundary, where a user's large outputs often are: a kernel could tell the judge's calls by the
    output's address (session 56's red team)."""
    numel = 1
    for d in shape:
        numel *= d
    isz = torch.empty((), dtype=dtype).element_size()
    align = user_alignment(numel * isz) if not shift else 0
    room = align // isz if align else 0
    buf = torch.empty(numel + 2 * GUARD + shift + room, dtype=dtype, device=device)
    # `lead` elements of room first, where unplaced: the output then starts past GUARD elements of
    # band at the alignment a user's output has. The room is filled as the output is
    lead = (-(buf.data_ptr() + GUARD * isz) % align) // isz if align else 0
    f = lead + GUARD + shift
    band = guard_values(2 * GUARD + shift, dtype)  # the two bands, drawn on the host (a few KiB)
    buf[lead:f].copy_(band[:f - lead])
    buf[f + numel:f + numel + GUARD].copy_(band[f - lead:])
    blk = guard_values(max(1, min(numel, 1 << 16)), dtype).to(device)
    # the output itself (a decoy or the kernel's own output replaces it before a check) and the room
    # on either side: a block of such values tiled over each, with no temporary of their size
    for a, b in ((f, f + numel), (0, lead), (f + numel + GUARD, buf.numel())):
        _tile(buf[a:b], blk)
    # every element of the buffer outside the output is checked, the room included: a room the
    # check skipped was memory at an offset a kernel can work out from its own pointer, inside the
    # judge's buffer, where a write (a mark kept from one call to the next) went unseen (review of
    # session 56). Its host copy is the room's size more (up to 2 MiB, outputs of 1 MiB or more).
    g = bits(torch.cat([buf[:f], buf[f + numel:]])).cpu()
    return Poisoned(buf, buf[f:f + numel].view(shape), numel, f, g, lead)


def _secret_generator() -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(secrets.randbits(62))
    return g


def guard_values(n: int, dtype: torch.dtype) -> torch.Tensor:
    """What a guard band holds (on the host): values a user's memory next to a tensor could hold,
    drawn from `secrets`, never one fixed sentinel. The exported op's outputs come from torch.empty,
    so the memory beside them holds other tensors' values; a band of -31337 beside every output the
    judge ever gave let a kernel read one element past its output and know it was judged (session
    56's red team: a kernel 1% off wherever that element was not -31337 was `ok` on rmsnorm-cpu
    and rmsnorm-range-cpu, and off on every call made as the exported op makes them). Floating
    bands: normal values times a secret scale (2^-8 to 2^8); integer bands: small values; never
    0, so that a zero written past a scratch buffer shows (bool bands: True); a band is checked
    bit for bit against its host copy."""
    g = _secret_generator()
    if dtype.is_floating_point:
        scale = float(torch.exp2(torch.rand((), generator=g, dtype=torch.float64) * 16 - 8))
        x = (torch.randn(n, generator=g, dtype=torch.float64) * scale).to(dtype)
        # never 0 (nor -0): a kernel's clearing write one past its scratch must change the band
        return torch.where(x == 0, torch.full_like(x, scale), x)
    if dtype == torch.bool:  # (nonzero, as above: True)
        return torch.ones(n, dtype=torch.bool)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -1000), min(info.max, 1000)
    small = torch.randint(lo, hi + 1, (n,), generator=g, dtype=torch.int64)
    return torch.where(small == 0, torch.full_like(small, hi), small).to(dtype)


@dataclass
class Scratch:
    """A kernel's scratch buffer (kernel.scratch), owned by the judge: allocated for one
    configuration on one shape, inside guard bands that hold the outputs' sentinel, and
    zeroed once, at allocation (never the allocator's leftovers, which could be a freed
    reference). The judge never zeroes it again: the kernel must leave it zero after every
    call, and after every checked call `problem` says whether it did (bit for bit: -0.0 and
    NaN are not zero) and whether the guards still hold."""
    name: str
    mem: Poisoned

    @property
    def view(self) -> torch.Tensor:
        return self.mem.view

    @property
    def numel(self) -> int:
        return self.mem.numel

    @property
    def ptr(self) -> int:
        return self.mem.view.data_ptr()

    def restore(self) -> None:
        """Zero again within its bands as filled (another candidate's write undone: see
        Poisoned.restore_guards)."""
        self.mem.restore_guards()
        self.mem.view.zero_()

    def problem(self) -> str | None:
        """Why the buffer breaks the rule now (guard band changed, an element not zero), or None."""
        if not self.mem.guards_intact():
            return f"scratch '{self.name}': wrote outside its bounds (guard band changed)"
        found = first_nonzero(self.mem.view)
        if found is None:
            return None
        n, i, what = found
        return (f"scratch '{self.name}' is not zero after the call: {n} of {self.numel} elements are not zero "
                f"(first at flat index {i}: {what}); a kernel must leave its scratch buffers zero")


def scratch(name: str, shape: tuple[int, ...], dtype: torch.dtype, device: str, share=None) -> Scratch:
    """A zeroed scratch buffer inside guard bands (see Scratch); `share` places it where the
    runtime keeps a candidate's buffers (the CPU kernel host's arena)."""
    mem = poisoned(shape, dtype, device)
    if share is not None:
        mem = mem.moved(share(mem.buf))
    mem.view.zero_()
    return Scratch(name, mem)


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's elements as integers of their own width (bool as uint8): their bit patterns."""
    flat = t.reshape(-1)
    return flat.view(torch.uint8) if flat.dtype == torch.bool else flat.view(_BITS[flat.element_size()])


KEYED_CHUNK = 1 << 23  # elements a pass of `keyed_sum` widens at once (64 MiB of int64)


def keyed_sum(t: torch.Tensor, key: tuple[int, int]) -> int:
    """A hash of a tensor's bits under a secret key (a, b): the sum over its elements of their
    bit patterns times (a * i + b) | 1, wrapping at 64 bits, in chunks on its own device. A plain
    sum keeps its value under a swap of two elements or +d on one and -d on another (session 66's
    review framed a rival so, through a value set); here any such change moves it unless the
    writer knows the key, which never leaves the judge's process."""
    flat = bits(t.reshape(-1))
    a, b = key
    total = 0
    for lo in range(0, flat.numel(), KEYED_CHUNK):
        part = flat[lo:lo + KEYED_CHUNK].to(torch.int64)
        w = (torch.arange(lo, lo + part.numel(), dtype=torch.int64, device=part.device) * a + b) | 1
        total = (total + int((part * w).sum())) & ((1 << 64) - 1)
    return total


def first_nonzero(t: torch.Tensor) -> tuple[int, int, str] | None:
    """(how many elements are not all-zero bits, the first's flat index, its value and bits),
    or None when every element's bits are zero (so -0.0 and NaN count as not zero)."""
    b = bits(t)
    nz = b != 0
    if not bool(nz.any()):
        return None
    i = int(nz.nonzero()[0])
    v = t.reshape(-1)[i].item()
    width = t.element_size() * 2
    return int(nz.sum()), i, f"{v!r} (bits 0x{int(b[i].item()) & ((1 << (4 * width)) - 1):0{width}x})"


def decoys(answer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two plausible wrong answers from the answer for another value set: as it is, and
    reversed (flat) and, for floating outputs, scaled by 17/16, so that an element left
    unwritten in both runs of a round can match the reference in at most one of them."""
    flat = answer.flatten().flip(0).view(answer.shape)
    if answer.dtype.is_floating_point:
        second = flat * (17 / 16)
    elif answer.dtype == torch.bool:
        second = ~flat
    else:
        second = flat + 1
    return answer, second.to(answer.dtype)


# What a check round's outputs hold before its two runs (`prior_kinds`). A user's output from
# torch.empty very often holds zeros (fresh memory), else whatever an unrelated tensor left there
# (another call's answer, other values); verification's never held zeros, so a kernel wrong only
# on an output of zeros was `ok` (session 57's red team). One run of every round finds the kernel's
# own output for another value set, as a timed call does (a mark hidden there must be met in
# verification: session 49); the other, in secret shares, zeros, a decoy or stale values. Each of
# the three but zeros leaves an unwritten element wrong by all but rare chance; zeros leave it
# wrong wherever the answer is not 0, and the own run (or another round's decoy) does the rest.
PRIOR_OTHER = (("zeros", 2), ("decoy", 1), ("stale", 1))


def prior_other() -> str:
    """"zeros", "decoy" or "stale", drawn from `secrets` with PRIOR_OTHER's weights: what an
    output holds before a call that does not find the kernel's own output (the other run of a
    check round, a sub-batch call)."""
    pick = secrets.randbelow(sum(w for _, w in PRIOR_OTHER))
    for other, w in PRIOR_OTHER[:-1]:
        if pick < w:
            return other
        pick -= w
    return PRIOR_OTHER[-1][0]


def prior_kinds(plan: "PriorPlan | None" = None) -> tuple[str, str]:
    """The kinds of content the two runs of one check round find in their outputs, drawn from
    `secrets`: "own" in one run (which one is secret: a kernel counting its calls cannot tell
    which run may find zeros), the other `prior_other`'s, or with `plan` the trial's next."""
    other = plan.next() if plan is not None else prior_other()
    return ("own", other) if secrets.randbelow(2) else (other, "own")


class PriorPlan:
    """What the other run of each of a trial's `n` check rounds finds (prior_kinds): PRIOR_OTHER's
    shares of the rounds, each kind in at least one round where there are as many rounds as kinds,
    in a secret order; past `n` rounds, prior_other's draws. Drawn each round alone, a trial of 10
    rounds gave no run zeros one time in 1000, and a kernel wrong only on an output of zeros `ok`
    (audit of session 59). `rng`: a random.Random, for tests."""

    def __init__(self, n: int, rng=None):
        rng = rng if rng is not None else secrets.SystemRandom()
        total = sum(w for _, w in PRIOR_OTHER)
        counts = [int(n * w // total) for _, w in PRIOR_OTHER]
        if n >= len(PRIOR_OTHER):
            counts = [max(1, c) for c in counts]
        while sum(counts) > n:  # the largest share gives way
            counts[counts.index(max(counts))] -= 1
        rest = n - sum(counts)  # the remainder: drawn by the shares
        kinds = [k for (k, _), c in zip(PRIOR_OTHER, counts) for _ in range(c)]
        kinds += [rng.choices([k for k, _ in PRIOR_OTHER], [w for _, w in PRIOR_OTHER])[0] for _ in range(rest)]
        rng.shuffle(kinds)
        self._kinds = kinds

    def next(self) -> str:
        return self._kinds.pop() if self._kinds else prior_other()


def prior_content(kind: str, decoy: torch.Tensor) -> torch.Tensor:
    """What an output holds before a call of `prior_other`'s `kind`, shaped like `decoy` (a
    plausible wrong answer for it): the decoy itself, zeros or stale values."""
    if kind == "decoy":
        return decoy
    if kind == "zeros":
        return decoy.new_zeros(decoy.shape)
    return stale_values(decoy)


def _tile(out: torch.Tensor, blk: torch.Tensor) -> None:
    """Contiguous 1-D `out` filled with `blk` repeated (no temporary of out's size)."""
    w, n = blk.numel(), out.numel()
    k = n // w
    out[:k * w].view(k, w).copy_(blk.expand(k, w))
    out[k * w:].copy_(blk[:n - k * w])


def stale_values(like: torch.Tensor) -> torch.Tensor:
    """Values an unrelated tensor could have left in an output's memory, shaped like `like`, as
    `guard_values` draws them (normal values at a secret scale, never 0; small integers; True),
    drawn afresh over the whole output on its device from a secret seed. A block tiled over it
    repeated every 65536 elements, which a few loads test and no user's memory does (the review of
    session 57: a kernel 1% off unless its output held zeros, that period or its own mark was `ok`
    in 7 of 20 evals)."""
    g = torch.Generator(device=like.device)
    g.manual_seed(secrets.randbits(62))
    if like.dtype == torch.bool:
        return torch.ones_like(like)
    if like.dtype.is_floating_point:
        scale = 2.0 ** (secrets.randbelow(1 << 20) / (1 << 20) * 16 - 8)
        x = torch.randn(like.shape, generator=g, device=like.device, dtype=torch.float32).mul_(scale).to(like.dtype)
        return torch.where(x == 0, torch.full_like(x, scale), x)
    info = torch.iinfo(like.dtype)
    lo, hi = max(info.min, -1000), min(info.max, 1000)
    small = torch.randint(lo, hi + 1, like.shape, generator=g, device=like.device, dtype=torch.int64)
    return torch.where(small == 0, torch.full_like(small, hi), small).to(like.dtype)


NARROW = (torch.bfloat16, torch.float16)


def reference_dtype(out_dtype: torch.dtype) -> torch.dtype:
    """The dtype a reference is kept and compared in: float32 for a bf16 or fp16 output (its
    rounding, 2^-24, is 2^-16 of the output's own: the budget cannot tell), else float64.
    Half the bytes of every comparison pass over the big bf16 outputs."""
    return torch.float32 if out_dtype in NARROW else torch.float64


class Budget:
    """The error budget of one reference (see the module's docstring): c * |ref| + a per
    element, with c = rtol + ulps * eps and a the absolute floor. Worked out once per
    reference and never materialised on the fast path: `holds` tests a whole output in one
    fused pass on a GPU (a jiterator kernel), where the tensor of bounds would cost a pass
    to write and one more to read for every comparison."""

    def __init__(self, ref: torch.Tensor, atol: float, rtol: float, out_dtype: torch.dtype | None = None,
                 ulps: float = DEFAULT_ULPS, floor: float = DEFAULT_FLOOR):
        self.ref = ref.to(reference_dtype(out_dtype or ref.dtype))
        self.out_dtype = out_dtype or ref.dtype
        self.leans: list = []  # the Lean of every output checked against it (lean_problem)
        p, tiny = FLOAT_INFO.get(self.out_dtype, (52, 2.0 ** -1074))
        # floor inf (a spec's `floor: .inf`): atol is absolute at every size, for an output whose
        # values are absolute quantities (a loss in nats), where one row's tiny value says nothing
        # of the scale its error is measured on
        cap = atol if math.isinf(floor) else min(atol, floor * _mean_abs(self.ref))
        self.a = max(cap, ulps * tiny)
        self.c = rtol + ulps * 2.0 ** -p

    def tensor(self) -> torch.Tensor:
        """The bound of every element."""
        return self.ref.abs().mul_(self.c).add_(self.a)

    def at(self, idx: torch.Tensor) -> torch.Tensor:
        """The bounds at flat positions `idx`."""
        return self.ref.reshape(-1).index_select(0, idx).abs_().mul_(self.c).add_(self.a)

    def row(self, i: int) -> torch.Tensor:
        """The bounds of row `i` (the leading index) of the output."""
        return self.ref[i].abs().mul(self.c).add(self.a)

    def holds(self, out: torch.Tensor) -> bool:
        """|out - ref| <= bound for every element (false for any NaN or Inf in `out`)."""
        fn = _over_budget() if out.is_cuda else None
        if fn is not None and out.dtype.itemsize <= self.ref.dtype.itemsize:
            try:  # NVRTC compiles the kernel at its first call: a failure there means the unfused path
                return not bool(fn(out, self.ref, c=self.c, a=self.a).any())
            except RuntimeError:
                _JIT[0] = None
        err = torch.sub(out, self.ref).abs_()
        return bool(torch.le(err, self.tensor()).all())


# ----------------------------------------------------------------------------- the GEMM budget
# op.tolerance.gemm_k (docs/judge.md, "The GEMM budget"): a bf16 (or fp16, fp32) GEMM whose
# products are exact in fp32 and whose K products are summed in fp32, in any order (split-K
# partial sums, tensor-core blocks), then rounded once to the output dtype.
ACC_ULP = 2.0 ** -23  # one unit in the last place of fp32 at 1: two unit roundoffs (u = 2^-24) per addition,
#                       so directed (round-toward-zero) accumulation as on tensor cores is covered too
COMPARE_SLACK = 2.0 ** -21  # x |ref|: the float32 reference's and the comparison's own roundings (3 x 2^-24)
SILU_EVAL = 2.0 ** -20  # relative error of silu evaluated in fp32 (expf within 2 ulps, one division), 2x margin
SILU_FLOOR = 2.0 ** -120  # absolute: fp32's exp(-g) overflows below g = -88.7, where |silu(g)| < 2^-121
SILU_ARGMIN = -1.2784645427610738  # where silu is least (silu'(x) = 0: 1 + x (1 - sigmoid(x)) = 0)
SILU_MIN = SILU_ARGMIN / (1.0 + 2.718281828459045 ** -SILU_ARGMIN)  # silu there, about -0.2785


def gemm_gamma(k: int) -> float:
    """The relative bound of fp32 accumulation over k products, against sum |x_i w_i|:
    gamma = k * 2^-23 / (1 - k * 2^-23) (Higham's gamma_k with two unit roundoffs an addition)."""
    g = k * ACC_ULP
    return g / (1.0 - g)


class GemmBudget:
    """The error budget of a GEMM with fp32 accumulation over `k` (op.tolerance.gemm_k), from
    the reference's parts (`parts=True`): `out` the float64 answer, `acc` the float64 product
    x @ w^T, `abs` the float64 magnitudes |x| @ |w|^T, `epilogue` None or "swiglu" (out =
    silu(g) * u, g and u the first and second half of acc's columns). Per element:

        |out - ref| <= u_o * |ref| + (1 + u_o) * D + 2^-21 * |ref| + tiny

    u_o the output dtype's unit roundoff (2^-8 for bf16), tiny its smallest subnormal and D
    the error of the fp32 computation before the output's rounding: gamma_k * (|x| @ |w|^T)
    for a GEMM (`gemm_gamma`); for swiglu, g's and u's own budgets (each rounded to the output
    dtype, as torch's unfused path does) carried through silu and the product (docs/judge.md).
    The additive part is kept as a tensor (in the reference dtype); `holds`, `tensor`, `at` and
    `row` are Budget's."""

    def __init__(self, parts: dict, k: int, out_dtype: torch.dtype):
        p, tiny = FLOAT_INFO.get(out_dtype, (52, 2.0 ** -1074))
        uo = 2.0 ** -(p + 1)
        self.out_dtype = out_dtype
        self.leans: list = []
        self.k, self.epilogue = int(k), parts.get("epilogue")
        gamma = gemm_gamma(self.k)
        acc, mag = parts["acc"].to(torch.float64), parts["abs"].to(torch.float64)
        if self.epilogue is None:
            delta = mag.mul_(gamma)
        elif self.epilogue == "swiglu":
            delta = _swiglu_delta(acc, mag, gamma, uo)
        else:
            raise ValueError(f"unknown epilogue {self.epilogue!r} (known: None, 'swiglu')")
        del acc, mag
        rdt = reference_dtype(out_dtype)
        self.ref = parts["out"].detach().to(rdt)
        self.c = uo + COMPARE_SLACK
        self.add = delta.mul_(1.0 + uo).add_(tiny).to(rdt)
        # the aggregate bound (`aggregate`): the error's root mean square over the whole output
        # against 2 u_o of the answer's and the accumulation part's over sqrt(k)
        self.rms_bound = 2.0 * uo * _rms(self.ref) + _rms(self.add) / math.sqrt(max(1, self.k)) + tiny

    def describe(self) -> str:
        return f"the GEMM budget (gemm_k={self.k}{', swiglu' if self.epilogue else ''})"

    def tensor(self) -> torch.Tensor:
        return self.ref.abs().mul_(self.c).add_(self.add)

    def at(self, idx: torch.Tensor) -> torch.Tensor:
        return self.ref.reshape(-1).index_select(0, idx).abs_().mul_(self.c).add_(
            self.add.reshape(-1).index_select(0, idx))

    def row(self, i: int) -> torch.Tensor:
        return self.ref[i].abs().mul(self.c).add(self.add[i])

    def holds(self, out: torch.Tensor) -> bool:
        """|out - ref| <= bound for every element (false for any NaN or Inf in `out`), and the
        aggregate bound."""
        fn = _over_gemm_budget() if out.is_cuda else None
        if fn is not None and out.dtype.itemsize <= self.ref.dtype.itemsize:
            try:
                if bool(fn(out, self.ref, self.add, c=self.c).any()):
                    return False
                return self.aggregate(out) is None
            except RuntimeError:
                _GEMM_JIT[0] = None
        err = torch.sub(out, self.ref).abs_()
        return bool(torch.le(err, self.tensor()).all()) and self.aggregate(out) is None

    def aggregate(self, out: torch.Tensor) -> str | None:
        """Why the output fails the aggregate bound, or None. The per-element bound is the
        worst case of every rounding of a long sum falling the same way: at K = 14336 it
        allows about a fifth of |ref|, room for a kernel that skips a slice of K. The errors of
        an honest kernel are its output's roundings (at most u_o |ref| each, a third of that
        squared on average) and an accumulation error far under the worst case; so over the
        whole output the root mean square of the error stays under 2 u_o of the answer's plus
        the accumulation bound's over sqrt(k), where skipped work leaves errors of the size of
        the terms it dropped (docs/judge.md, "The GEMM budget")."""
        e = _rms(torch.sub(out, self.ref))
        if e <= self.rms_bound:
            return None
        return (f"the error's root mean square {e:.3g} over the whole output is above the aggregate bound "
                f"{self.rms_bound:.3g} of {self.describe()} (2^-7 of the answer's, {_rms(self.ref):.3g}, plus the "
                f"accumulation bound's over sqrt({self.k})): work skipped or done at a lower precision?")


class Lean(NamedTuple):
    """The lean of one output (`lean`): `mean` and its standard error `se` in units of the
    output's rounding, over `n` elements; `off` the share of them that differ from the
    reference rounded to nearest."""
    mean: float
    se: float
    n: int
    off: float


def lean(out: torch.Tensor, ref: torch.Tensor, out_dtype: torch.dtype) -> Lean | None:
    """The error of `out` against the reference rounded to nearest in the output dtype, along the
    reference's sign, in units of the output's spacing there ((out - rn(ref)) sign(ref) /
    ulp(rn(ref)), clipped to +-LEAN_CLIP): its mean, standard error, count and the share of
    elements not equal to rn(ref), over up to LEAN_SAMPLE elements at positions drawn from
    `secrets`. None for an output dtype wider than 16 bits, or no finite element of normal size.

    An output rounded to nearest from an accurate value is rn(ref) itself but where its own
    error crosses a rounding boundary, as often one way as the other: the mean is 0. One rounded
    toward zero is a unit short of rn(ref) wherever ref's dropped part is over a half: mean
    -1/2; and so is one computed from an intermediate cut to the output's width (fp32 to bf16
    by dropping its low bits: one byte permute, no conversion instruction for the compiled-code
    readers to count). Against rn(ref), and not ref, rows of one repeated value (whose outputs
    share one rounding error, a fraction of a unit either way) lean by nothing. The clip bounds
    what elements with heavy cancellation add (many units of a small answer, either way)."""
    got = _against_rn(out_dtype, ref, out)
    if got is None:
        return None
    r, rn, unit, (o,) = got
    n = rn.numel()
    d = o.sub_(rn)
    off = float(torch.count_nonzero(d)) / n
    d = d.mul_(torch.sign(r.to(torch.float64))).div_(unit)
    d = d.clamp_(-LEAN_CLIP, LEAN_CLIP)
    se = float(d.std()) / math.sqrt(n) if n > 1 else float("inf")
    return Lean(float(d.mean()), se, n, off)


def _sampled(ref: torch.Tensor, outs) -> tuple[torch.Tensor, list, torch.Tensor | None] | None:
    """`ref` and each of `outs`, flat, at the same up to LEAN_SAMPLE positions drawn from
    `secrets`, and those positions (None: every element, in order); None where an output is not
    floating or its size differs from the reference's."""
    if not all(o.is_floating_point() for o in outs):
        return None
    r = ref.detach().reshape(-1)
    flat = [o.detach().reshape(-1) for o in outs]
    if any(o.numel() != r.numel() for o in flat):
        return None
    idx = None
    if r.numel() > LEAN_SAMPLE:
        g = torch.Generator().manual_seed(secrets.randbits(63))
        idx = torch.randint(0, r.numel(), (LEAN_SAMPLE,), generator=g).to(r.device)
        r, flat = r.index_select(0, idx), [o.index_select(0, idx) for o in flat]
    return r, flat, idx


def _rn_sampled(out_dtype: torch.dtype, ref: torch.Tensor, outs) -> tuple | None:
    """(ref, rn(ref), each of `outs`), flat, rn(ref) and the outputs in float64, at the same up to
    LEAN_SAMPLE positions drawn from `secrets`; None for an output dtype wider than 16 bits or
    sizes that differ. Taken once a pairing, for its normal and its subnormal strata."""
    if out_dtype not in NORMAL_MIN:
        return None
    got = _sampled(ref, outs)
    if got is None:
        return None
    r, flat, _ = got
    return r, r.to(out_dtype).to(torch.float64), [o.to(torch.float64) for o in flat]


def _against_rn(out_dtype: torch.dtype, ref: torch.Tensor, *outs: torch.Tensor, sampled: tuple | None = None):
    """(ref, rn(ref), the output's spacing at rn(ref), each of `outs`), flat, the outputs and
    rn(ref) in float64, at the same up to LEAN_SAMPLE positions drawn from `secrets` (or those of
    `sampled`, `_rn_sampled`'s), where every output and rn(ref) is finite and rn(ref) of normal
    size: what `lean` and `paired_error` judge. None for an output dtype wider than 16 bits,
    sizes that differ, or no element left."""
    got = sampled if sampled is not None else _rn_sampled(out_dtype, ref, outs)
    if got is None:
        return None
    r, rn, flat = got
    keep = torch.isfinite(rn) & (rn.abs() >= NORMAL_MIN[out_dtype])
    for o in flat:
        keep &= torch.isfinite(o)
    r, rn, flat = r[keep], rn[keep], [o[keep] for o in flat]
    if rn.numel() == 0:
        return None
    return r, rn, _spacing(rn, FLOAT_INFO[out_dtype][0]), flat


def _spacing(v: torch.Tensor, p: int) -> torch.Tensor:
    """The spacing of a float with `p` mantissa bits at each of `v` (float64, normal, nonzero):
    v = m 2^e with 1/2 <= |m| < 1, so 2^(e - 1 - p)."""
    _, e = torch.frexp(v)
    return torch.ldexp(torch.ones_like(v), e - 1 - p)


def leans_too_far(got: Lean | None) -> bool:
    """The verdict on a lean: LEAN_MIN elements or more, its mean beyond LEAN_MAX units and
    beyond LEAN_SIGMAS standard errors."""
    return (got is not None and got.n >= LEAN_MIN and abs(got.mean) > LEAN_MAX
            and abs(got.mean) > LEAN_SIGMAS * got.se)


def lean_text(got: Lean, what: str = "the error") -> str:
    return (f"{what} leans one way: its mean along the reference's sign is {got.mean:+.3f} units of the "
            f"output's rounding (standard error {got.se:.3f}, {got.n} elements, {got.off:.0%} of them off the "
            f"reference rounded to nearest), where rounding to nearest leaves it within +-{LEAN_MAX:g}: the "
            "output or an intermediate cut toward zero, or narrowed?")


def lean_problem(out: torch.Tensor, bound) -> str | None:
    """Why `out` leans one way against `bound`'s reference (a Budget or GemmBudget: `lean`,
    `leans_too_far`), or None. The figure is kept on the budget (`leans`): the worker pools a
    shape's (`pooled_lean`), and the trial's record carries the widest (`widest_lean`)."""
    got = lean(out, bound.ref, bound.out_dtype)
    if got is None:
        return None
    bound.leans.append(got)
    return lean_text(got) if leans_too_far(got) else None


def pooled_lean(leans) -> Lean | None:
    """The leans of many outputs as one sample (each weighted by its elements): outputs too small
    for a verdict of their own (a decode step's one row) still add up to one."""
    leans = list(leans)
    n = sum(x.n for x in leans)
    if not n:
        return None
    mean = sum(x.mean * x.n for x in leans) / n
    se = math.sqrt(sum((x.se * x.n) ** 2 for x in leans if math.isfinite(x.se))) / n
    if any(not math.isfinite(x.se) for x in leans):
        se = max(se, 1.0 / math.sqrt(n))  # a lone element's spread is unknown: a unit's worth
    return Lean(mean, se, n, sum(x.off * x.n for x in leans) / n)


def widest_lean(leans) -> Lean | None:
    """The lean farthest from zero of `leans`."""
    leans = list(leans)
    return max(leans, key=lambda x: abs(x.mean)) if leans else None


# A variant's error against the approved template's build at the same parameters, on the
# same inputs (`paired_error`): the mean over the same elements of |error| in units of the
# output's rounding, the variant's less the approved build's (`less_precise`). An approximation or a precision
# cut done in exact integer instructions (a hand-made exp, bf16 packed by shifts) reads as
# nothing to the compiled-code rules, and may stay inside a budget sized for torch's own
# rounding; it cannot stay as precise as the build it replaces.
# The variant's mean |error| may exceed the approved build's by PRECISION_MARGIN units of the
# output's rounding plus PRECISION_SHARE of the approved build's own, and must exceed it by
# PRECISION_SIGMAS standard errors of the paired difference, over PAIRED_MIN elements or more,
# to count. An output rounded to nearest from fp32 work is rn(ref) but near a rounding
# boundary: about 0.007 units on moe-swiglu-cpu, 0.0001 on softmax-h200; an fp32 rounding more
# or less moves that by some 1e-5, a reordered sum by nothing on average (session 46's honest
# rewrites: 0.0000 to 0.0001), while a degree-4 exp (6e-5 relative, 500 times expf's error)
# adds 0.002, a degree-3 one (8e-4) 0.012, a degree-2 one (9e-3) 0.15.
PRECISION_MARGIN = 0.001
PRECISION_SHARE = 0.1
PRECISION_SIGMAS = 6.0
PAIRED_MIN = 256  # a paired test's spread comes from its own pairs: a shape of one token's rows is enough
# fp32 and fp64 outputs (a loss, the CPU RMSNorm's out): their own rounding no longer hides the
# work's error, and an honest reordering of an fp32 sum moves it by whole units either way, so
# the additive margin above would refuse honest code. Each element's error is taken as
# log2(1 + |out - ref| / spacing), the spacing the output dtype's at |ref|, and three tests run,
# each beyond PRECISION_SIGMAS standard errors:
# - the mean: the variant's may exceed the approved build's by WIDE_MARGIN. Honest rewrites of
#   the shipped specs moved it by -1.2 to +0.02 (rmsnorm-cpu's nine in session 47's red team,
#   cross-entropy-h200's three on the H100); one more rounding after a correctly rounded value,
#   the worst case, by +0.28 on random data. A two-Newton-step rsqrt on every row moved it by +3.6,
#   on 1 row in 8 by +0.4, every output cut to 20 bits by +0.7. A sequential fp32 sum where the
#   approved build sums in a tree is refused too: 5 to 30 times its error at 2^18 terms is less
#   exact, and the approved build is the precision a variant is held to.
# - the tail: the share of elements where the variant is more than TAIL_BITS worse (8 times the
#   error, plus one unit) less the share where it is that much better, at most TAIL_SHARE. A
#   mean lets a large error on a few rows through (elements near zero held to the budget's atol
#   and snapped to a coarse grid: +0.3 on 4% of the elements); equally exact builds are worse and
#   better by 8 times equally often.
# - the reach: the share of elements where the variant's error is more than REACH_BITS above the
#   approved build's own REACH_Q quantile on the same call (twice its 99th percentile, plus a
#   unit), less the approved build's own share there, at most TAIL_SHARE. The tail's net count
#   lets a variant that is more exact than the approved build on some elements (a double sum
#   where it sums in fp32) spend that credit on a coarse error elsewhere (outputs cut to 16 bits
#   on 3 to 6% of them: session 47's second red team); the reach counts no credit, and equally
#   exact builds reach past the approved build's range equally rarely.
WIDE = {torch.float32: (23, 2.0 ** -126), torch.float64: (52, 2.0 ** -1022)}  # (mantissa bits, normal min)
WIDE_MARGIN = 0.3
TAIL_BITS = 3.0
TAIL_SHARE = 0.01
REACH_Q = 0.99
REACH_BITS = 1.0
# The standard errors are taken over rows (an output's last dimension; each element of a 1-D
# output a row of its own), not elements: a row's elements share its scale, its sum, its
# normaliser, so an honest variant's one rounding more there moves a whole row one way (session
# 47: sqrt(1 / v) for 1 / sqrt(v) +0.44 on rmsnorm-cpu's one-row shape, by one draw). The
# reach's is the null's, the approved build's own count over rows, twice, plus a mean row: the
# variant's own spread grows with its error when the error sits in a few whole rows (session
# 48's second red team: 16-bit outputs on 8 rows a call passed as 5.7 standard errors). Fewer rows
# than WIDE_MIN_ROWS (both runs of a round counted): no verdict from those pairs alone; the
# worker pools such shapes in a stratum of their own (`wide_only`), so that an approximation
# confined to few-row shapes is not diluted among the large ones (session 47's second red team).
WIDE_MIN_ROWS = 32


class Paired(NamedTuple):
    """Sums over elements paired by position (`paired_error`): their count, the variant's
    |error| and the approved build's (units of the output's rounding, clipped to +-LEAN_CLIP),
    and the squares of their difference; then the same over the elements where both are within
    a unit (`near`: where neither build is grossly off); then over the elements of wide outputs
    (`wide`), in log2(1 + units), with sums over their rows for the standard errors."""
    n: int
    mine: float
    theirs: float
    sq: float
    n_near: int = 0
    mine_near: float = 0.0
    theirs_near: float = 0.0
    sq_near: float = 0.0
    n_wide: int = 0  # fp32 and fp64 outputs: log2(1 + |error| / spacing) (WIDE_MARGIN)
    mine_wide: float = 0.0
    theirs_wide: float = 0.0
    worse_wide: int = 0  # elements where the variant's is more than TAIL_BITS above the approved build's
    better_wide: int = 0  # ... and below it
    # over rows (WIDE_MIN_ROWS), for the standard errors: their count; the sums over rows of D^2,
    # D n and n^2 (D a row's sum of the paired differences, n its elements) and of W^2 (W its
    # elements worse less better)
    rows_wide: int = 0
    dd_wide: float = 0.0
    dn_wide: float = 0.0
    nn_wide: float = 0.0
    ww_wide: float = 0.0
    # the reach (REACH_Q, REACH_BITS): elements of the variant and of the approved build past the
    # approved build's range, and the sum over rows of the approved build's own count there, squared
    reach_wide: int = 0
    reach_theirs_wide: int = 0
    oo_wide: float = 0.0
    # a 16-bit output's elements whose reference rounds below the normal range (`_subnormal_pairs`):
    # as the first four, in units of the smallest subnormal
    n_sub: int = 0
    mine_sub: float = 0.0
    theirs_sub: float = 0.0
    sq_sub: float = 0.0

    def __add__(self, o: "Paired") -> "Paired":  # type: ignore[override]
        return Paired(*(a + b for a, b in zip(self, o)))


NO_PAIRS = Paired(0, 0.0, 0.0, 0.0)


def paired_error(out: torch.Tensor, approved: torch.Tensor, ref: torch.Tensor, out_dtype: torch.dtype,
                 subnormal: bool = False) -> Paired:
    """`out` (a variant's) and `approved` (the approved build's, on the same inputs) against
    the reference rounded to nearest, element by element at the same up to LEAN_SAMPLE positions
    drawn from `secrets`: |out - rn(ref)| and |approved - rn(ref)| in units of the output's
    spacing at rn(ref), clipped to LEAN_CLIP (the units `lean` takes). Elements where either
    output or the reference is not finite are left out, and those where the reference is below
    the dtype's normal range. An fp32 or fp64 output is paired in its own terms (`wide_error`),
    there with its subnormal references too where `subnormal` (the spec forbids fast_math, which
    forbids flushing them: their unit is the smallest subnormal. Left out, a variant put fp32
    subnormal outputs on a grid of 2^-9 of the call's mean, inside the budget's floor, and was
    `ok`: session 49's red team, b03)."""
    if out_dtype in WIDE:
        return wide_error(out, approved, ref, out_dtype, subnormal)
    # (the narrow pairs keep to normal references: subnormal ones, where both builds are mostly
    # exact, diluted the mean and let a degree-4 exp on moe-swiglu-cpu pass 2 times in 12; with
    # `subnormal` they are a stratum of their own, `_subnormal_pairs`)
    sampled = _rn_sampled(out_dtype, ref, (out, approved))
    if sampled is None:
        return NO_PAIRS
    below = _subnormal_pairs(sampled, out_dtype) if subnormal else NO_PAIRS
    got = _against_rn(out_dtype, ref, sampled=sampled)
    if got is None:
        return below
    r, rn, unit, (o, a) = got
    n = rn.numel()
    dm, da = _units(r, rn, unit, NORMAL_MIN[out_dtype], o, a)
    near = (dm <= 1) & (da <= 1)
    nm, na = dm[near], da[near]
    return below + Paired(n, float(dm.sum()), float(da.sum()), float((dm - da).square_().sum()),
                          int(nm.numel()), float(nm.sum()), float(na.sum()), float((nm - na).square_().sum()))


def _subnormal_pairs(sampled: tuple, out_dtype: torch.dtype) -> Paired:
    """The `sub` stratum of a 16-bit output's pairs (`sampled`: `_rn_sampled`'s, the variant's
    and the approved build's outputs): the elements whose reference rounds to a nonzero value
    below the normal range, |error| against rn(ref) in units of the smallest subnormal (the
    spacing there), clipped to LEAN_CLIP, ties of the float32 reference either way. A stratum of
    its own, so that these elements, mostly exact in both builds, do not dilute the normal ones'
    mean. Left out, a bf16 kernel that wrote subnormal results as 0 was `ok` on rmsnorm-h200,
    where x times a witness element of w lands below the normal range beside outputs of normal
    size, and the budget's floor (2^-7 of the call's mean output) covers them whole (session
    50's H100 call)."""
    r, rn, (o, a) = sampled
    keep = (rn != 0) & (rn.abs() < NORMAL_MIN[out_dtype]) & torch.isfinite(o) & torch.isfinite(a)
    r, rn, o, a = r[keep], rn[keep], o[keep], a[keep]
    if rn.numel() == 0:
        return NO_PAIRS
    unit = FLOAT_INFO[out_dtype][1]  # the spacing is one below the normal range
    dm, da = _units(r, rn, torch.full_like(rn, unit), NORMAL_MIN[out_dtype], o, a)
    # only where the approved build is within a unit: where it is grossly off (moe-swiglu-cpu's
    # silu writes 0 where exp(-g) overflows, 2 units, clipped) a variant exact there had credit
    # to spend on cuts elsewhere (session 50's red team, c08 and c09 `ok` 2 times in 5 and in 3)
    ok = da <= 1  # (elsewhere the budget alone judges the variant, as before the stratum)
    dm, da = dm[ok], da[ok]
    return NO_PAIRS._replace(n_sub=int(dm.numel()), mine_sub=float(dm.sum()), theirs_sub=float(da.sum()),
                             sq_sub=float((dm - da).square_().sum()))


def _ties(r: torch.Tensor, rn: torch.Tensor, unit: torch.Tensor,
          normal_min: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the reference (`r`, as the judge keeps it: float32 for a 16-bit output) lies exactly
    halfway between rn(r) and the output's next value on its other side, and that value. There
    either neighbour is the reference rounded to nearest: r has no bits left to tell which one
    the exact answer is nearer. Only references of few significant bits sit on a tie (one in
    2^16 of random float32 values for a bf16 output), such as the products of rows near the
    bottom of the normal range: there a build whose fp32 scale was one unit off the approved
    build's went to the other side of 0.7% of a row's outputs and was refused as less precise
    (session 49's H100 call, datasets/judge-redteam/s49-h200/ties.py)."""
    d = r.to(torch.float64) - rn
    # below a power of two the spacing is half the spacing at it, but at the normal minimum,
    # below which the subnormals keep its spacing (session 50's red team: the tie just below
    # 2^-126 in bf16 was not excused)
    pow2 = (torch.frexp(rn)[0].abs() == 0.5) & (rn.abs() > normal_min)
    step = torch.where(pow2 & (d.sign() != rn.sign()), unit / 2, unit)
    return (d != 0) & (d.abs() * 2 == step), rn + d.sign() * step


def _tie_error(o: torch.Tensor, rn: torch.Tensor, other: torch.Tensor, tie: torch.Tensor) -> torch.Tensor:
    """|o - rn|, or at a tie the distance to the nearer of rn and `other` (`_ties`)."""
    e = (o - rn).abs()
    return torch.where(tie, torch.minimum(e, (o - other).abs()), e)


def _units(r: torch.Tensor, rn: torch.Tensor, unit: torch.Tensor, normal_min: float,
           *outs: torch.Tensor) -> list[torch.Tensor]:
    """Each of `outs`' |error| against rn(r) in `unit`s, ties either way (`_ties`), clipped to
    LEAN_CLIP: the paired strata's measure."""
    tie, other = _ties(r, rn, unit, normal_min)
    return [_tie_error(o, rn, other, tie).div_(unit).clamp_(max=LEAN_CLIP) for o in outs]


def wide_error(out: torch.Tensor, approved: torch.Tensor, ref: torch.Tensor, out_dtype: torch.dtype,
               subnormal: bool = False) -> Paired:
    """`paired_error` of an fp32 or fp64 output: log2(1 + |out - ref| / spacing) and the same of
    `approved`, the spacing the output dtype's at |ref| (the reference is float64 here, so
    rounding it to the output would be an error of its own), at the same secret positions,
    where both outputs and the reference are finite and |ref| is of normal size in the output
    dtype (any size with `subnormal`: below the normal range the spacing is the smallest
    subnormal); summed into the `wide` fields."""
    got = _sampled(ref, (out, approved))
    if got is None:
        return NO_PAIRS
    p, tiny = WIDE[out_dtype]
    r, (o, a), idx = got
    pos = torch.arange(r.numel(), device=r.device) if idx is None else idx
    row = pos // ref.shape[-1] if ref.dim() >= 2 else pos
    r, o, a = r.to(torch.float64), o.to(torch.float64), a.to(torch.float64)
    keep = torch.isfinite(r) & torch.isfinite(o) & torch.isfinite(a)
    if not subnormal:
        keep &= r.abs() >= tiny
    r, o, a, row = r[keep], o[keep], a[keep], row[keep]
    if r.numel() == 0:
        return NO_PAIRS
    unit = _spacing(r.abs().clamp(min=tiny), p)
    dm = (o - r).abs_().div_(unit).log1p_().div_(math.log(2.0))
    da = (a - r).abs_().div_(unit).log1p_().div_(math.log(2.0))
    d = dm - da
    worse, better = d > TAIL_BITS, d < -TAIL_BITS
    uniq, g = torch.unique(row, return_inverse=True)
    rows = uniq.numel()
    n_g = torch.zeros(rows, dtype=torch.float64, device=d.device).index_add_(0, g, torch.ones_like(d))
    d_g = torch.zeros_like(n_g).index_add_(0, g, d)
    w_g = torch.zeros_like(n_g).index_add_(0, g, worse.double() - better.double())
    # the approved build's range on this call (one shape: rows of one length, errors of one scale)
    k = min(da.numel(), max(1, math.ceil(REACH_Q * da.numel())))
    top = float(torch.kthvalue(da.cpu(), k).values) + REACH_BITS  # (as run on the H200)
    far_m, far_a = dm > top, da > top
    o_g = torch.zeros_like(n_g).index_add_(0, g, far_a.double())  # the approved build's own, by row
    return NO_PAIRS._replace(n_wide=int(r.numel()), mine_wide=float(dm.sum()), theirs_wide=float(da.sum()),
                             worse_wide=int(worse.sum()), better_wide=int(better.sum()), rows_wide=rows,
                             dd_wide=float(d_g.square().sum()), dn_wide=float((d_g * n_g).sum()),
                             nn_wide=float(n_g.square().sum()), ww_wide=float(w_g.square().sum()),
                             reach_wide=int(far_m.sum()), reach_theirs_wide=int(far_a.sum()),
                             oo_wide=float(o_g.square().sum()))


def less_precise(got: Paired) -> str | None:
    """The verdict on a variant's paired error: why it is less precise than the approved
    build, or None. Less precise: its mean |error| above the approved build's by more than
    PRECISION_MARGIN units plus PRECISION_SHARE of the approved build's, and by more than
    PRECISION_SIGMAS standard errors of the paired difference, over PAIRED_MIN elements or
    more; over all paired elements, or over those where both builds are within a unit. The
    second takes away the credit of the approved build's gross failures (an overflow to 0 where
    the reference is normal, clipped at 2 units): a variant that fixes them may not spend what
    it gains there on an approximation everywhere else (session 46's second red team). The
    pairs of fp32 and fp64 outputs (`wide_error`) are judged apart (`_wide_less_precise`): the
    mean in log2(1 + units) against WIDE_MARGIN, the tail and the reach against TAIL_SHARE, over rows."""
    for n, mine, theirs, sq, what in ((got.n, got.mine, got.theirs, got.sq, ""),
                                      (got.n_near, got.mine_near, got.theirs_near, got.sq_near,
                                       " where both are within a unit of it"),
                                      (got.n_sub, got.mine_sub, got.theirs_sub, got.sq_sub,
                                       " where the reference rounds below the normal range")):
        if n < PAIRED_MIN:
            continue
        diff = (mine - theirs) / n
        var = max(sq / n - diff * diff, 0.0)
        se = math.sqrt(var / n)
        if diff <= PRECISION_MARGIN + PRECISION_SHARE * theirs / n or diff <= PRECISION_SIGMAS * se:
            continue
        return _less_precise_text(what, (
            f"its mean error is {mine / n:.4f} units of the output's rounding against the approved build's "
            f"{theirs / n:.4f} (difference {diff:+.4f}, standard error {se:.4f}, over {n} elements paired by "
            f"position)"))
    return _wide_less_precise(got)


def _only(got: Paired, suffix: str) -> Paired:
    """The fields of `got` whose names end with `suffix`, the rest zero."""
    return NO_PAIRS._replace(**{f: getattr(got, f) for f in Paired._fields if f.endswith(suffix)})


def wide_only(got: Paired) -> Paired:
    """The fp32/fp64 part of `got` (`wide_error`'s fields), the rest zero."""
    return _only(got, "_wide")


def few_rows(got: Paired) -> bool:
    """Whether `got` holds fp32/fp64 pairs from fewer rows than a verdict needs (WIDE_MIN_ROWS)."""
    return 0 < got.rows_wide < WIDE_MIN_ROWS


def thin(got: Paired) -> Paired:
    """The part of one shape's pairs too thin for a verdict of its own, which the worker pools
    over such shapes apart from the large ones: fp32/fp64 pairs from fewer than WIDE_MIN_ROWS
    rows (`wide_only`), and a 16-bit output's subnormal stratum of fewer than PAIRED_MIN pairs
    (session 50's red team: every subnormal output cut toward zero at moe-cpu's T = 1 alone,
    a few hundred pairs, was diluted among the large shapes'). NO_PAIRS where neither."""
    out = wide_only(got) if few_rows(got) else NO_PAIRS
    return out + _only(got, "_sub") if 0 < got.n_sub < PAIRED_MIN else out


def _wide_less_precise(got: Paired) -> str | None:
    """`less_precise` of the fp32 and fp64 pairs: the mean, the tail and the reach (WIDE_MARGIN,
    TAIL_SHARE, REACH_Q), each beyond PRECISION_SIGMAS standard errors taken over rows (WIDE_MIN_ROWS)."""
    n, g = got.n_wide, got.rows_wide
    if n < PAIRED_MIN or g < WIDE_MIN_ROWS:
        return None
    diff = (got.mine_wide - got.theirs_wide) / n
    # a ratio's variance over clusters: sum over rows of (D - diff n)^2, over n^2, times g / (g - 1)
    var = max(got.dd_wide - 2 * diff * got.dn_wide + diff * diff * got.nn_wide, 0.0) * g / (g - 1) / (n * n)
    se = math.sqrt(var)
    if diff > WIDE_MARGIN and diff > PRECISION_SIGMAS * se:
        return _less_precise_text("", (
            f"its fp32/fp64 outputs' mean log2(1 + |error| in units of their own rounding at the reference) is "
            f"{got.mine_wide / n:.3f} against the approved build's {got.theirs_wide / n:.3f} (difference "
            f"{diff:+.3f}, standard error {se:.3f} over {g} rows, {n} elements paired by position; allowed "
            f"{WIDE_MARGIN:g})"))
    tests = ((got.worse_wide, got.better_wide, got.ww_wide,
              f"more than {2 ** TAIL_BITS:g} times the approved build's (log2(1 + |error| in units of their rounding) "
              f"{TAIL_BITS:g} or more above it), and on {{other}} that much below"),
             # the reach's spread is the null's (above)
             (got.reach_wide, got.reach_theirs_wide, 2 * got.oo_wide + (n / g) ** 2,
              f"more than {2 ** REACH_BITS:g} times the approved build's {REACH_Q:.0%} quantile on the same call "
              f"(log2(1 + |error| in units of their rounding) {REACH_BITS:g} or more above it), where the "
              f"approved build's own share is {{other}}"))
    for up, down, sq, what in tests:  # a share of elements, less another, over rows
        if up - down > TAIL_SHARE * n and up - down > PRECISION_SIGMAS * math.sqrt(sq):
            return _less_precise_text("", (
                f"on {up / n:.2%} of its fp32/fp64 outputs' elements its error is "
                f"{what.format(other=f'{down / n:.2%}')} "
                f"(over {n} elements of {g} rows paired by position; the difference may be {TAIL_SHARE:.0%})"))
    return None


def _less_precise_text(what: str, measure: str) -> str:
    return (f"less precise than the approved template's build at the same parameters, on the same inputs"
            f"{what}: {measure}; a variant may change how the work is done, not how exactly (an "
            f"approximation or a narrowed intermediate, in any instructions)")


def _rms(t: torch.Tensor) -> float:
    if t.numel() == 0:
        return 0.0
    t = t.to(torch.float64) if t.dtype != torch.float64 else t
    return math.sqrt(float(torch.linalg.vector_norm(t)) ** 2 / t.numel())


def _silu_spread(g: torch.Tensor, dg: torch.Tensor) -> torch.Tensor:
    """max |silu(t) - silu(g)| over |t - g| <= dg, exactly (float64): silu falls on
    (-inf, SILU_ARGMIN] and rises after, so its extremes on an interval lie at the ends, or at
    SILU_ARGMIN where the interval holds it."""
    s = F.silu(g)
    d = torch.maximum(F.silu(g - dg).sub_(s).abs_(), F.silu(g + dg).sub_(s).abs_())
    inside = (g - dg <= SILU_ARGMIN) & (g + dg >= SILU_ARGMIN)
    return torch.where(inside, torch.maximum(d, s.sub(SILU_MIN).abs_()), d)


def _swiglu_delta(acc: torch.Tensor, mag: torch.Tensor, gamma: float, uo: float) -> torch.Tensor:
    """The error of silu(g) * u before the output's rounding (float64), g and u the halves of
    acc's columns: each with its fp32 accumulation (gamma x its magnitudes) and its rounding to
    the output dtype; silu(g) with the spread of silu over g's error interval, its fp32
    evaluation and its rounding; then the product: |s' u' - s u| <= |u| ds + (|s| + ds) du."""
    h = acc.shape[-1] // 2
    g, u = acc[..., :h], acc[..., h:]
    dg = mag[..., :h] * gamma
    dg.add_(g.abs().add_(dg).mul_(uo))  # g rounded to the output dtype (torch's unfused path)
    du = mag[..., h:] * gamma
    du.add_(u.abs().add_(du).mul_(uo))
    ds = _silu_spread(g, dg)
    del dg
    sa = F.silu(g).abs_()
    # silu's own evaluation in fp32 and its rounding to the output dtype (torch's unfused path)
    ds.add_(sa.add(ds).mul_(max(uo, SILU_EVAL)).add_(SILU_FLOOR))
    return u.abs().mul_(ds).add_(sa.add_(ds).mul_(du))


_GEMM_JIT: list = []


def _over_gemm_budget():
    """As `_over_budget`, with a per-element additive bound: 1 where |o - r| > c * |r| + a."""
    if not _GEMM_JIT:
        try:
            from torch.cuda.jiterator import _create_jit_fn

            _GEMM_JIT.append(_create_jit_fn(
                "template <typename T> T over_gemm_budget(T o, T r, T a, T c) {"
                " T e = o - r; e = e < T(0) ? -e : e; T m = r < T(0) ? -r : r;"
                " return (e <= c * m + a) ? T(0) : T(1); }", c=0.0))
        except Exception:  # noqa: BLE001 - an older torch, or no NVRTC: the unfused path
            _GEMM_JIT.append(None)
    return _GEMM_JIT[0]


def _mean_abs(r: torch.Tensor) -> float:
    """mean |r| over the finite elements' count as zero where not finite: one reduction pass
    when every element is finite (the usual case), the masked way otherwise."""
    if not r.numel():
        return 0.0
    s = float(torch.linalg.vector_norm(r, 1))
    if s == s and s != float("inf"):
        return s / r.numel()
    return float(r.abs().nan_to_num(0.0, 0.0, 0.0).mean())


_JIT: list = []


def _over_budget():
    """A fused elementwise kernel (jiterator, compiled once by NVRTC): 1 where |o - r| >
    c * |r| + a or either is NaN, else 0, in the promoted dtype of o and r. None where the
    jiterator is unavailable (the unfused path is used then)."""
    if not _JIT:
        try:
            from torch.cuda.jiterator import _create_jit_fn

            _JIT.append(_create_jit_fn(
                "template <typename T> T over_budget(T o, T r, T c, T a) {"
                " T e = o - r; e = e < T(0) ? -e : e; T m = r < T(0) ? -r : r;"
                " return (e <= c * m + a) ? T(0) : T(1); }", c=0.0, a=0.0))
        except Exception:  # noqa: BLE001 - an older torch, or no NVRTC: the unfused path
            _JIT.append(None)
    return _JIT[0]


def tolerance_bound(ref: torch.Tensor, atol: float, rtol: float, out_dtype: torch.dtype | None = None,
                    ulps: float = DEFAULT_ULPS, floor: float = DEFAULT_FLOOR) -> torch.Tensor:
    """The per-element error budget as a tensor, in the reference dtype of the output
    (`reference_dtype`); `out_dtype` is the output's dtype (the reference's when not given)."""
    return Budget(ref, atol, rtol, out_dtype, ulps, floor).tensor()


def compare(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float,
            bound: "torch.Tensor | Budget | None" = None, prior: torch.Tensor | None = None,
            want_max: bool = False) -> tuple[bool, str, float]:
    """(passed, reason, max abs error: on a pass only when `want_max`, else 0). Every element
    is checked; NaN and Inf never pass.

    The fast path is one fused test, |out - ref| <= bound, which is false for NaN
    and for any Inf (`Budget.holds` when `bound` is a Budget); the details are worked out
    only when it fails. `prior`, what the buffer held before the call, only sharpens the
    message.
    """
    if out.shape != ref.shape:
        return False, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}", float("inf")
    if not out.dtype.is_floating_point:
        bad = out.to(torch.int64) != ref.to(torch.int64)
        n = int(bad.sum())
        if n:
            i = int(bad.flatten().nonzero()[0])
            return False, f"{n} of {out.numel()} elements differ (first at flat index {i}: " \
                          f"{out.flatten()[i].item()} vs {ref.flatten()[i].item()})", float("inf")
        return True, "", 0.0
    what = f"atol={atol:g} rtol={rtol:g}"
    gemm = bound if isinstance(bound, GemmBudget) else None
    budget = bound if isinstance(bound, (Budget, GemmBudget)) else None
    if budget is not None:
        if not want_max and bound.holds(out):
            why = lean_problem(out, budget)
            return why is None, why or "", 0.0
        what = bound.describe() if gemm is not None else what
        bound = bound.tensor()
    if bound is None:
        bound = tolerance_bound(ref, atol, rtol, out.dtype)
    if ref.dtype in (torch.float64, torch.float32) and out.dtype.itemsize <= ref.dtype.itemsize:
        err = torch.sub(out, ref).abs_()  # promoted to the reference's dtype in the one pass
    else:
        err = (out.to(torch.float64) - ref.to(torch.float64)).abs_()
    if bool(torch.le(err, bound).all()):
        why = (gemm.aggregate(out) if gemm is not None else None) or (lean_problem(out, budget) if budget else None)
        if why:
            return False, why, float(err.max()) if err.numel() else 0.0
        return True, "", (float(err.max()) if err.numel() else 0.0) if want_max else 0.0
    o = out.to(torch.float64)
    finite = torch.isfinite(o)
    if not bool(finite.all()):
        n = int((~finite).sum())
        i = int((~finite).flatten().nonzero()[0])
        return False, f"{n} of {o.numel()} elements are NaN or Inf (first at flat index {i}: " \
                      f"{o.flatten()[i].item()}; never written?)", float("inf")
    bad = ~torch.le(err, bound)
    max_err = float(err.max())
    n = int(bad.sum())
    i = int(bad.flatten().nonzero()[0])
    r = ref.flatten()[i].item()
    b = bound.flatten()[i].item()
    stale = ""
    if prior is not None and prior.shape == out.shape:
        same = int((out.flatten()[bad.flatten()] == prior.flatten()[bad.flatten()]).sum())
        if same:
            stale = f"; {same} of them still hold what the buffer held before the call (never written?)"
    return False, f"{n} of {o.numel()} elements outside {what} " \
                  f"(first at flat index {i}: {o.flatten()[i].item():.6g} vs reference " \
                  f"{r:.6g}, allowed error {b:.3g}); max abs error {max_err:.3g}{stale}", max_err


class Snapshot:
    """A copy of an output taken right after a call, checked against a reference computed
    later. The checksum held on the host (the sum of the element bit patterns, and the bit
    patterns at SAMPLE positions drawn from `secrets` whose device copy is zeroed after use)
    shows that nothing rewrote the copy before the check: altering it unseen means keeping
    the sum and missing every secret position."""

    def __init__(self, out: torch.Tensor):
        self.data = out.detach().clone()
        self.sum, self.idx, self.sample = self._sum(), None, None
        n = self.data.numel()
        if n:
            g = torch.Generator().manual_seed(secrets.randbits(63))
            self.idx = torch.randint(0, n, (min(SAMPLE, n),), generator=g)
            self.sample = self._gather(self.idx)

    def _bits(self) -> torch.Tensor:
        flat = self.data.flatten()
        return flat.view(torch.uint8) if flat.dtype == torch.bool else flat.view(_BITS[flat.element_size()])

    def _sum(self) -> int:
        """The sum of the copy's bits as 64-bit words (wrapping), or of its elements' bit
        patterns where the bytes do not fill whole words: one pass, no widening."""
        flat = self.data.flatten()
        if flat.numel() * flat.element_size() % 8 == 0 and flat.numel():
            return int(flat.view(torch.int64).sum())
        return int(self._bits().sum(dtype=torch.int64))

    def _gather(self, idx: torch.Tensor) -> torch.Tensor:
        d = idx.to(self.data.device)
        s = self._bits()[d].cpu()
        if d is not idx:
            d.zero_()  # the positions leave no trace on the device
        return s

    def to_host(self) -> "Snapshot":
        """The copy moved to the judge's own memory (a GPU's is in every kernel's reach: a
        candidate spoiled a rival's there, and the rival failed "tampering", session 66's review);
        its checksum and samples stand."""
        if self.data.device.type != "cpu":
            self.data = self.data.cpu()
        return self

    def intact(self) -> bool:
        if self._sum() != self.sum:
            return False
        return self.idx is None or torch.equal(self._gather(self.idx), self.sample)
