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
