#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r4/$G; D=$R/s19-launch; mkdir -p $D
$MB doctor > $D/doctor.log 2>&1; tail -1 $D/doctor.log
if [ $G = h200 ]; then RESULTS=/tmp/r4 GPU=$G bash tools/device_session.sh fa4-small fa4-part1 > $D/fa4.log 2>&1; tail -2 $D/fa4.log; fi
timeout 280 python3 -m pytest -q -p no:cacheprovider tests/test_launch.py tests/test_moda_bwd_chunks.py tests/test_moda_bwd_tma.py tests/test_moda_tma.py -k "not fa4" > $D/tests_gpu.log 2>&1; tail -n 3 $D/tests_gpu.log
for T in 1024 2048 4096; do echo "== T=$T"; timeout 90 python3 tools/host_probe.py --T $T --launch --max-time 2 2>&1 | grep -v Warn | tee $D/launch_T$T.log; done
timeout 150 $MB sweep --vary T --values 1024,2048,4096 --timer graph,eager --providers moda,fa2 --max-time 2 --out $R/short-t-s19 > $R/short-t-s19.log 2>&1
python3 -c "
import pandas as pd; d=pd.read_csv('$R/short-t-s19/sweep_T.csv'); print(d[['provider','timer','T','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','health']].to_string())"
cd /tmp/r4 && tar -czf $OUT/r4.tgz .
