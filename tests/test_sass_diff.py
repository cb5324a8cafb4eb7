"""tools/sass_diff.py: the compile signature it builds from a kernel's parameter names (pointer
types and alignment, scales, sizes, constexprs), and its refusal of a constexpr without a value.
Run in a subprocess without TRITON_INTERPRET (the tool compiles real kernels; the interpreter
replaces @triton.jit). The compile itself needs nothing but Triton's wheel; it is left to the
tool's users (a few seconds a kernel)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = r'''
import sys
sys.path.insert(0, sys.argv[1])
import triton
import triton.language as tl
import sass_diff

@triton.jit
def k(Q, LSE, CNT, qk_scale, T, RP, BM: tl.constexpr, NSUB: tl.constexpr):
    pass

sig, consts, attrs = sass_diff.signature(k, {"BM": 64, "NSUB": 1, "UNUSED": 3})
assert sig == {"Q": "*bf16", "LSE": "*fp32", "CNT": "*i32", "qk_scale": "fp32", "T": "i32", "RP": "i32",
               "BM": "constexpr", "NSUB": "constexpr"}, sig
assert consts == {(6,): 64, (7,): 1}, consts
assert attrs == {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]],
                 (5,): [["tt.divisibility", 16]]}, attrs
try:
    sass_diff.signature(k, {"BM": 64})
except SystemExit as e:
    assert "NSUB" in str(e)
else:
    raise AssertionError("a constexpr without a value must stop the tool")
print("ok")
'''


def test_signature_from_parameter_names(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = tmp_path / "sig_check.py"  # @triton.jit needs its source in a file
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(ROOT / "tools")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_loop_mix_reads_backward_branches():
    """`loop_mix` on a hand-made listing: one loop (the backward BRA and what it jumps over, a
    predicated branch too), opcodes without modifiers or predicates; a forward branch is no loop."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("sass_diff_mod", ROOT / "tools" / "sass_diff.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    listing = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   BRA 0x60 ;
        /*0020*/                   HGMMA.64x64x16.F32.BF16 gdesc[UR4], RZ, !UPT ;
        /*0030*/                   MUFU.EX2 R2, R3 ;
        /*0040*/                   FFMA R4, R5, R6, R7 ;
        /*0050*/              @P0  MUFU.EX2 R8, R9 ;
        /*0060*/              @!P1 BRA 0x20 ;
        /*0070*/                   EXIT ;
    """
    loops = mod.loop_mix(listing)
    assert loops == [(0x20, 0x60, 5, [("MUFU", 2), ("HGMMA", 1), ("FFMA", 1), ("BRA", 1)])]
