"""tools/sass_mix.py: opcodes parsed from cuobjdump's SASS listing (predicates and
modifiers stripped), grouped by pipe, and on a real template the exponentials show up
as MUFU and the merge rewrite as one exponential a merge."""

import subprocess
import sys

import pytest

from runner.build import sass

from .conftest import PIPELINES, ROOT, load_script

sass_mix = load_script("tools/sass_mix.py")

LISTING = """
\t\tFunction : softmax_bf16
        /*0000*/                   LDC R1, c[0x0][0x28] ;                  /* 0x00000a00ff017b82 */
        /*0090*/                   FSETP.GEU.AND P0, PT, R0, -126, PT ;   /* 0xc2fc00000000780b */
        /*00a0*/              @!P0 FMUL R0, R0, 0.5 ;                     /* 0x3f00000000008820 */
        /*00b0*/                   MUFU.EX2 R7, R0 ;                      /* 0x0000000000077308 */
        /*00c0*/               @P1 BRA 0x3d0 ;                            /* 0x0000000000077308 */
        /*00d0*/                   SHFL.BFLY PT, R94, R65, 0x10, 0x1f ;   /* 0x0000000000077308 */
        /*00e0*/                   YIELD ;                                /* 0x0000000000077308 */
        /*00f0*/                   NOP ;                                  /* 0x0000000000077308 */
"""


def test_listing_is_counted_by_opcode_and_pipe():
    ops = sass_mix.mix(LISTING)
    assert ops == {"LDC": 1, "FSETP": 1, "FMUL": 1, "MUFU": 1, "BRA": 1, "SHFL": 1, "YIELD": 1}  # NOP left out
    pipes = sass_mix.by_pipe(ops)
    assert pipes == {"mufu": 1, "fp32": 2, "int": 0, "memory": 1, "sync": 1, "other": 2}


def test_main_loop_is_the_widest_backward_branch():
    listing = "\n".join(f"        /*{a:04x}*/                   {ins} ;    /* 0x0 */" for a, ins in [
        (0x00, "LDC R1, c[0x0][0x28]"), (0x10, "MOV R2, RZ"),
        (0x20, "LDS R4, [R2]"),                      # the loop starts here
        (0x30, "FADD R5, R4, R5"), (0x40, "@P0 BRA 0x30"),  # a small inner loop
        (0x50, "MUFU.EX2 R6, R5"), (0x60, "NOP"),
        (0x70, "@!P1 BRA 0x20"),                     # the loop's back edge
        (0x80, "EXIT"), (0x90, "FMUL R7, R6, R6"), (0xa0, "BRA 0x60"),  # a cold path jumping back in
    ])
    n, ops = sass_mix.main_loop(listing)
    assert n == 5  # 0x20 to 0x70, the NOP left out; not the set-up, not the cold path
    assert ops == {"LDS": 1, "FADD": 1, "BRA": 2, "MUFU": 1}
    assert sass_mix.main_loop(LISTING) == (0, {})  # no backward branch: no loop


needs_tools = pytest.mark.skipif(sass.tool() is None, reason=sass.UNAVAILABLE)
cuda_core = pytest.importorskip("cuda.core", reason="cuda.core (pip install '.[cuda]') is needed to compile")


@needs_tools
def test_a_real_kernel_disassembles_and_the_json_adds_up(tmp_path):
    cfg = '{"EPT": 64, "TMAX": 512, "MINB": 1, "VEC": 8, "HOLD": "ring", "LOAD": "default", "STORE": "default"}'
    out = tmp_path / "mix.json"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "sass_mix.py"), str(PIPELINES / "softmax-h200.yaml"),
                        "4096x32768", cfg, "--variants", "real,cheap-exp", "--json", str(out)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    doc = json.loads(out.read_text())
    real, cheap = doc["variants"]["real"], doc["variants"]["cheap-exp"]
    assert real["total"] == sum(real["ops"].values())
    # the persistent ring's row loop: most of the kernel, not all (set-up and cold paths)
    assert real["loop"] == sum(real["loop_ops"].values()) == sum(real["pipes"].values())
    assert 0.5 * real["total"] < real["loop"] < real["total"]
    assert real["loop_ops"]["MUFU"] >= 64 and real["loop_ops"].get("DEPBAR", 0) >= 1  # it waits for the ring
    # 64 elements a thread, one exponential each, in a fully unrolled row loop; the cheap
    # variant replaces every exp2f by an FMA, so almost no MUFU is left (a reciprocal or two)
    assert real["ops"]["MUFU"] >= 64 and cheap["ops"].get("MUFU", 0) < 8
    assert real["issue_us"] > cheap["issue_us"] > 0
    assert "geometry" in doc and doc["geometry"]["block"] == [512]
