#!/bin/bash
# session 22, fifth call: the descriptor forward's tiles (64 x 128 on 4 warps, 128 x 128 on 8) against
# the default, forward alone; the L=0 targets at T=16384 and the short rows on the final code; GPU tests
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r5/$G; mkdir -p $R/s22-fwd-tiles $R/l0-s22 $R/short-t-s22 $R/s22-final
MB="python3 -m moda_bench.cli"
$MB doctor > $R/s22-final/doctor.log 2>&1; tail -1 $R/s22-final/doctor.log
V="fwd_m=64,fwd_n=128,fwd_w=4,fwd_maxnreg=168;fwd_m=64,fwd_n=128,fwd_w=4;fwd_m=128,fwd_n=128,fwd_w=8"
for P in "16384 0" "16384 64" "4096 64" "1024 64"; do set -- $P
  timeout 100 python3 tools/host_probe.py --T $1 --L $2 --pass fwd --variants "$V" --max-time 2 > $R/s22-fwd-tiles/fwd_T$1_L$2.log 2>&1
  grep "graph\|fail" $R/s22-fwd-tiles/fwd_T$1_L$2.log | sed "s/^/T=$1 L=$2 /"
done
for PS in bwd fwd; do
  timeout 120 $MB sweep --vary T --values 16384 --L 0 --pass $PS --providers fa2-triton,fa2,cudnn --max-time 3 --out $R/l0-s22/$PS > $R/l0-s22/$PS.log 2>&1; tail -1 $R/l0-s22/$PS.log
done
timeout 150 $MB sweep --vary T --values 1024,2048 --timer graph,eager --providers moda,fa2 --max-time 2 --pin-cpu 3 --out $R/short-t-s22 > $R/short-t-s22/sweep.log 2>&1; tail -1 $R/short-t-s22/sweep.log
timeout 150 python3 -m pytest -q tests/test_exp_poly.py tests/test_moda_bwd_tma.py tests/test_launch.py tests/test_moda.py -m gpu > $R/s22-final/tests_gpu.log 2>&1; tail -1 $R/s22-final/tests_gpu.log
python3 - <<'PY'
import glob, pandas as pd
for f in sorted(glob.glob('/tmp/r5/*/l0-s22/*/sweep_*.csv')) + sorted(glob.glob('/tmp/r5/*/short-t-s22/sweep_*.csv')):
    d = pd.read_csv(f)
    cols = [c for c in ['provider', 'pass', 'timer', 'T', 'L', 'median_ms', 'tflops', 'ratio_to_fa2', 'ratio_to_fa2_lo', 'ratio_to_fa2_hi', 'health'] if c in d.columns]
    print(f); print(d[cols].to_string(index=False))
PY
cd /tmp/r5 && tar -czf $OUT/r5.tgz .
