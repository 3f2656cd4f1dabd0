"""The rooms of runner/ stack in one order and imports only point down it.

Every module's imports (at the top and inside functions alike) are read with ast and
checked against LAYERS (docs/architecture.md draws the same stack)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "runner"

# bottom to top: a module may import its own room and the rooms below it
LAYERS = [
    ("core", ("runner", "runner.core")),  # errors, log, expr, figures, records, userpath
    ("search", ("runner.search",)),  # space, agents and their registry, the search core, replay
    ("build", ("runner.build",)),  # render, forbid, ptx, backends, builder
    ("ledger", ("runner.ledger",)),  # ledger, run folder, provenance, summary
    ("judge", ("runner.judge",)),  # inputs, verify, timing, sandbox, worker, evaluator, reuse
    ("spec", ("runner.spec",)),  # yamlsrc, schema, hw, the spec checker, measure (pipe hw)
    ("ship", ("runner.ship",)),  # compare, dispatch, export, report, rundata
    ("scale", ("runner.scale",)),  # slots (judge workers on cores, GPUs, Ray actors), the pool
    ("top", ("runner.loop", "runner.progress", "runner.cli", "runner.__main__")),
]
# modules that import nothing of runner, so any room may use them: the launch runtime that
# exported packages carry as their own file, and the reference ops specs name
STANDALONE = ("runner.ship.exported_runtime", "runner.ops")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, name: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every runner import in the file."""
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "runner"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != "runner":
                continue
            known = modules()
            for a in node.names:  # `from . import x` imports the module x where there is one
                sub = f"{base}.{a.name}"
                out.append((node.lineno, sub if sub in known else base))
    return out


def _matches(mod: str, prefix: str) -> bool:
    return mod == prefix or (prefix != "runner" and mod.startswith(prefix + "."))


def standalone(mod: str) -> bool:
    return any(_matches(mod, s) for s in STANDALONE)


def layer(mod: str) -> int:
    best, at = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if _matches(mod, p) and len(p) > best:
                best, at = len(p), i
    if at is None:
        raise AssertionError(f"{mod} is in no layer: add it to LAYERS in tests/test_layers.py")
    return at


def test_every_module_has_a_place():
    for mod in modules():
        assert standalone(mod) or layer(mod) is not None


def test_imports_point_down_the_stack():
    bad = []
    for mod, path in modules().items():
        for line, target in imports(path, mod):
            if standalone(mod):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {mod} stands alone but imports {target}")
                continue
            if standalone(target):
                continue
            if layer(target) > layer(mod):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {mod} ({LAYERS[layer(mod)][0]}) imports "
                           f"{target} ({LAYERS[layer(target)][0]}), a room above it")
    assert not bad, "\n".join(bad)


def test_cli_only_parses_and_dispatches():
    """cli.py reads arguments, calls one room's function per command and prints: it imports
    few modules."""
    path = PACKAGE / "cli.py"
    targets = {t for _, t in imports(path, "runner.cli")}
    assert len(targets) <= 14, sorted(targets)  # 14 with spec.measure, `pipe hw`'s room function


def test_the_architecture_page_names_every_room():
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    for room, prefixes in LAYERS:
        for p in prefixes:
            if p != "runner" and p.count(".") == 1 and (PACKAGE / p.split(".")[1]).is_dir():
                assert f"{p.split('.')[1]}/" in text, f"docs/architecture.md does not show {p}"
