#!/bin/bash
# session 21, eighth call: the key-major pass beside the dq pass with its chunks (graph) at short T;
# the host of an eager T=1024 call and the short rows after the memoised input checks (28aeb7c+)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r8/$G; mkdir -p $R/short-t-s21d
MB="python3 -m moda_bench.cli"
$MB doctor > $R/short-t-s21d/doctor.log 2>&1; tail -1 $R/short-t-s21d/doctor.log
for P in "1024 8 64" "2048 8 64" "1024 1 64" "1024 16 64" "1024 8 256"; do
  set -- $P
  timeout 60 python3 tools/host_probe.py --T $1 --G $2 --L $3 --variants "beside=1;beside=1,chunk=0" --max-time 1.5 > $R/short-t-s21d/beside_T$1_G$2_L$3.log 2>&1
  echo "T=$1 G=$2 L=$3"; grep -E "^  (graph|eager) beside|failed" $R/short-t-s21d/beside_T$1_G$2_L$3.log
done
timeout 60 taskset -c 3 python3 tools/host_probe.py --T 1024 --phases --calls 300 > $R/short-t-s21d/phases.log 2>&1; cat $R/short-t-s21d/phases.log
timeout 150 $MB sweep --vary T --values 1024,2048 --timer graph,eager --providers moda,fa2 --max-time 2 --pin-cpu 3 --out $R/short-t-s21d > $R/short-t-s21d/sweep.log 2>&1; tail -1 $R/short-t-s21d/sweep.log
python3 - <<'PY'
import glob, pandas as pd
for f in sorted(glob.glob('/tmp/r8/*/short-t-s21d/sweep_*.csv')):
    d = pd.read_csv(f)
    print(d[['provider', 'T', 'timer', 'median_ms', 'ratio_to_fa2', 'ratio_to_fa2_lo', 'ratio_to_fa2_hi', 'health']].to_string(index=False))
PY
cd /tmp/r8 && tar -czf $OUT/r8.tgz .
