"""Where a spec's own pieces are found: its kernel template and its Python modules.

A user keeps the spec, the template and the reference module in one folder of
their own, anywhere, and runs `pipe run their/folder/spec.yaml` from any working
folder. So:

- `kernel.template` is looked up in the spec's folder first, then in each folder
  above it (how the checked-in specs find `kernel_templates/`), then in the
  working folder, then in pipe's own project folder; when none has it, the error
  lists every path tried.
- `op.reference` and `op.triton` (`module:function`) import from the spec's folder
  without PYTHONPATH. A module found there is loaded from there by its file (so two
  specs in two folders may each have a `ref.py`), and the folder is appended, not
  prepended, to `sys.path` (so the module's own imports of its neighbours work, and
  nothing in the folder can stand in for a module of the judge: torch, numpy, pipe's
  `runner`). A module of the spec's folder whose name is also taken by an installed
  module, or by `runner` or `torch`, is refused with the clash named.

The runner and the spawned worker both go through `load_callable`.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import sys
from pathlib import Path

from .errors import PipeError

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
RESERVED = ("runner", "torch")  # the judge's own top-level packages: never a user's module name


_FROM_FOLDER: dict[str, Path] = {}  # top-level module name -> the spec folder it was loaded from
_ADDED: set[str] = set()  # spec folders this process appended to sys.path


class ModuleLookupError(PipeError):
    """A spec's `module:function` cannot be imported or has no such function."""


# -- templates -----------------------------------------------------------------
def template_candidates(rel: str, spec_dir: Path) -> list[Path]:
    """Every path tried for a template, in order (the first that is a file wins)."""
    p = Path(rel)
    if p.is_absolute():
        return [p]
    spec_dir = Path(spec_dir).resolve()
    out: list[Path] = []
    for d in [spec_dir, *spec_dir.parents, Path.cwd().resolve(), PACKAGE_ROOT]:
        c = d / p
        if c not in out:
            out.append(c)
    return out


def find_template(rel: str, spec_dir: Path) -> tuple[Path | None, list[Path]]:
    tried = template_candidates(rel, spec_dir)
    return next((c for c in tried if c.is_file()), None), tried


# -- modules -------------------------------------------------------------------
def _under(path: str | None, folder: Path) -> bool:
    if not path:
        return False
    try:
        Path(path).resolve().relative_to(folder)
        return True
    except ValueError:
        return False


def add_folder(folder: Path) -> None:
    """Append (never prepend) a spec's folder to sys.path."""
    s = str(folder)
    if s not in sys.path:
        sys.path.append(s)
        _ADDED.add(s)


def _local_spec(top: str, folder: Path | None):
    if folder is None or not folder.is_dir():
        return None
    return importlib.machinery.PathFinder.find_spec(top, [str(folder)])


def _forget(top: str) -> None:
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        del sys.modules[name]
    _FROM_FOLDER.pop(top, None)


def load_module(mod: str, folder: str | Path | None):
    """Import `mod`, taking its top-level module from the spec's folder when it is there."""
    folder = Path(folder).resolve() if folder else None
    top = mod.split(".")[0]
    importlib.invalidate_caches()  # the user may have just written the file
    local = _local_spec(top, folder)
    if local is not None:
        if top in RESERVED:
            raise ModuleLookupError(
                f"module '{top}' in the spec's folder {folder} has the name of one the judge itself imports "
                f"({', '.join(RESERVED)}); rename it")
        # installed modules and the user's own path; not this or another spec's folder
        elsewhere = [p for p in sys.path if p not in _ADDED and Path(p or ".").resolve() != folder]
        other = importlib.machinery.PathFinder.find_spec(top, elsewhere)
        if top in sys.builtin_module_names or (other is not None and not _under(other.origin, folder)):
            where = "a built-in module" if other is None else (other.origin or "a namespace package")
            raise ModuleLookupError(
                f"module '{top}' of the spec's folder {folder} has the name of another module ({where}); "
                "rename yours so that neither stands in for the other")
        add_folder(folder)
        cur = sys.modules.get(top)
        if cur is None or not _under(getattr(cur, "__file__", None), folder):
            _forget(top)  # the same name loaded from another spec's folder
            m = importlib.util.module_from_spec(local)
            sys.modules[top] = m
            try:
                local.loader.exec_module(m)
            except BaseException:
                sys.modules.pop(top, None)
                raise
            _FROM_FOLDER[top] = folder
        return importlib.import_module(mod)
    if top in _FROM_FOLDER:  # loaded for another spec from its folder: not this spec's module
        _forget(top)
    try:
        return importlib.import_module(mod)
    except ModuleNotFoundError as e:
        if e.name and (mod == e.name or mod.startswith(e.name + ".")):
            searched = ([str(folder)] if folder is not None else []) + \
                       [p or "." for p in sys.path if Path(p or ".").resolve() != folder]
            raise ModuleLookupError(
                f"no module named '{mod}': looked for {top}.py (or a package {top}/) in the spec's folder and "
                f"on sys.path: {', '.join(searched)}. Put it beside the spec, or add its folder to "
                "PYTHONPATH") from None
        raise


def load_callable(ref: str, folder: str | Path | None):
    """The function named by `module:function`; ModuleLookupError (or the module's own import
    error, wrapped) when it cannot be had."""
    mod, _, fn = ref.partition(":")
    try:
        m = load_module(mod, folder)
    except ModuleLookupError:
        raise
    except Exception as e:  # an error in the user's module is reported, not a traceback
        raise ModuleLookupError(f"cannot import module '{mod}': {type(e).__name__}: {e}") from None
    f = getattr(m, fn, None)
    if not callable(f):
        raise ModuleLookupError(f"module '{mod}' ({getattr(m, '__file__', '?')}) has no function '{fn}'")
    return f


def reference_source(ref: str, folder: str | Path | None) -> str:
    """What the spec hash takes of the reference: the function's source and, for a module of the
    spec's own folder, that module's whole source (a helper it calls changes verdicts too)."""
    mod, _, fn = ref.partition(":")
    try:
        f = load_callable(ref, folder)
        src = inspect.getsource(f)
    except (OSError, TypeError, PipeError):
        return ref
    folder_p = Path(folder).resolve() if folder else None
    m = sys.modules.get(mod)
    path = getattr(m, "__file__", None)
    if folder_p is not None and _under(path, folder_p):
        try:
            return src + "\n# module " + Path(path).name + "\n" + Path(path).read_text(encoding="utf-8")
        except OSError:
            pass
    return src
