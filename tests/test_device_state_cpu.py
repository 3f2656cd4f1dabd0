"""State kept between calls on the CPU backend (the judge's `device_state` rule): a variant
whose library holds writable static data (a global, a static local, a class static) that the
approved template's build does not is refused at build time, whatever the spec names; the
approved template's own statics are the user's and stay allowed. The CUDA side of the rule is
in test_forbid_compiled.py (module-scope `.global` data in the PTX)."""
from __future__ import annotations

import shutil

import pytest

from runner.build.builder import Builder
from runner.spec.spec import load_spec

from .conftest import PIPELINES, ROOT

ENTRY_LINE = "extern \"C\" void rmsnorm_cpu("
BODY_LINE = "  rows(x, w, out, 0, M, N, eps);\n"


def _project(tmp_path, template: str | None = None):
    """rmsnorm-cpu.yaml in a folder of its own, with its template (or `template` in its place)."""
    (tmp_path / "pipelines").mkdir(parents=True)
    (tmp_path / "kernel_templates").mkdir()
    shutil.copy(PIPELINES / "rmsnorm-cpu.yaml", tmp_path / "pipelines" / "rmsnorm-cpu.yaml")
    text = template or (ROOT / "kernel_templates" / "rmsnorm.cpp.j2").read_text()
    (tmp_path / "kernel_templates" / "rmsnorm.cpp.j2").write_text(text)
    spec = load_spec(tmp_path / "pipelines" / "rmsnorm-cpu.yaml")
    return Builder(spec), spec, text


def _build(b: Builder, spec, text: str | None):
    cfg = {**dict(spec.start), "THREADS": 1}
    vid = None
    if text is not None:
        vid = f"v{len(b.variants)}"
        b.variants[vid] = text
    return b.build(b.render_all(cfg, vid), b.geometry(cfg), b.approved_sources(cfg, vid))


@pytest.mark.parametrize("decl, use, name", [
    ("static int calls;", "  ++calls;\n", "calls"),                      # a call counter
    ("float memo[64];", "  memo[M % 64] = x[0];\n", "memo"),               # last call's inputs
    ("", "  static float last = 0; last += x[0];\n", "last"),            # a static local
])
def test_a_cpu_variant_with_static_state_is_refused(tmp_path, decl, use, name):
    b, spec, approved = _project(tmp_path)
    assert approved.count(ENTRY_LINE) == 1 and approved.count(BODY_LINE) == 1
    assert _build(b, spec, None).status == "ok"
    text = approved.replace(ENTRY_LINE, decl + "\n" + ENTRY_LINE).replace(BODY_LINE, use + BODY_LINE)
    got = _build(b, spec, text)
    assert got.status == "forbidden", (got.status, got.reason)
    assert got.reason.startswith("device_state") and name in got.reason, got.reason
    # an honest variant (the same code, another spelling) still builds
    assert _build(b, spec, approved.replace("s += acc[j];", "s = s + acc[j];")).status == "ok"


def test_the_approved_templates_own_statics_stay_allowed(tmp_path):
    b0, _, approved = _project(tmp_path / "a")
    mine = approved.replace(ENTRY_LINE, "static long launches;\n" + ENTRY_LINE).replace(
        BODY_LINE, "  ++launches;\n" + BODY_LINE)
    b, spec, _ = _project(tmp_path / "b", mine)
    got = _build(b, spec, None)
    assert got.status == "ok" and any("launches" in k for k in got.ptx["data"]), (got.status, got.reason, got.ptx)
    assert _build(b, spec, mine.replace("s += acc[j];", "s = s + acc[j];")).status == "ok"
