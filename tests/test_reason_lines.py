"""A trial refused for its source names the line where the user can fix it: a compile error or
a source rule's finding names a line of the rendered source, and the reason adds the template's
line where one line alone can have rendered it; where the shapes render apart, the shape whose
source failed (with `pipe render`'s --shape for it)."""

import json
import os

from .conftest import PIPELINES, ROOT, pipe_main

PARAMS = '{"ACC": 4, "THREADS": 1, "UNROLL": 1}'


def project(tmp_path, edit) -> tuple:
    """The CPU example in a folder of its own, its template changed by `edit` (lines -> lines):
    (the folder, the template's lines)."""
    proj = tmp_path / "proj"
    (proj / "pipelines").mkdir(parents=True)
    (proj / "kernel_templates").mkdir()
    os.symlink(ROOT / "hw_profiles", proj / "hw_profiles")
    lines = edit((ROOT / "kernel_templates" / "rmsnorm.cpp.j2").read_text().splitlines(keepends=True))
    (proj / "kernel_templates" / "rmsnorm.cpp.j2").write_text("".join(lines))
    (proj / "pipelines" / "r.yaml").write_text((PIPELINES / "rmsnorm-cpu.yaml").read_text())
    return proj, lines


def evaluate(proj) -> dict:
    r = pipe_main("eval", "pipelines/r.yaml", "--params", PARAMS, "--run-dir", "run", "--json", cwd=proj)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    return json.loads(r.stdout)


def last_brace(lines) -> int:
    return max(i for i, ln in enumerate(lines) if ln.strip() == "}")


def test_a_forbidden_pattern_names_the_template_line(tmp_path):
    def edit(lines):
        at = last_brace(lines)
        return lines[:at] + ["  #pragma omp parallel for\n"] + lines[at:]

    proj, lines = project(tmp_path, edit)
    v = evaluate(proj)
    at = next(i for i, ln in enumerate(lines, 1) if "omp parallel" in ln)
    assert v["status"] == "forbidden" and f"[template kernel_templates/rmsnorm.cpp.j2:{at}]" in v["reason"], v


def test_a_compile_error_of_one_shape_names_that_shape_and_the_template_line(tmp_path):
    def edit(lines):
        at = last_brace(lines)
        return lines[:at] + ["{% if M == 7 %}\n", "  only_when_seven;\n", "{% endif %}\n"] + lines[at:]

    proj, lines = project(tmp_path, edit)
    v = evaluate(proj)
    at = next(i for i, ln in enumerate(lines, 1) if "only_when_seven" in ln)
    assert v["status"] == "compile_error", v
    assert v["reason"].startswith("at {'M': 7, 'N': 33} (pipe render --shape extra:2): kernel.cpp:"), v["reason"]
    assert v["reason"].endswith(f"[template kernel_templates/rmsnorm.cpp.j2:{at}]"), v["reason"]
