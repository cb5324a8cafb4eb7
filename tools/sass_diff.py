"""Did a change alter a MoDA Triton kernel's machine code? Compiles one kernel of the working
tree and of a git revision for sm_90 (Hopper) with the local Triton, without a GPU (ptxas and
cuobjdump ship in Triton's wheel), and compares their SASS: resource usage (registers, stack,
spill stores and loads) and whether the instruction text is the same once addresses and
register names in comments are dropped. A refactor that claims "no change for the default path"
can be checked here before any device time is spent.

    python3 tools/sass_diff.py --rev ee06074 --kernel kv      # key-major pass, T=16384 default tiles
    python3 tools/sass_diff.py --rev HEAD~3 --kernel dq --set BL=32 --set GP=32 --set S=1
    python3 tools/sass_diff.py --rev HEAD --kernel dq --set BM=32 --set GP=32 --set S=1 --warps 2   # usage only

Presets (constexprs of the H100 default at G=8, d=64, bf16; `--set NAME=VALUE` overrides one):
kv (`kernel_bwd_tma._kv_kernel`, capped at 168 registers, as above T=4096), kvc (the same with
chunks and dp first, uncapped, as at short T), dq (`_dq_kernel` with its depth part) and fwd
(`kernel_fwd_tma.moda_fwd_tma_kernel`, 8 warps); --warps, --stages, --maxnreg override the
launch options. Against --rev HEAD it reports one version's usage. Only the kernel's own file is taken from the
revision: the helpers it imports from other modules come from the working tree. The Triton here
need not be the device's: identical SASS under it is evidence, not proof, for the device's.
Exit status 0 when identical, 1 when not.

--loops (no --rev needed) prints, for the working tree's kernel, every loop of its SASS (a
backward branch and the instructions it jumps over) with its instruction count and opcode mix:
what one iteration issues per warp. Divided by a step's score elements per thread it gives the
instructions an element costs, the number that shows whether a pass is bound by instruction
issue, the exponential unit (MUFU) or the tensor cores (HGMMA) (docs/PERFORMANCE.md, row 32).
"inner" loops hold no other; an "outer" one spans others (also where ptxas lays a barrier's
retry path after the kernel's end and branches back from it):

    python3 tools/sass_diff.py --loops --kernel fwd
    python3 tools/sass_diff.py --loops --kernel dq --set DEPTH=False
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

FILES = {"kv": "moda_bench/kernels/moda/triton/bwd_tma.py", "kvc": "moda_bench/kernels/moda/triton/bwd_tma.py",
         "dq": "moda_bench/kernels/moda/triton/bwd_tma.py", "fwd": "moda_bench/kernels/moda/triton/fwd_tma.py",
         "one": "moda_bench/kernels/moda/triton/bwd_tma.py"}
KERNELS = {"kv": "_kv_kernel", "kvc": "_kv_kernel", "dq": "_dq_kernel", "fwd": "moda_fwd_tma_kernel",
           "one": "_one_kernel"}
_BWD = dict(GP=8, BM=64, BN=64, D=64, USE_DESC=True, PREC="ieee", S=2, BL=16, DEPTH_STAGES=2, DEPTH_GRAD=True, POLY=0,
            DP_FIRST=False)
CONSTEXPRS = {
    "kv": dict(_BWD, STATS=False, CHUNK=0, DEPTH_ITEMS=False, NSUB=1),
    "kvc": dict(_BWD, STATS=False, CHUNK=128, DEPTH_ITEMS=False, NSUB=1, DP_FIRST=True),
    "dq": dict(_BWD, TAIL=64, DEPTH=True, MIX=False),
    "one": dict(_BWD, DEPTH=True, MIX=True, CHUNK=128, KV_DP_FIRST=True, KV_POLY=0, HOST_DESC=False, TAIL=64,
                WAIT=True),
    "fwd": dict(GP=8, BLOCK_M=128, BLOCK_N=64, HEAD_DIM=64, S=2, BL=16, USE_DESC=True, WS=False, DEPTH_FIRST=False,
                PERSISTENT=False, PREC="ieee", DEPTH_STAGES=2, POLY=0),
}
OPTIONS = {"kv": dict(num_warps=4, num_stages=3, maxnreg=168), "kvc": dict(num_warps=4, num_stages=3),
           "dq": dict(num_warps=4, num_stages=3, maxnreg=168), "fwd": dict(num_warps=8, num_stages=3),
           "one": dict(num_warps=4, num_stages=3)}
# pointer arguments by name (everything else: fp32 scales, i32 sizes)
BF16_PTRS = {"Q", "K", "V", "DO", "O", "OD", "DK", "DV", "KD", "VD", "DQ", "DKD", "DVD"}
FP32_PTRS = {"LSE", "LSE2", "DELTA", "WS"}
I32_PTRS = {"CNT", "SYNC"}
FLOATS = {"qk_scale", "sm_scale"}
ALIGNED_INTS = {"RP"}  # sizes the launches pass as multiples of 16


def signature(fn, constexprs: dict) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) of `fn` for `triton.compile(ASTSource(...))`: pointers
    16-byte aligned, as the launches guarantee where descriptors are used."""
    sig, consts, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        name = p.name
        if p.is_constexpr:
            if name not in constexprs:
                raise SystemExit(f"sass_diff: constexpr {name} of {fn.__name__} has no value (--set {name}=...)")
            sig[name] = "constexpr"
            consts[(i,)] = constexprs[name]
        elif name in BF16_PTRS | FP32_PTRS | I32_PTRS:
            sig[name] = "*bf16" if name in BF16_PTRS else "*fp32" if name in FP32_PTRS else "*i32"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in FLOATS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if name in ALIGNED_INTS:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, consts, attrs


