"""The builder's memo of the source rules: a build ahead checks a guess's sources and the
trial reads the verdict, the same verdict, forbidden ones included."""

from runner.build import forbid
from runner.build.builder import Builder

from .conftest import ROOT, shipped_spec


def test_source_rules_run_once_a_source_and_keep_their_verdict(monkeypatch):
    spec = shipped_spec(ROOT / "pipelines" / "softmax-h200.yaml")
    b = Builder(spec)
    calls = []
    real = forbid.check_source

    def counting(src, *a):
        calls.append(src)
        return real(src, *a)

    monkeypatch.setattr(forbid, "check_source", counting)
    sources = list(dict.fromkeys(b.render_all(dict(spec.start))))
    assert all(b.source_rules(s) is None for s in sources)
    assert all(b.source_rules(s) is None for s in sources)
    assert len(calls) == len(sources)
    bad = sources[0].replace("exp2f(", "__expf(", 1)  # fast math by name
    first = b.source_rules(bad)
    assert first is not None and first.rule == "fast_math"
    assert b.source_rules(bad) == first and len(calls) == len(sources) + 1
    assert b.build([bad], [{}]).status == "forbidden"
