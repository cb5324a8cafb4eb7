#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
PIN=(python3 -c "import os,sys;os.sched_setaffinity(0,{3});os.execvp(sys.argv[1],sys.argv[1:])")
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r2/$G; D=$R/s19-probes; mkdir -p $D
for i in 1 2; do
  timeout 100 "${PIN[@]}" python3 -m moda_bench.cli sweep --vary T --values 1024,2048 --timer eager --providers moda,fa2 --max-time 2 --out $R/pin-s19/pin$i > $D/pin$i.log 2>&1
  timeout 100 $MB sweep --vary T --values 1024,2048 --timer eager --providers moda,fa2 --max-time 2 --out $R/pin-s19/free$((i+2)) > $D/free$((i+2)).log 2>&1
done
for f in $R/pin-s19/*/sweep_T.csv; do echo "== $f"; python3 -c "
import pandas as pd; d=pd.read_csv('$f'); print(d[['provider','timer','T','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','health']].to_string())"; done
timeout 60 "${PIN[@]}" python3 results/h100/s18-dp-first/_s18_handoff.py 1024 > $D/handoff_pin.log 2>&1
grep -v Warn $D/handoff_pin.log
cd /tmp/r2 && tar -czf $OUT/r2.tgz .
