"""Build a configuration: render the template for every shape, derive its launch
geometry, check the forbidden actions on the source, compile the distinct sources,
check the compiled code and key the binaries.

`Builder` is all that compare, export, the tools and the judge's trial path need to
turn parameters into binaries; it judges nothing about what the kernels do (that is
`judge.evaluator.Evaluator`'s).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import ExprError
from . import backends, forbid, render

# the variant id under which an earlier run's template is rendered (judge.reuse): no variant
# of the approved template, so its builds are judged against nothing
OLD_TEMPLATE = "\0reuse: the earlier run's template"


@dataclass
class Build:
    status: str  # ok, forbidden, compile_error (or the backend's), pruned
    reason: str = ""
    artifacts: list | None = None  # per source, when ok
    resources: dict | None = None  # source -> compiler report, once everything compiled
    compile_s: float = 0.0
    log: str = ""
    ptx: dict | None = None  # the classified PTX instructions of every shape's build (ptx.merge)
    ptx_approved: dict | None = None  # those of the approved template's build, for a variant
    source: str | None = None  # the rendered source that failed to compile or broke a source rule


def geometry_key(geometry: list[dict]) -> str:
    return json.dumps(geometry, sort_keys=True)


def sources_hash(sources: list[str]) -> str:
    """The rendered source of every shape, in shape order (two shapes that swap which code
    they run give another hash, where Trial.source_hash, over the distinct sources, does not)."""
    return render.source_hash("\0".join(sources))


def _refusal(action: str, why: str, shape: int, other: str, base_ok: bool) -> str:
    """A compiled-code reader's refusal of shape `shape`'s build: the action, what it means (its
    forbidden action's description, else `other`), why, and whether the approved build existed."""
    what = forbid.NAMED[action].description if action in forbid.NAMED else other
    return (f"{action}: {what}: shape {shape}: {why}"
            + ("" if base_ok else " (the approved template does not compile at these parameters)"))


def _whole(e, what: str, env: dict, shape: dict, params: dict) -> int:
    """A launch dimension's value: a whole number ('/' gives a float, which is never cut)."""
    v = e(env)
    if isinstance(v, float) and not v.is_integer():
        raise ExprError(f"kernel.{what} '{e.text}' is {v:g} at {shape} with {params}: a launch "
                        "dimension must be a whole number; use ceil_div(a, b) or a // b")
    return int(v)


def arg_kinds(spec, symbol_type: str) -> list[str]:
    """What each of kernel.args passes: a tensor map by value (tmap), a pointer to a tensor or
    scratch buffer (ptr), a scalar of its type, else a shape symbol (`symbol_type`, the backend
    runtime's: auto on CUDA, sized from the kernel's parameter)."""
    tensors = {t.name for t in (*spec.op.inputs, *spec.op.outputs)} | {s.name for s in spec.kernel.scratch}
    maps = {m.name for m in spec.kernel.tensor_maps}
    scalars = {s.name: s.type for s in spec.op.scalars}
    return ["tmap" if a in maps else "ptr" if a in tensors else scalars.get(a, symbol_type) for a in spec.kernel.args]


class Builder:
    """Renders, derives the geometry, compiles and keys binaries for one spec; `variants`
    holds the template variants by id."""

    def __init__(self, spec):
        self.spec = spec
        self.backend = backends.get(spec.kernel.backend)
        self.ctype = render.CTYPES[spec.kernel.backend][spec.op.dtype]
        self.variants: dict[str, str] = {}  # variant id -> template text
        self._digests: dict[str, str] = {}  # artifact path -> content digest
        self._params: dict[str, str | None] = {}  # artifact path -> _params_problem's answer
        # the source rules' verdict per rendered source (sha256 of the text): a build ahead
        # checks a guess's sources, and its trial, when it comes, reads the verdict here (the
        # rules take about 8 ms a softmax source, most of a trial's own time beside the judge)
        self._rules: dict[str, object] = {}
        self._rules_lock = threading.Lock()

    def template(self, variant: str | None) -> tuple[str, str]:
        """(text, name) of the spec's template or of a variant."""
        if variant is None:
            return self.spec.kernel.template, Path(self.spec.kernel.template_path).name
        return self.variants[variant], f"variant-{variant}"

    def render_all(self, params: dict, variant: str | None = None, shapes=None) -> list[str]:
        """The source for every shape (the spec's timed and extra shapes unless `shapes` is given)."""
        text, name = self.template(variant)
        if variant is not None:
            inc = render.FILE_TAG.search(text)
            if inc:
                line = text.count("\n", 0, inc.start()) + 1
                raise render.RenderError(f"{name}:{line}: a variant cannot read files ('{{% {inc.group(1)}'): the "
                                         "template an agent is shown has its includes in place already; write the "
                                         "text itself")
            try:
                used = render.template_variables(text)
            except Exception as e:  # jinja2.TemplateSyntaxError and friends
                line = getattr(e, "lineno", None)
                hint = render.syntax_hint(text, line) if line else None
                raise render.RenderError(f"{name}: does not parse: {e}" + (f"; {hint}" if hint else "")) from None
            extra = sorted(used - set(params) - set(self.spec.op.symbols) - set(render.DTYPE_VARS)
                           - {n for n, _ in self.spec.kernel.derive})
            if extra:
                raise render.RenderError(f"{name}: uses {', '.join(extra)}, which are no search parameters, "
                                         "shape symbols or dtype variables")
        ctx = {**params, "dtype": self.spec.op.dtype, "ctype": self.ctype}
        k = self.spec.kernel
        segments = k.template_segments if variant is None else None  # errors name file:line of an include
        return [render.render(text, {**ctx, **shape, **k.derived({**shape, **params})}, name, segments)
                for shape in (self.spec.op.all_shapes if shapes is None else shapes)]

    def geometry(self, params: dict, shapes=None) -> list[dict]:
        """Per shape, the launch: grid, block, dynamic shared memory, cluster where the spec has
        one, with kernel.scratch each buffer's shape (`scratch`: name -> dims) and with
        kernel.tensor_maps each map's box (`tensor_maps`: name -> box), all worked out from the
        parameters, the shape and the derived values."""
        k = self.spec.kernel
        out = []
        for shape in (self.spec.op.all_shapes if shapes is None else shapes):
            env = {**shape, **params}
            env.update(k.derived(env))
            at = (env, shape, params)
            geo = {"grid": [_whole(e, "grid", *at) for e in k.grid],
                   "block": [_whole(e, "block", *at) for e in k.block],
                   "shared_mem": _whole(k.shared_mem, "shared_mem", *at) if k.shared_mem else 0}
            if k.cluster:
                geo["cluster"] = [_whole(e, "cluster", *at) for e in k.cluster]
            if k.scratch:  # the runner's workspaces: part of the launch (and of the binary key)
                geo["scratch"] = k.scratch_shapes(env)
            if k.tensor_maps:  # each TMA descriptor's box: part of the launch too
                geo["tensor_maps"] = k.tensor_map_boxes(env)
            out.append(geo)
        return out

    def binary_key(self, artifacts: list[str], geometry: list[dict]) -> str:
        h = hashlib.sha256(geometry_key(geometry).encode())
        for a in artifacts:
            h.update(self.artifact_digest(a).encode())
        return h.hexdigest()

    def artifact_digest(self, path: str) -> str:
        """The sha256 of a compiled artifact's bytes, read once a path."""
        d = self._digests.get(path)
        if d is None:
            d = self._digests[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        return d

    def source_rules(self, src: str):
        """forbid.check_source of one rendered source under the spec's rules, worked out once."""
        key = hashlib.sha256(src.encode()).hexdigest()
        with self._rules_lock:
            if key in self._rules:
                return self._rules[key]
        sp = self.spec
        v = forbid.check_source(src, sp.kernel.options, sp.kernel.backend, sp.forbidden.named, sp.forbidden.patterns)
        with self._rules_lock:
            if len(self._rules) >= 4096:
                self._rules.clear()
            self._rules[key] = v
        return v

    def prebuild(self, params: dict, variant: str | None = None) -> None:
        """Compile a configuration's sources into the compile cache, ahead of its trial (no
        verdict: the trial itself builds again, from the cache, and judges)."""
        self.build(self.render_all(params, variant), self.geometry(params), self.approved_sources(params, variant))

    def approved_sources(self, params: dict, variant: str | None) -> list[str] | None:
        """For a variant, the approved template's source for every shape at the same parameters:
        the build its compiled code is judged against (None for the approved template itself,
        or where the template does not render at these parameters)."""
        if variant is None or variant == OLD_TEMPLATE:
            return None
        try:
            return self.render_all(params, None)
        except (render.RenderError, ExprError):
            return None

    def approved_artifacts(self, params: dict, variant: str | None, shapes=None) -> tuple[list[str] | None, str]:
        """For a variant: (the approved template's build at the same parameters, an artifact per
        shape, ""), which the judge runs on the variant's inputs to hold the variant's error to its
        own (worker `evaluate`, verify.paired_error); (None, why) where it does not render or
        build there. For the approved template itself (or the earlier run's): (None, "")."""
        if variant is None or variant == OLD_TEMPLATE:
            return None, ""
        try:
            sources = self.render_all(params, None, shapes)
        except (render.RenderError, ExprError) as e:
            return None, f"the approved template does not render at these parameters: {e}"
        arts, bad = self.compiled(sources)
        if arts is None:
            return None, f"the approved template does not compile at these parameters: {bad.status}: {bad.reason}"
        return arts, ""

    def build(self, sources: list[str], geometry: list[dict], approved: list[str] | None = None) -> "Build":
        """Forbidden rules, compiles (distinct sources side by side) and the profile's limits
        for per-shape sources and launches; the first failure in that order is the verdict.
        Where the backend reports the compiled code (CUDA: PTX and the preprocessed source),
        the source rules run again on the preprocessed source, and a variant's compiled code
        is judged against the approved template's build at the same parameters (`approved`,
        its source per shape); the approved template's own build is its own baseline."""
        sp = self.spec
        unique = list(dict.fromkeys(sources))
        for src in unique:
            v = self.source_rules(src)
            if v:
                return Build("forbidden", str(v), source=src)
        arts, resources, compile_s, comp = {}, {}, 0.0, {}
        for src, c in zip(unique, self._compile_all(unique)):  # a failure in shape order is reported
            compile_s += c.seconds
            if not c.ok:
                return Build(c.status, c.reason, compile_s=compile_s, log=c.log, source=src)
            why = self._params_problem(c)
            if why:  # kernel.args against the entry's parameters, as the GPU's load would find them
                return Build("compile_error", why, compile_s=compile_s, source=src)
            arts[src] = c.artifact
            resources[src] = c.resources
            comp[src] = c
        judged = self._judge_compiled(sources, comp, approved)
        if judged is not None:
            why, mine, theirs = judged
            if why:  # (a disassembler missing or failing is the judge's trouble, not the candidate's)
                return Build("error" if why.startswith("disassembler_unavailable") else "forbidden", why,
                             compile_s=compile_s, ptx=mine, ptx_approved=theirs)
        mine, theirs = (judged[1], judged[2]) if judged else (None, None)
        prune = getattr(self.backend, "prune", None)
        if prune is not None:
            for i, (src, geo) in enumerate(zip(sources, geometry)):
                why = prune(resources[src], geo, sp.hw, "spills" in sp.forbidden.named)
                if why:
                    return Build("pruned", f"shape {i}: {why}", resources=resources, compile_s=compile_s,
                                 ptx=mine, ptx_approved=theirs)
        return Build("ok", artifacts=[arts[s] for s in sources], resources=resources, compile_s=compile_s,
                     ptx=mine, ptx_approved=theirs)

    def _params_problem(self, c) -> str | None:
        """CUDA: what is wrong between kernel.args and the entry's parameters in the build's PTX
        (backends.cuda.params_problem), or None (none, or no PTX to read them from)."""
        if self.spec.kernel.backend != "cuda" or not c.artifact:
            return None
        if c.artifact not in self._params:  # (an artifact is named by its content: read once)
            from .backends import cuda

            try:
                text = Path(c.artifact).with_suffix(".ptx").read_text(encoding="utf-8", errors="replace")
            except OSError:
                return None
            sizes = cuda.entry_param_sizes(text, self.spec.kernel.entry)
            self._params[c.artifact] = None if sizes is None else cuda.params_problem(
                self.spec.kernel.entry, sizes, arg_kinds(self.spec, cuda.Runtime.symbol_type))
        return self._params[c.artifact]

    def _judge_compiled(self, sources: list[str], comp: dict, approved: list[str] | None):
        """(why it is forbidden or "", the candidate's PTX counts, the approved build's) from
        what the compiler reported, or None where the backend reports nothing."""
        from ..build import ptx

        sp = self.spec
        named = sp.forbidden.named
        if any(c.ptx is None for c in comp.values()):
            return None
        mine = ptx.merge([comp[s].ptx for s in dict.fromkeys(sources)])
        if approved is None or (not named and not sp.forbidden.patterns):
            return "", mine, None  # the approved template: its own build is what is allowed
        expand = getattr(self.backend, "expand", None)  # the CPU backend's rules run in its compile
        # a variant: the rules after the preprocessor (the CPU backend's run in its compile, which
        # also judges what g++ includes; CUDA's read the whole text and the layout first)
        for src, asrc in dict.fromkeys(zip(sources, approved)) if expand is not None else ():
            if sp.kernel.backend == "cuda":
                v = forbid.check_names_anywhere(src, sp.kernel.options, sp.kernel.backend, named)
                if v:
                    return str(v), mine, None
                why = forbid.odd_layout(src)
                if why:
                    return f"preprocessor: {why}", mine, None
                why = forbid.foreign_include(src, asrc)
                if why:
                    return f"foreign_include: {why}", mine, None
            expanded, why = expand(src, sp.kernel.options, sp.hw)
            if expanded is None:
                if named:
                    return (f"preprocessor: the source rules need the preprocessed source, and the "
                            f"preprocessor could not read it ({why})"), mine, None
                continue
            v = forbid.check_expanded(expanded, sp.kernel.backend, named, sp.forbidden.patterns)
            if v:
                return str(v), mine, None
        base_unique = list(dict.fromkeys(approved))
        base = dict(zip(base_unique, self._compile_all(base_unique)))
        ok = all(c.ok and c.ptx is not None for c in base.values())
        theirs = ptx.merge([base[s].ptx for s in base_unique]) if ok else None
        opcodes = getattr(self.backend, "library_opcodes", None)
        waived = opcodes(sp.kernel.options, sp.hw) if opcodes is not None else frozenset()
        for i, (src, asrc) in enumerate(zip(sources, approved)):
            found = ptx.compare(comp[src].ptx, base[asrc].ptx if ok else None, named, waived)
            if found:
                other = {"unreadable_ptx": ptx.UNREADABLE, "unjudged_ptx": ptx.UNJUDGED,
                         "foreign_code": ptx.FOREIGN}.get(found[0], ptx.DEVICE_STATE)
                return _refusal(*found, i, other, ok), mine, theirs
        why = self._judge_machine(sources, comp, approved, base if ok else None)
        return why, mine, theirs

    def _judge_machine(self, sources: list[str], comp: dict, approved: list[str], base: dict | None) -> str:
        """Why a variant's machine code is forbidden (the backend's reader: runner.build.sass for
        cubins, runner.build.x86 for CPU libraries; against the approved build's for the same
        shape), or "" (also where the backend reads none)."""
        sp = self.spec
        counts = getattr(self.backend, "machine_counts", None)
        named = set(sp.forbidden.named) & {"lower_precision", "fast_math"}
        if counts is None:  # (what the reader cannot decode is refused whatever the spec names)
            return ""
        reader = self.backend.machine_reader
        # a 16-bit float among the op's tensors: rounding to it is what storing or reading one is
        tensors = (*sp.op.inputs, *sp.op.outputs)
        narrow_ok = any(t.dtype in ("bf16", "fp16") for t in tensors)
        ints_ok = any(t.dtype in ("int8", "uint8", "int16") for t in tensors)
        arts = list(dict.fromkeys([comp[s].artifact for s in sources]
                                  + ([base[a].artifact for a in approved] if base else [])))
        try:
            waived = self.backend.machine_library(sp.kernel.options, sp.hw) if "fast_math" in named else frozenset()
            with ThreadPoolExecutor(max_workers=min(4, len(arts))) as pool:  # a disassembler process each
                read = dict(zip(arts, pool.map(counts, arts)))
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            return f"disassembler_unavailable: {e}"
        for i, (src, asrc) in enumerate(zip(sources, approved)):
            found = reader.compare(read[comp[src].artifact], read[base[asrc].artifact] if base else None, named,
                                   waived, narrow_ok, ints_ok)
            if found:
                return _refusal(*found, i, "compiled code the disassembler could not read: what the judge "
                                "cannot read is refused", base is not None)
        return ""

    def compiled(self, sources: list[str]) -> tuple[list[str] | None, object | None]:
        """(artifact per source, None), or (None, the first failed compile): distinct sources
        compiled side by side, mapped back to the per-shape list."""
        unique = list(dict.fromkeys(sources))
        comp = dict(zip(unique, self._compile_all(unique)))
        bad = next((c for c in comp.values() if not c.ok), None)
        return (None, bad) if bad is not None else ([comp[s].artifact for s in sources], None)

    def _compile_all(self, sources: list[str]) -> list:
        """Compile distinct sources side by side: in the backend's worker processes where it
        has them (NVRTC: backends.cuda.compile_all), else on threads (g++ runs as a process)."""
        sp = self.spec
        many = getattr(self.backend, "compile_all", None)
        if many is not None:
            return many(sources, sp.kernel.entry, sp.kernel.options, sp.hw)

        def one(src: str):
            return self.backend.compile(src, sp.kernel.entry, sp.kernel.options, sp.hw)

        if len(sources) == 1:
            return [one(sources[0])]
        with ThreadPoolExecutor(max_workers=min(8, len(sources))) as pool:
            return list(pool.map(one, sources))


    def rebuild(self, params: dict, variant: str | None) -> tuple[list[str], list[str]] | None:
        """(sources, artifacts) of a configuration judged before (compiled again, from the
        cache on disk), or None where it no longer renders or compiles."""
        try:
            sources = self.render_all(params, variant)
        except (render.RenderError, ExprError, KeyError):
            return None
        arts, _ = self.compiled(sources)
        return None if arts is None else (sources, arts)
