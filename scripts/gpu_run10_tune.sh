#!/usr/bin/env bash
# GPU call A (issue 8): tune the depth placement groups (fwd_depth, bwd_depth; budget 8 each) for
# the paper preset's shapes except T=65536 (its default is already below FA2, and each of its
# candidates costs seconds). The tile groups stay at their defaults (earlier budget-3 tuning kept
# the default on 10 of 11 shapes). Writes $OUT/tuning.json and the summaries.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD COLUMNS=160
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
T0=$(date +%s)
tune() { local name=$1 lim=$2; shift 2
  timeout $lim python3 -m moda_bench.cli tune --kernels fwd_depth,bwd_depth --budget 8 --cache $OUT/tuning.json \
    --out $OUT/tune_$name.csv "$@" > $OUT/tune_$name.log 2>&1; echo "tune $name exit $? at $(( $(date +%s) - T0 )) s"; }
tune T 170 --vary T --values 4096,8192,16384,32768
tune G 190 --vary G --values 2,4,16,32
tune L 100 --vary L --values 128,256
python3 - <<PY
from moda_bench.ops.moda import tuning as tu
for k, v in sorted(tu.load_cache("$OUT/tuning.json").items()):
    c = v["config"]
    print(f"{k[k.index('d64'):]:24s} {v['default_ms']:8.3f} -> {v['tuned_ms']:8.3f} ms  x{v['speedup']:.3f}  "
          f"fwd {c['fwd_depth']}/{c['depth_block_m']}/w{c['depth_warps']}  bwd {c['bwd_depth']}/{c['bwd_depth_block_m']}"
          f"/w{c['bwd_depth_warps']}/l{c['bwd_block_l']}/s{c['bwd_depth_stages']}")
PY
