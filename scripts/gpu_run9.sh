#!/usr/bin/env bash
# GPU call on a 2-GPU H200 node (issues 8 + 9), one command:
#  1. tune the paper preset's shapes, T sweep on GPU 0 and G/L sweeps on GPU 1 at once, merged cache;
#  2. GPU 0: paper preset on ONE GPU with that cache (issue 8 table; issue 9's 1-GPU wall time),
#     then the ablation ladder without the naive rung;
#     GPU 1 meanwhile: gpu-marked tests, placement probe, CI gate baseline refresh;
#  3. paper preset on BOTH GPUs (--gpus all), same cache, fresh compile caches (issue 9).
# Needs MODA_BENCH_GIT_COMMIT set by the caller (the device copy has no .git).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD COLUMNS=160
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=index,name,clocks.sm,temperature.gpu --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"
fresh() { export TRITON_CACHE_DIR=/tmp/tc_$1 TORCHINDUCTOR_CACHE_DIR=/tmp/ic_$1; }
T0=$(date +%s)
# --- 1. tuning, split over the two GPUs
( fresh tune0; CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m moda_bench.cli tune --vary T --budget 3 \
    --cache $R/tune_T.json --out $R/tune_T.csv > $R/tune_T.log 2>&1; echo "tune T exit $?" ) &
( fresh tune1; export CUDA_VISIBLE_DEVICES=1
  timeout 70 python3 -m moda_bench.cli tune --vary G --budget 3 --cache $R/tune_GL.json --out $R/tune_G.csv > $R/tune_G.log 2>&1
  echo "tune G exit $?"
  timeout 45 python3 -m moda_bench.cli tune --vary L --values 128,256 --budget 3 --cache $R/tune_GL.json \
    --out $R/tune_L.csv > $R/tune_L.log 2>&1; echo "tune L exit $?" ) &
wait
python3 - <<EOF
from moda_bench.ops.moda import tuning as tu
e = {}
for f in ("$R/tune_T.json", "$R/tune_GL.json"):
    e.update(tu.load_cache(f))
tu.save_entries(e, "$R/tuning.json")
for k, v in sorted(e.items()):
    print(f"{k:60s} default {v['default_ms']:8.3f} tuned {v['tuned_ms']:8.3f} ms")
EOF
echo "tuning done at $(( $(date +%s) - T0 )) s"
export MODA_BENCH_TUNING_CACHE=$R/tuning.json
# --- 2. GPU 0: one-GPU paper preset, then the ablation ladder; GPU 1: tests, probe, gate
( fresh p1; export CUDA_VISIBLE_DEVICES=0
  /usr/bin/time -f "paper preset on 1 GPU wall %e s" timeout 230 python3 -m moda_bench.cli sweep --preset paper \
    --out $R/paper1 > $R/paper1.log 2>&1; echo "paper1 exit $?"
  timeout 60 python3 -m moda_bench.cli ablate --skip-naive --out $R/ablation > $R/ablation.log 2>&1
  echo "ablate exit $?" ) &
( fresh g1; export CUDA_VISIBLE_DEVICES=1
  timeout 75 python3 -m pytest -q -m gpu -s tests/test_moda.py tests/test_sweep.py > $R/gpu_tests.log 2>&1
  echo "gpu tests exit $?"; grep -E "rel errors|: out=|passed|failed|Error" $R/gpu_tests.log | tail -14
  timeout 100 python3 scripts/kernel_probe.py --T 4096,16384 --G 8 --L 64 --variants default,fused,split,stream \
    --l0-variants default --passes fwdbwd,fwd --out $R/probe9.csv > $R/probe9.log 2>&1
  echo "probe exit $?"
  cp results/baselines/h200_gate_baseline.csv $R/gate_baseline.csv
  timeout 50 python3 -m moda_bench.cli gate --run --baseline $R/gate_baseline.csv --current $R/gate_current.csv \
    --summary $R/gate.md --update-baseline > $R/gate.log 2>&1; echo "gate exit $?" ) &
wait
echo "phase 2 done at $(( $(date +%s) - T0 )) s"
# --- 3. both GPUs
( fresh p2; /usr/bin/time -f "paper preset on 2 GPUs wall %e s" timeout 200 python3 -m moda_bench.cli sweep \
    --preset paper --gpus all --out $R/paper2 > $R/paper2.log 2>&1; echo "paper2 exit $?" )
echo "all done at $(( $(date +%s) - T0 )) s"
grep -h "wall" $R/paper1.log $R/paper2.log
grep -E "^T=" $R/probe9.log
tail -4 $R/gate.log
tar czf $OUT/results.tgz -C $R . && ls -la $OUT
