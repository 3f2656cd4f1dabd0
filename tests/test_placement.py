"""Verification's buffers at secret offsets of 16 bytes (judge/verify.place_shift, placed, and
poisoned's shift). The exported op serves any 16-byte aligned tensor, so a kernel must be right
wherever such a tensor starts; session 55's red team had a kernel 1% off whenever a pointer was
off a 512-byte boundary judged `ok`, since every verified buffer started on one."""

from __future__ import annotations

import json
import random

import torch
import yaml

from runner.judge.verify import GUARD, LINE, PLACE_SPAN, Placement, place_shift, placed, poisoned

from .conftest import PIPELINES, pipe_main


def test_shifts_are_16_byte_steps_below_the_span():
    rng = random.Random(5)
    for size in (1, 2, 4, 8, 16):
        shifts = [place_shift(size, rng) for _ in range(4000)]
        assert all(s * size % 16 == 0 and 16 <= s * size < PLACE_SPAN for s in shifts)
        # off 512 bytes in most draws, and off 4096 in every one: a tell on either is seen
        assert sum(s * size % 512 != 0 for s in shifts) / len(shifts) > 0.9
        assert len(set(shifts)) > 200
        for cls in range(LINE // 16):  # a class of the 64-byte line
            got = [place_shift(size, rng, cls) * size for _ in range(400)]
            assert all(b % LINE == 16 * cls and 16 <= b < PLACE_SPAN and b % 512 for b in got), (size, cls)
            assert len(set(got)) > 40
            # class 0 of a buffer placed before (off 512 bytes then): in a secret half on 512 bytes off
            # a page, where a user's CPU tensor is one time in nine and the CPU arena's pointers never
            # are (review of session 59: class 0 never on 512 bytes, a kernel wrong only there was `ok`)
            got = [place_shift(size, rng, cls, block=True) * size for _ in range(400)]
            on = [b for b in got if b % 512 == 0]
            assert all(b % LINE == 16 * cls and 16 <= b < PLACE_SPAN for b in got), (size, cls)
            if cls == 0:
                assert 120 < len(on) < 280 and set(on) == set(range(512, PLACE_SPAN, 512))
            else:
                assert not on
    assert place_shift(3, rng) == 0  # no whole number of elements in 16 bytes: left where it is
    # the judge's own draws (no rng) are secret and of the same kind
    own = {place_shift(2) for _ in range(400)}
    assert len(own) > 100 and all(s * 2 % 16 == 0 and 16 <= s * 2 < PLACE_SPAN for s in own)


def test_a_trial_places_half_its_verified_shapes_and_every_buffer_meets_an_offset_off_a_line():
    """Session 58's CI: each verified-only shape drawn placed or not on its own left a trial of 6
    such shapes with none placed off a 64-byte line 6% of the time, and a kernel wrong only there
    `ok`. A trial now splits its shapes half and half, and a buffer's offsets step through the
    line's four 16-byte classes."""
    rng = random.Random(7)
    sides = {True: 0, False: 0}
    firsts = set()
    blocks = 0
    for trial in range(3000):
        n = trial % 7
        p = Placement(n, rng)
        kinds = [p.placed(i) for i in range(n)]
        assert not p.placed(n) and not p.placed(-1)
        assert sum(kinds) in (n // 2, (n + 1) // 2), kinds  # both kinds in every trial of 2 or more
        if n == 1:
            sides[kinds[0]] += 1
        if n == 6:
            firsts.add(tuple(kinds))
        classes = {key: [p.shift(4, key) * 4 % LINE // 16 for _ in range(4)] for key in ("x", "w")}
        for got in classes.values():
            assert sorted(got) == [0, 1, 2, 3] and sum(c != 0 for c in got[:2]) >= 1, got
            assert all((b - a) % 4 == 1 for a, b in zip(got, got[1:]))
        # a buffer's first placement off 512 bytes (every allocator's pointer is on them); a later
        # one of class 0 on them, off a page, in a secret half
        q = Placement(2, rng)
        offs = [q.shift(4, "x") * 4 for _ in range(8)]
        assert offs[0] % 512, offs
        blocks += sum(b % 512 == 0 for b in offs)
    assert 2000 < blocks < 4000  # 3000 trials, 8 placements: 2 of class 0 (one of them the first, maybe)
    assert min(sides.values()) > 150  # an odd shape's side is a coin
    assert len(firsts) == 20  # every choice of 3 in 6 shapes occurs: which ones is secret
    assert Placement(4).shift(3, "x") == 0
    own = Placement(8)  # the judge's own (secret) draw keeps the split
    assert sum(own.placed(i) for i in range(8)) == 4


def test_a_placed_copy_holds_the_values_at_its_offset():
    t = torch.randn(7, 33, dtype=torch.bfloat16)
    got = placed(t, 24)
    assert torch.equal(got, t) and got.is_contiguous() and got.shape == t.shape
    assert got.storage_offset() == 24 and got.untyped_storage().nbytes() == (t.numel() + 24) * 2
    assert placed(t, 0) is t
    shared = []

    def share(x):  # the runtime's copy where candidates' buffers live (the CPU host's arena)
        y = x.clone()
        shared.append(y)
        return y

    got = placed(t, 8, share)
    assert torch.equal(got, t) and got.data_ptr() == shared[0].data_ptr() + 16
    # the pad before it holds elements of t itself (session 56: zeros there told the judge's
    # placed copies from a user's x[1:]), never what the judge's memory held there before
    junk = torch.full((10_000,), 7.0, dtype=torch.bfloat16)
    del junk
    for pad in (shared[0][:8], placed(t, 64)._base[:64]):
        assert bool(torch.isin(pad, t.reshape(-1)).all()) and not bool((pad == 7.0).any())


def test_a_shifted_output_keeps_its_guards_on_both_sides():
    for shift in (0, 8, 2040):
        p = poisoned((5, 9), torch.bfloat16, "cpu", shift)
        f = p.front
        assert f == p.lead + GUARD + shift and p.view.data_ptr() - p.buf.data_ptr() == 2 * f
        assert p.lead == 0 if shift else p.view.data_ptr() % 512 == 0
        p.fill(1.0)
        assert p.guards_intact()
        p.buf[f - 1] = 0  # the element right before the output: a write out of bounds
        assert not p.guards_intact()
        q = poisoned((5, 9), torch.bfloat16, "cpu", shift)
        q.buf[q.front + 45] = 0  # right after it
        assert not q.guards_intact()
        moved = q.moved(q.buf.clone())
        assert moved.front == q.front and moved.view.data_ptr() - moved.buf.data_ptr() == 2 * q.front
        assert not moved.guards_intact()


def test_an_unplaced_output_starts_where_a_users_would():
    """A user's output (torch.empty) starts on 512 bytes, a large one often on a 2 MiB boundary (the
    start of an allocator segment); every judged output once sat GUARD elements into its
    allocation, never on a 2 MiB boundary (session 56's red team: a kernel could tell the judge's
    calls by that). A large one takes either, a secret draw each (20 draws: both, but for 2^-19)."""
    for shape, dtype, big in [((512, 1024), torch.float32, True), ((1 << 20,), torch.bfloat16, True),
                              ((7, 33), torch.float32, False), ((1,), torch.float64, False)]:
        on_2m = set()
        for _ in range(20 if big else 3):
            p = poisoned(shape, dtype, "cpu")
            assert p.view.data_ptr() % 512 == 0, (shape, dtype)
            on_2m.add(p.view.data_ptr() % (2 << 20) == 0)
            assert p.front - p.lead == GUARD  # the front band is GUARD elements, and the room checked too
            p.fill(2.0)
            assert p.guards_intact()
            p.buf[p.front + p.numel + GUARD - 1] = 0  # the back band's last element
            assert not p.guards_intact()
        assert on_2m == ({True, False} if big else on_2m), (shape, on_2m)
    # a placed one sits at its shift past the band, not at the user's alignment
    p = poisoned((512, 1024), torch.float32, "cpu", 4)
    assert p.lead == 0 and p.view.data_ptr() % 512 == (p.buf.data_ptr() + 4 * (GUARD + 4)) % 512


def test_a_kernel_wrong_off_a_512_byte_boundary_is_wrong(project, tmp_path):
    """The red team's kernel, on the range spec (its domain's drawn shapes are verified, not timed:
    their buffers take the secret offsets); the template itself stays `ok`."""
    honest = (PIPELINES.parent / "kernel_templates" / "rmsnorm.cpp.j2").read_text()
    old = "#pragma GCC unroll {{ UNROLL }}\n    for (int64_t k = 0; k < N; ++k) orow[k] = xr[k] * scale * w[k];"
    assert honest.count(old) == 1
    tell = honest.replace(old, "    const {{ ctype }} s2 = ((((uintptr_t)x) | ((uintptr_t)out) | ((uintptr_t)w)) & 511)"
                               " ? scale * {{ ctype }}(1.01) : scale;\n#pragma GCC unroll {{ UNROLL }}\n"
                               "    for (int64_t k = 0; k < N; ++k) orow[k] = xr[k] * s2 * w[k];")
    # a shape verified only is placed in half the draws: 12 more of them (19 in all), so that none
    # placed is a chance of 2^-19
    d = yaml.safe_load((PIPELINES / "rmsnorm-range-cpu.yaml").read_text())
    d["op"]["extra_shapes"] += [{"M": 2 + i, "N": 96 + 40 * i} for i in range(12)]
    spec = project / "pipelines" / "placed.yaml"
    spec.write_text(yaml.safe_dump(d, sort_keys=False))
    for name, text, want in (("tell", tell, "wrong"), ("honest", honest, "ok")):
        (project / f"{name}.cpp.j2").write_text(text)
        r = pipe_main("eval", spec, "--params", json.dumps({"ACC": 32, "UNROLL": 1}), "--variant",
                      project / f"{name}.cpp.j2", "--run-dir", tmp_path / name, "--json", cwd=project)
        assert json.loads(r.stdout)["status"] == want, (r.stdout + r.stderr)[-2000:]


def test_a_write_in_the_room_of_an_unplaced_output_is_seen():
    """Review of session 56: the room that puts an unplaced output at a user's alignment lay inside
    the judge's buffer, unchecked, at an offset a kernel can work out from its own pointer."""
    import torch

    from runner.judge.verify import GUARD, poisoned

    for numel, dt in ((1000, torch.float32), (1 << 19, torch.bfloat16)):
        p = poisoned((numel,), dt, "cpu")
        assert p.guards_intact()
        end = p.front + p.numel + GUARD
        if end < p.buf.numel():
            p.buf[end] = 123.0
            assert not p.guards_intact()
