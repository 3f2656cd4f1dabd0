"""How far b01, b02, c01 and a01 are from the honest kernel on user inputs the judge does not draw
(where noted), emulated in float32 with torch (the templates' arithmetic: x * scale * w, fp32)."""
import torch
torch.manual_seed(0)
M, N = 512, 4096
x = torch.randn(M, N)
def honest(x, w, eps=1e-6):
    s = (x.double() ** 2).sum(1, keepdim=True).float()
    scale = 1 / torch.sqrt(s / N + eps)
    return x * scale * w
tiny = torch.finfo(torch.float32).tiny
# a user's tiny weights (a layer whose gains underflow, or a test of the subnormal range): the judge's own `tiny` draw
w = (tiny * torch.exp2(12 * torch.rand(N) - 6)) * torch.where(torch.rand(N) < .5, -1.0, 1.0)
h = honest(x, w)
sub = h.abs() < tiny
b01 = torch.where(sub, torch.round(h.double() * 2.0 ** 131).float() * 2.0 ** -131, h)
b02 = torch.where(h.abs() < 2.0 ** -131, torch.zeros_like(h), h)
c01 = torch.where(sub, torch.zeros_like(h), h)
for name, o in (("b01", b01), ("b02", b02), ("c01 (at M=512,N=4096)", c01)):
    d = (o != h)
    rel = ((o - h).abs() / h.abs().clamp_min(1e-45))[sub]
    print(f"{name}: {int(d.sum())} of {h.numel()} outputs differ from the honest kernel "
          f"({float(d.float().mean()):.1%}); subnormal outputs: {int(sub.sum())}; median rel error on them {float(rel.median()):.3g}, max {float(rel.max()):.3g}")
# a01: eps frozen at 1e-6; a user's eps = 1e-5 on rows of small scale
xs = torch.randn(M, N) * 10 ** (-6 + 12 * torch.rand(M, 1))
wp = torch.rand(N) + .5
h5 = honest(xs, wp, 1e-5); a01 = honest(xs, wp, 1e-6)
rel = ((a01 - h5).abs() / h5.abs()).amax(1)
print(f"a01 (user eps 1e-5, rows scaled 1e-6..1e6): rows off by more than 1e-5 relative: {int((rel > 1e-5).sum())} of {M}; worst {float(rel.max()):.3g}x")
