"""JSON Schemas of the spec and of hardware profiles (Draft 2020-12).

The schema checks shape and types; everything that needs cross-references
(expressions, template variables, parameter domains) is checked in spec.py,
with the same file:line:col diagnostics.
"""

from __future__ import annotations

import difflib
import json

NUM = {"type": "number"}
POS_INT = {"type": "integer", "minimum": 1}
EXPR = {"type": ["string", "integer", "number"], "description": "a safe expression"}
SCALAR = {"type": ["integer", "number", "string", "boolean"]}
NAME = {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}

DTYPES = ["bf16", "fp16", "fp32", "fp64", "int8", "uint8", "int32", "int64", "bool"]
# the routing dists draw an offsets input: per-expert cumulative row ends (judge/inputs.py)
ROUTING_DISTS = ["routing", "routing_one", "routing_empty", "routing_single"]
DISTS = ["normal", "uniform", "outliers", "positive", "large", "masked", "offset", "spike", "huge", "tiny", "scaled",
         "randint", "perm", *ROUTING_DISTS]
METRICS = ["time_us", "speedup", "bandwidth_fraction", "flops_fraction", "limit_fraction"]


def _obj(props: dict, required: list[str] = (), **kw) -> dict:
    return {"type": "object", "properties": props, "required": list(required),
            "additionalProperties": False, **kw}


SHAPE = {"type": "object", "minProperties": 1, "propertyNames": NAME, "additionalProperties": POS_INT}

