"""The documentation's references resolve: relative Markdown links (and their #anchors),
backticked repository paths, and the sections they name ("`docs/x.md`, "Some section""),
in README.md, docs/ and datasets/README.md. The notebook is left out: it quotes paths
as they were when each session ran."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "datasets" / "README.md"]
TOP = ("runner", "docs", "datasets", "pipelines", "tools", "benchmarks", "tests", "examples",
       "kernel_templates", "hw_profiles", "notebook", ".ci")

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"(?<![\w./~-])((?:%s)/[\w./*-]*)" % "|".join(re.escape(t) for t in TOP))
# a backticked Markdown page followed by the name of one of its sections
SECTION = re.compile(r"`([\w./-]+\.md)`\)?,? \(?\"([^\"]+)\"")
PLACEHOLDER = re.compile(r"[<{]|\b(?:NAME|RUN|SPEC|FILE|DIR|OUT|PATH|MxN)\b")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def headings(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [ln.lstrip("#").strip() for ln in text.splitlines() if re.match(r"#{1,6} ", ln)]


def exists(rel: str) -> bool:
    rel = rel.split("::")[0].rstrip(".,:;)")
    if "*" in rel:
        return any(ROOT.glob(rel))
    return (ROOT / rel).exists()


def problems(page: Path) -> list[str]:
    out = []
    text = page.read_text()
    prose = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    for m in LINK.finditer(prose):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue  # http:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"link to {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in {slug(h) for h in headings(dest)}:
            out.append(f"link to {target}: no such section")
    for block in (*CODE.findall(prose), *re.findall(r"```.*?```", text, flags=re.S)):
        for m in PATH.finditer(block):
            rel = m.group(1)
            if PLACEHOLDER.search(block[m.start():m.end() + 1]) or rel.endswith("/") and len(rel) < 3:
                continue
            if not exists(rel):
                out.append(f"`{rel}`: no such path")
    for m in SECTION.finditer(prose):
        rel, name = m.groups()
        dest = ROOT / rel
        if dest.exists() and not any(name.lower() in h.lower() for h in headings(dest)):
            out.append(f'`{rel}`, "{name}": no such section')
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_references_resolve(page):
    assert problems(page) == []


def test_the_checker_finds_what_dangles(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text('# Top\n\nSee [a](missing.md), [b](#top), [c](#nowhere), `runner/no_such.py`, '
                    '`pipelines/rmsnorm-cpu.yaml`, `pipelines/NAME.yaml` and `README.md` ("Nothing like it").\n'
                    "```sh\npipe replay datasets/nowhere/x.json\n```\n")
    found = problems(page)
    assert found == ["link to missing.md: no such file", "link to #nowhere: no such section",
                     "`runner/no_such.py`: no such path", "`datasets/nowhere/x.json`: no such path",
                     '`README.md`, "Nothing like it": no such section'], found
