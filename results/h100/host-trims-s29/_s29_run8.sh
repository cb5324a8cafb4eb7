#!/bin/bash
# session 29, eighth call (asked for the H200 kind again): the T=1024 row on the final code, sweep and
# in-process A/B against a8c3803 with FA2
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD:$PWD/.abold
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r8; H=$R/$G/short-t-s29; mkdir -p $H
MB="python3 -m moda_bench.cli"
timeout 60 $MB doctor > $H/doctor.log 2>&1; echo "doctor rc=$?"; tail -3 $H/doctor.log
timeout 100 $MB sweep --vary T --values 1024 --timer graph,eager --providers moda,fa2 --max-time 2 --out $H/short-t \
  > $H/short-t.log 2>&1; echo "sweep rc=$?"
python3 - $H <<'PY'
import sys, glob, pandas as pd
for f in glob.glob(f"{sys.argv[1]}/short-t/*.csv"):
    for _, r in pd.read_csv(f).iterrows():
        print(f"{r['timer']:6s} {r['provider']:5s} {1e3*r['median_ms']:7.1f} us  x fa2 {r['ratio_to_fa2']:.3f} "
              f"[{r['ratio_to_fa2_lo']:.3f}-{r['ratio_to_fa2_hi']:.3f}] {r['health']}")
PY
timeout 100 python3 tools/host_ab.py --T 1024 --G 8 --L 64 --max-time 2 > $H/ab_T1024_G8_L64.log 2>&1
echo "ab rc=$?"; cat $H/ab_T1024_G8_L64.log
cd $R && tar -czf $OUT/r8.tgz .
