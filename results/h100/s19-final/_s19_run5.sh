#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r5/$G; D=$R/s19-final; mkdir -p $D
$MB doctor > $D/doctor.log 2>&1; cat $D/doctor.log | tail -12
if [ $G = h200 ]; then RESULTS=/tmp/r5 GPU=$G bash tools/device_session.sh fa4-small fa4-part1 > $D/fa4.log 2>&1; tail -2 $D/fa4.log; fi
timeout 470 python3 -m pytest -q -p no:cacheprovider tests/test_launch.py tests/test_host.py tests/test_moda_tma.py tests/test_moda_bwd_chunks.py tests/test_moda_bwd_tma.py -k "not fa4" > $D/tests_gpu.log 2>&1; tail -n 3 $D/tests_gpu.log
timeout 60 python3 tools/host_probe.py --T 1024 --launch --max-time 2 2>&1 | grep -v Warn | tee $D/launch_T1024.log
timeout 100 $MB sweep --vary T --values 1024,2048 --timer graph,eager --providers moda,fa2 --max-time 2 --out $R/host-s19/free > $D/free.log 2>&1
timeout 100 $MB sweep --vary T --values 1024,2048 --timer graph,eager --providers moda,fa2 --max-time 2 --pin-cpu 5 --out $R/host-s19/pin5 > $D/pin5.log 2>&1
for f in $R/host-s19/*/sweep_T.csv; do echo "== $f"; python3 -c "
import pandas as pd; d=pd.read_csv('$f'); print(d[['provider','timer','T','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','health','host_launch_us','host_op_us','host_autograd_us','host_cpus']].to_string())"; done
cd /tmp/r5 && tar -czf $OUT/r5.tgz .