def _tool(name: str) -> str:
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def loop_mix(sass: str, top: int = 12) -> list[tuple[int, int, int, list]]:
    """The loops of a cuobjdump SASS listing: (first address, branch address, instructions, the
    `top` most frequent opcodes with their counts) for every backward branch (BRA to a lower
    address), in address order. An opcode is the mnemonic without its modifiers and predicate."""
    ins = []
    for ln in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", ln)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    loops = []
    for addr, text in ins:
        op = re.sub(r"^@!?U?P[T0-9]+\s+", "", text)
        target = re.search(r"0x([0-9a-f]+)", op) if op.startswith("BRA") else None
        if target and int(target.group(1), 16) < addr:
            lo = int(target.group(1), 16)
            body = [re.sub(r"^@!?U?P[T0-9]+\s+", "", t).split()[0].split(".")[0] for a, t in ins if lo <= a <= addr]
            loops.append((lo, addr, len(body), collections.Counter(body).most_common(top)))
    return sorted(loops)


def compile_sass(path: str, kernel: str, constexprs: dict, options: dict, raw: bool = False):
    """(resource-usage line, normalised SASS instructions) of `kernel` in the module file `path`;
    raw: the listing as cuobjdump printed it, addresses kept (`loop_mix`), instead of the instructions."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    name = f"_sass_diff_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    fn = getattr(mod, kernel)
    sig, consts, attrs = signature(fn, constexprs)
    compiled = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 128), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    try:
        sass = subprocess.run([_tool("cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    lines = [re.sub(r"\s+", " ", re.sub(r"/\*.*?\*/", "", ln)).strip() for ln in sass.splitlines()
             if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]
    usage = next((ln.strip() for ln in res.splitlines() if "REG:" in ln), "?")
    if raw:
        return usage, sass
    spills = f"STL {sum(1 for ln in lines if ln.startswith('STL') or ' STL' in ln)}, " \
             f"LDL {sum(1 for ln in lines if ln.startswith('LDL') or ' LDL' in ln)}"
    return f"{usage}; {len(lines)} instructions; {spills}", "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", default=None, help="git revision to compare the working tree with")
    p.add_argument("--loops", action="store_true", help="the working tree's loops: instructions and opcode mix")
    p.add_argument("--kernel", choices=sorted(KERNELS), default="kv")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override a constexpr")
    p.add_argument("--warps", type=int, default=None, help="num_warps (default: the preset's)")
    p.add_argument("--stages", type=int, default=None, help="num_stages (default: the preset's)")
    p.add_argument("--maxnreg", type=int, default=None, help="registers a thread, 0 for none (default: the preset's)")
    a = p.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    consts = dict(CONSTEXPRS[a.kernel])
    for item in a.set:
        key, val = item.split("=", 1)
        consts[key] = {"True": True, "False": False}.get(val, int(val) if val.lstrip("-").isdigit() else val)
    options = dict(OPTIONS[a.kernel])
    for key, val in (("num_warps", a.warps), ("num_stages", a.stages), ("maxnreg", a.maxnreg)):
        if val is not None:
            options[key] = val or None
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()
    sys.path.insert(0, root)
    rel = FILES[a.kernel]
    if a.loops:
        usage, sass = compile_sass(os.path.join(root, rel), KERNELS[a.kernel], consts, options, raw=True)
        print(f"{a.kernel} working tree: {usage}")
        loops = loop_mix(sass)
        for lo, hi, n, mix in loops:
            inner = not any(lo <= a and b <= hi and (a, b) != (lo, hi) for a, b, _, _ in loops)
            print(f"  {'inner' if inner else 'outer'} loop {lo:#06x}-{hi:#06x}: {n:5d} instructions: "
                  + ", ".join(f"{op} {c}" for op, c in mix))
        return 0
    if a.rev is None:
        p.error("--rev is required unless --loops")
    old = subprocess.run(["git", "show", f"{a.rev}:{rel}"], capture_output=True, text=True, cwd=root)
    if old.returncode:
        print(f"sass_diff: {rel} not in {a.rev}: {old.stderr.strip()}")
        return 2
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(old.stdout)
    try:
        usage_old, sass_old = compile_sass(f.name, KERNELS[a.kernel], consts, options)
    finally:
        os.unlink(f.name)
    usage_new, sass_new = compile_sass(os.path.join(root, rel), KERNELS[a.kernel], consts, options)
    print(f"{a.kernel} at {a.rev}: {usage_old}\n{a.kernel} working tree: {usage_new}")
    same = sass_old == sass_new
    if same:
        print("SASS identical")
    else:
        changed = sum(1 for x, y in zip(sass_old.splitlines(), sass_new.splitlines()) if x != y)
        print(f"SASS differs: {changed} of {min(len(sass_old.splitlines()), len(sass_new.splitlines()))} "
              f"instructions at the same index differ")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
