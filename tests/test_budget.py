"""The error budget's fast test (`Budget.holds`: one fused pass on a GPU, no tensor of
bounds) agrees with the element-wise bound it stands for, at the edge of the budget, and
for NaN and Inf."""

import pytest
import torch

from runner.judge import verify

DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


def _case(device, out_dtype, n=1 << 16, seed=0):
    g = torch.Generator().manual_seed(seed)
    ref = (torch.randn(n, generator=g, dtype=torch.float64) * 3).to(device)
    budget = verify.Budget(ref, 1e-3, 1.6e-2, out_dtype)
    return ref, budget


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_holds_matches_the_bound_elementwise(device, out_dtype):
    ref, budget = _case(device, out_dtype)
    bound = budget.tensor()
    assert bound.dtype == verify.reference_dtype(out_dtype)
    honest = ref.to(out_dtype)
    assert budget.holds(honest)
    # one element pushed past its bound (twice the bound away from the reference) fails,
    # the same element moved to half its bound passes
    i = 12345
    r = budget.ref[i].item()
    for frac, want in ((2.0, False), (0.25, True)):
        out = honest.clone()
        out[i] = r + frac * bound[i].item()
        exact = bool(((out.to(bound.dtype) - budget.ref).abs() <= bound).all())
        assert exact == want and budget.holds(out) == want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_inf_never_pass(device, bad):
    ref, budget = _case(device, torch.bfloat16)
    out = ref.to(torch.bfloat16)
    out[77] = bad
    assert not budget.holds(out)
    ok, why, _ = verify.compare(out, budget.ref, 1e-3, 1.6e-2, budget)
    assert not ok and "NaN or Inf" in why


@pytest.mark.parametrize("device", DEVICES)
def test_compare_with_a_budget_names_the_first_bad_element(device):
    ref, budget = _case(device, torch.bfloat16)
    out = ref.to(torch.bfloat16)
    out[4000:4010] = out[4000:4010] * 2 + 1
    ok, why, _ = verify.compare(out, budget.ref, 1e-3, 1.6e-2, budget)
    assert not ok and "first at flat index 4000" in why


def test_typical_magnitude_ignores_non_finite_references():
    ref = torch.tensor([1.0, 3.0, float("inf"), float("nan")], dtype=torch.float64)
    b = verify.Budget(ref, 1.0, 0.0, torch.float32, floor=1.0)
    # mean |ref| with the non-finite elements counted as zero: (1 + 3) / 4
    assert b.a == pytest.approx(1.0)
    b = verify.Budget(ref[:2], 10.0, 0.0, torch.float32, floor=1.0)
    assert b.a == pytest.approx(2.0)


def test_an_infinite_floor_keeps_atol_at_every_size():
    """`floor: .inf` (a loss in nats): atol stands whatever the output's magnitude; the default
    floor caps it at 2^-7 of the output's mean magnitude, so one tiny value gets a tiny atol."""
    ref = torch.tensor([1e-12], dtype=torch.float64)
    assert verify.Budget(ref, 1e-5, 2e-4, torch.float32).a < 1e-13
    assert verify.Budget(ref, 1e-5, 2e-4, torch.float32, floor=float("inf")).a == 1e-5
    zero = torch.zeros(4, dtype=torch.float64)  # a mean magnitude of 0 (inf x 0 would be NaN)
    assert verify.Budget(zero, 1e-5, 2e-4, torch.float32, floor=float("inf")).a == 1e-5
    assert verify.compare(torch.tensor([0.0]), ref.float(), 1e-5, 2e-4,
                          bound=verify.Budget(ref, 1e-5, 2e-4, torch.float32, floor=float("inf")))[0]
