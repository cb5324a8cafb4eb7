#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r1/$G; D=$R/s19-probes; mkdir -p $D
$MB doctor > $D/doctor.log 2>&1; tail -1 $D/doctor.log
if [ $G = h200 ]; then RESULTS=/tmp/r1 GPU=$G bash tools/device_session.sh fa4-small fa4-part1 > $D/fa4.log 2>&1; tail -2 $D/fa4.log; fi
timeout 200 python3 tools/_s19_l0scan.py 16384,8,0 > $D/l0scan.log 2>&1; cat $D/l0scan.log
pin() { python3 -c "import os,sys;os.sched_setaffinity(0,{3});os.execvp(sys.argv[1],sys.argv[1:])" "$@"; }
for i in 1 2; do
  timeout 100 $MB sweep --vary T --values 1024,2048 --timer eager --providers moda,fa2 --max-time 2 --out $R/pin-s19/free$i > $D/free$i.log 2>&1
  timeout 100 pin $MB sweep --vary T --values 1024,2048 --timer eager --providers moda,fa2 --max-time 2 --out $R/pin-s19/pin$i > $D/pin$i.log 2>&1
done
for f in $R/pin-s19/*/sweep_T.csv; do echo "== $f"; python3 -c "
import pandas as pd; d=pd.read_csv('$f'); print(d[['provider','timer','T','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','health']].to_string())"; done
timeout 60 python3 results/h100/s18-dp-first/_s18_handoff.py 1024 > $D/handoff_free.log 2>&1
timeout 60 pin python3 results/h100/s18-dp-first/_s18_handoff.py 1024 > $D/handoff_pin.log 2>&1
cat $D/handoff_free.log $D/handoff_pin.log | grep -v Warn
cd /tmp/r1 && tar -czf $OUT/r1.tgz .