TENSOR = _obj({
    "shape": {"type": "array", "items": EXPR, "minItems": 1},
    "dtype": {"enum": DTYPES},
    "dist": {"oneOf": [{"enum": DISTS}, {"type": "array", "items": {"enum": DISTS}, "minItems": 1}]},
    "low": EXPR,
    "high": EXPR,
    "special": _obj({"value": NUM, "fraction": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
                    ["value", "fraction"]),
    # an integer input: a share of its elements the index of an earlier input's row maximum (spec.py)
    "argmax": _obj({"of": NAME, "fraction": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
                   ["of", "fraction"]),
    # a routing dist's offsets input: the rows routed (an expression: R = tokens x topk) and the
    # experts each token picks (spec.py checks them)
    "rows": EXPR,
    "topk": POS_INT,
    # a floating input whose rows gather the tokens of that routing input (spec.py, judge/inputs.py)
    "gather": NAME,
    # an input's values in timed calls, where they differ from verification's (spec.py)
    "timed": _obj({
        "dist": {"oneOf": [{"enum": DISTS}, {"type": "array", "items": {"enum": DISTS}, "minItems": 1}]},
        "low": EXPR,
        "high": EXPR,
    }, minProperties=1),
}, ["shape"])

PARAM = {"oneOf": [
    {"type": "array", "items": SCALAR, "minItems": 1},
    _obj({"values": {"type": "array", "items": SCALAR, "minItems": 1}}, ["values"]),
    _obj({"range": _obj({"min": {"type": "integer"}, "max": {"type": "integer"},
                         "step": POS_INT}, ["min", "max"])}, ["range"]),
    _obj({"pow2": _obj({"min": POS_INT, "max": POS_INT}, ["min", "max"])}, ["pow2"]),
]}

FORBID = {"oneOf": [
    {"type": "string"},
    _obj({"pattern": {"type": "string", "minLength": 1}, "reason": {"type": "string"}},
         ["pattern", "reason"]),
    _obj({"rule": EXPR, "reason": {"type": "string"}}, ["rule", "reason"]),
]}

SPEC = _obj({
    "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]*$"},
    "description": {"type": "string"},
    "hardware": {"type": "string", "minLength": 1},
    "op": _obj({
        "reference": {"type": "string", "pattern": r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"},
        "triton": {"type": "string", "pattern": r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"},
        # named arms of pipe compare: name -> "module:function" (spec.py refuses the built-in names)
        "arms": {"type": "object", "propertyNames": {"type": "string", "pattern": r"^[^#\s]([^\n]*\S)?$",
                                                     "maxLength": 40},
                 "additionalProperties": {"type": "string", "pattern": r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"}},
        # arms the dispatch table may take instead of the reference where they are faster
        # (spec.py checks each names an arm; pipe compare verifies each on the judge's inputs)
        "fallbacks": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "notes": {"type": "string"},
        "traffic": {"enum": ["copy", "read"]},
        "dtype": {"enum": DTYPES},
        "inputs": {"type": "object", "additionalProperties": TENSOR, "minProperties": 1,
                   "propertyNames": NAME},
        "outputs": {"type": "object", "additionalProperties": TENSOR, "minProperties": 1,
                    "propertyNames": NAME},
        "scalars": {"type": "object", "propertyNames": NAME, "additionalProperties": _obj(
            {"value": SCALAR, "type": {"enum": ["i32", "i64", "f32", "f64"]}}, ["value", "type"])},
        "shapes": {"type": "array", "minItems": 1, "items": SHAPE},
        "extra_shapes": {"type": "array", "items": SHAPE},
        "held_out_shapes": {"type": "array", "items": SHAPE},
        "tolerance": _obj({"atol": {"type": "number", "minimum": 0},
                           "rtol": {"type": "number", "minimum": 0},
                           "ulps": {"type": "number", "minimum": 0},
                           "floor": {"type": "number", "minimum": 0},
                           # the budget of a GEMM with fp32 accumulation over K (judge/verify.GemmBudget)
                           "gemm_k": EXPR}),
        "bytes": EXPR,
        "flops": EXPR,
        # inputs multiplied together along their last dimension (attention's q and k): verification's
        # outlier channels of one are small in the other (judge/inputs.py, spec.py checks the names)
        "channel_pairs": {"type": "array", "items": {"type": "array", "items": NAME, "minItems": 2, "maxItems": 2}},
        "in_place": {"type": "boolean"},
        # the sizes the exported op serves: each symbol a range (a grid axis), or a value
        # worked out from the axes at the tuning points (`tune`)
        "domain": {"type": "object", "minProperties": 1, "propertyNames": NAME, "additionalProperties": _obj({
            "min": POS_INT, "max": POS_INT,
            "typical": {"type": "array", "items": POS_INT},
            # one expression, or a list: the first gives the main tuning points, each other
            # one a second row of points at the same axis values (few rows, say)
            "tune": {"oneOf": [EXPR, {"type": "array", "items": EXPR, "minItems": 1, "maxItems": 4}]},
        }, ["min"])},
        "grid": _obj({"per_octave": {"type": "number", "minimum": 0.25, "maximum": 16}}),
        # a constraint across the domain's symbols (B * L <= 2 ** 21): sizes outside it are
        # outside the domain
        "domain_where": EXPR,
        # the batch axis whose rows must not depend on each other (deterministic mode):
        # a shape symbol, or {axis, require} (spec.py checks it; judge/invariance.py the rule)
        # (one schema for both forms: `pattern` binds a string, the rest an object, so a misspelt
        # key gets its own suggestion)
        "batch_invariant": {"type": ["string", "object"], "pattern": NAME["pattern"],
                            "properties": {"axis": NAME, "require": {"type": "boolean"}}, "required": ["axis"],
                            "additionalProperties": False},
    }, ["reference", "dtype", "inputs", "outputs", "shapes", "bytes"]),
    "kernel": _obj({
        "backend": {"enum": ["cpu", "cuda"]},
        "template": {"type": "string", "minLength": 1},
        "entry": NAME,
        "args": {"type": "array", "items": NAME, "minItems": 1},
        "grid": {"oneOf": [EXPR, {"type": "array", "items": EXPR, "minItems": 1, "maxItems": 3}]},
        "block": {"oneOf": [EXPR, {"type": "array", "items": EXPR, "minItems": 1, "maxItems": 3}]},
        "cluster": {"oneOf": [EXPR, {"type": "array", "items": EXPR, "minItems": 1, "maxItems": 3}]},
        "shared_mem": EXPR,
        "derive": {"type": "object", "propertyNames": NAME, "additionalProperties": EXPR},
        # runner-owned workspaces: zeroed once at allocation, left zero by the kernel after
        # every call (spec.py checks names, args and expressions; judge/worker.py the rule)
        "scratch": {"type": "object", "propertyNames": NAME, "additionalProperties": _obj({
            "shape": {"type": "array", "items": EXPR, "minItems": 1},
            "dtype": {"enum": DTYPES},
            "zero": {"type": "boolean"},
        }, ["shape", "dtype"])},
        "serves": EXPR,
        "options": {"type": "array", "items": {"type": "string"}},
        # TMA descriptors (CUtensorMap) of op tensors, each passed by value (in args)
        "tensor_maps": {"type": "object", "propertyNames": NAME, "additionalProperties": _obj({
            "tensor": {"type": "string"},
            "box": {"type": "array", "items": EXPR, "minItems": 1, "maxItems": 5},
            "swizzle": {"enum": [0, 32, 64, 128]},
            "when": EXPR,
        }, ["tensor", "box"])},
    }, ["template", "entry", "args"]),
    "runtime": _obj({
        "mode": {"enum": ["auto", "graph", "direct"]},
        "cache": {"enum": ["cold", "warm"]},
        "warmup_ms": {"type": "number", "exclusiveMinimum": 0},
        "rep_ms": {"type": "number", "exclusiveMinimum": 0},
        "checks": {"type": "integer", "minimum": 1, "maximum": 16},
        "timeout_s": {"type": "number", "exclusiveMinimum": 0},
        "threads": {"type": "integer", "minimum": 1, "maximum": 1024},
    }),
    "baseline": {"enum": ["reference", "compile", "none"]},
    "search": _obj({
        "params": {"type": "object", "minProperties": 1, "propertyNames": NAME,
                   "additionalProperties": PARAM},
        "constraints": {"type": "array", "items": EXPR},
        # one configuration, or a list tried in order before the agent's first proposal
        "start": {"type": ["object", "array"], "additionalProperties": SCALAR, "minItems": 1,
                  "items": {"type": "object", "additionalProperties": SCALAR}},
    }, ["params"]),
    "forbidden": {"type": "array", "items": FORBID},
    "agent": _obj({
        "strategy": {"type": "string"},
        "seed": {"type": "integer", "minimum": 0},
        "options": {"type": "object"},
    }, ["strategy"]),
    "goal": _obj({
        "target": _obj({
            "metric": {"enum": METRICS},
            "at_least": NUM,
            "at_most": NUM,
        }, ["metric"], oneOf=[{"required": ["at_least"]}, {"required": ["at_most"]}]),
        "budget": _obj({"trials": POS_INT, "minutes": {"type": "number", "exclusiveMinimum": 0}}),
        "patience": POS_INT,
        "stop_when_met": {"type": "boolean"},
    }, ["budget"]),
}, ["name", "hardware", "op", "kernel", "search", "goal"])

HW_PROFILE = _obj({
    "name": {"type": "string"},
    "kind": {"enum": ["cpu", "cuda"]},
    "description": {"type": "string"},
    "arch": {"type": "string"},
    "device_name": {"type": "string"},
    "sm_count": POS_INT,
    "cores": POS_INT,
    "clock_mhz": POS_INT,
    "memory_bytes": POS_INT,
    "l2_bytes": POS_INT,
    "max_threads_per_block": POS_INT,
    "max_cluster_size": POS_INT,
    "max_cluster_size_opt_in": POS_INT,
    "max_threads_per_sm": POS_INT,
    "warp_size": POS_INT,
    "shared_mem_per_block_bytes": POS_INT,
    "shared_mem_per_block_optin_bytes": POS_INT,
    "shared_mem_per_sm_bytes": POS_INT,
    "registers_per_sm": POS_INT,
    "registers_per_block": POS_INT,
    "max_registers_per_thread": POS_INT,
    "bandwidth": _obj({
        "measured_bytes_per_s": NUM,
        "datasheet_bytes_per_s": NUM,
        "measured_by": {"type": "string"},
        "read_bytes_per_s": NUM,
        "read_measured_by": {"type": "string"},
    }, ["measured_bytes_per_s"]),
    "peak_flops": {"type": "object", "additionalProperties": NUM},
    "features": {"type": "array", "items": {"type": "string"}},
    "limit_slack": {"type": "number", "minimum": 0, "maximum": 10},
}, ["name", "kind", "bandwidth", "peak_flops"])


def diagnostics(loc, schema: dict) -> list:
    """Every schema violation of a loaded document, as positioned diagnostics."""
    import jsonschema

    out = []
    validator = jsonschema.Draft202012Validator(schema)
    for err in validator.iter_errors(loc.data):
        out.extend(_explain(loc, err))
    return out


# the patterns' meanings, for their errors (a regex is no message)
_FORMS = {
    r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$": "module:function (a Python module beside the spec or importable, and a "
                                       "function of it)",
    "^[A-Za-z_][A-Za-z0-9_]*$": "a name of letters, digits and _, not starting with a digit",
    "^[A-Za-z0-9][A-Za-z0-9_.-]*$": "a name of letters, digits, _, . and -, starting with a letter or digit",
}


def _explain(loc, err) -> list:
    import jsonschema

    path = tuple(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = set(err.schema.get("properties", {}))
        extras = [k for k in err.instance if k not in allowed]
        out = []
        for k in extras:
            close = difflib.get_close_matches(k, sorted(allowed), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else \
                (f" (allowed: {', '.join(sorted(allowed))})" if allowed else "")
            out.append(loc.diag(path + (k,), f"unknown key '{k}'{hint}", prefer_key=True))
        if out:
            return out
    if err.validator == "required":
        return [loc.diag(path, err.message.replace("is a required property", "is required"))]
    alts = err.validator_value if err.validator == "oneOf" else None
    if alts and all(isinstance(x, dict) and x.keys() == {"required"} for x in alts) \
            and isinstance(err.instance, dict):  # `oneOf: [{required: [a]}, {required: [b]}]`: exactly one key
        keys = [x["required"][0] for x in alts]
        given = [k for k in keys if k in err.instance]
        return [loc.diag(path, f"give {' or '.join(keys)}, not both" if given else f"give one of {', '.join(keys)}")]
    if err.validator in ("oneOf", "anyOf") and err.context:
        # Pick the explanation from the alternative that got furthest: one that matched the
        # value's form and failed inside it (`{range: {step: 0}}`: the step), else best_match's.
        deep = [e for e in err.context if len(e.relative_path) > 0]
        if deep:
            return _explain(loc, max(deep, key=lambda e: len(e.relative_path)))
        best = jsonschema.exceptions.best_match(err.context)
        if best is not None and (best.validator != "type" or len(best.absolute_path) > 0):
            return _explain(loc, best)
        types = sorted({str(e.schema.get("type", "")) for e in err.context if e.validator == "type"} - {""})
        what = " or ".join(types) if types else "one of the documented forms"
        return [loc.diag(path, f"expected {what}, got {json.dumps(err.instance)[:60]}")]
    msg = err.message
    if err.validator == "type":
        msg = f"expected {err.validator_value if isinstance(err.validator_value, str) else ' or '.join(err.validator_value)}, " \
              f"got {type(err.instance).__name__} {json.dumps(err.instance)[:60]}"
    elif err.validator in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        word = {"minimum": "at least", "exclusiveMinimum": "greater than", "maximum": "at most",
                "exclusiveMaximum": "less than"}[err.validator]
        msg = f"must be {word} {err.validator_value:g}, got {json.dumps(err.instance)[:60]}"
    elif err.validator == "pattern":
        form = _FORMS.get(err.validator_value)
        msg = f"expected {form}, got {json.dumps(err.instance)[:60]}" if form else msg
    elif err.validator == "enum":
        msg = f"{json.dumps(err.instance)[:60]} is not one of {', '.join(map(str, err.validator_value))}"
        close = difflib.get_close_matches(str(err.instance), [str(v) for v in err.validator_value], n=1)
        if close:
            msg += f"; did you mean '{close[0]}'?"
    return [loc.diag(path, msg)]
