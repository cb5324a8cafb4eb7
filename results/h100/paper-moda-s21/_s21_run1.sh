#!/bin/bash
# session 21, first call: the host of an eager T=1024 call (phases, cProfile, engine) on the final code,
# the G=32 dq pass in 32-row blocks, the L=0 passes at T=16384 and the paper preset (moda, FA2)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r1/$G; mkdir -p $R/paper-moda-s21 $R/l0-s21 $R/s21-host
MB="python3 -m moda_bench.cli"
$MB doctor > $R/paper-moda-s21/doctor.log 2>&1; tail -1 $R/paper-moda-s21/doctor.log
timeout 60 taskset -c 3 python3 tools/host_probe.py --T 1024 --phases --calls 300 > $R/s21-host/phases.log 2>&1; tail -4 $R/s21-host/phases.log
timeout 60 taskset -c 3 python3 tools/host_probe.py --T 1024 --calls 300 --top 45 > $R/s21-host/cprofile.log 2>&1; head -3 $R/s21-host/cprofile.log
timeout 60 taskset -c 3 python3 tools/host_probe.py --T 1024 --engine --calls 300 > $R/s21-host/engine.log 2>&1; tail -6 $R/s21-host/engine.log
timeout 100 python3 tools/host_probe.py --T 16384 --Hk 8 --G 32 --L 64 --variants "q_m=32;q_m=32,q_s=2" --max-time 2 > $R/s21-host/g32_qm32.log 2>&1; tail -8 $R/s21-host/g32_qm32.log
timeout 90 $MB sweep --vary T --values 16384 --L 0 --pass bwd --providers fa2-triton,fa2,cudnn --max-time 3 --out $R/l0-s21/bwd > $R/l0-s21/bwd.log 2>&1; tail -1 $R/l0-s21/bwd.log
timeout 60 $MB sweep --vary T --values 16384 --L 0 --pass fwd --providers fa2-triton,fa2,cudnn --max-time 3 --out $R/l0-s21/fwd > $R/l0-s21/fwd.log 2>&1; tail -1 $R/l0-s21/fwd.log
timeout 330 $MB sweep --preset paper --providers moda,fa2 --max-time 2 --out $R/paper-moda-s21 > $R/paper-moda-s21/sweep.log 2>&1; tail -1 $R/paper-moda-s21/sweep.log
python3 - <<'PY'
import glob, pandas as pd
for f in sorted(glob.glob('/tmp/r1/*/l0-s21/*/sweep_*.csv')):
    d = pd.read_csv(f)
    print(f.split('/')[-2], d[['provider', 'pass', 'median_ms', 'tflops', 'ratio_to_best', 'ratio_to_best_lo', 'ratio_to_best_hi', 'health']].to_string(index=False))
for f in sorted(glob.glob('/tmp/r1/*/paper-moda-s21/sweep_*.csv')):
    d = pd.read_csv(f); d = d[d.provider == 'moda']
    print(f.split('/')[-1], d[['T', 'G', 'L', 'median_ms', 'ratio_to_fa2', 'ratio_to_fa2_lo', 'ratio_to_fa2_hi', 'health']].to_string(index=False))
PY
cd /tmp/r1 && tar -czf $OUT/r1.tgz .
