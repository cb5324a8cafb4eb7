#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r11/$G; D=$R/s17-final; mkdir -p $D
$MB doctor > $D/doctor.log 2>&1; tail -1 $D/doctor.log
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_chunks.py tests/test_moda_bwd_tma.py tests/test_decode_fused.py -k "not fa4" > $D/tests_bwd.log 2>&1; tail -n 1 $D/tests_bwd.log
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_moda_tma.py tests/test_depth_grad.py -k "not fa4" > $D/tests_moda_tma.log 2>&1; tail -n 1 $D/tests_moda_tma.log
timeout 120 python3 tools/bwd_tma_check.py > $D/bwd_tma_check.log 2>&1; tail -n 1 $D/bwd_tma_check.log
$MB sweep --vary T --values 1024,2048,4096,8192 --timer graph,eager --providers moda,fa2 --max-time 3 --out $R/short-t-s17 > $R/short-t-s17.log 2>&1
python3 -c "
import pandas as pd; d=pd.read_csv('$R/short-t-s17/sweep_T.csv'); print(d[['provider','timer','T','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','of_floor','max_rel_err','health']].to_string())"
$MB sweep --vary T --values 1024,2048 --L 0 --timer graph,eager --providers moda,fa2 --max-time 3 --out $R/short-t-l0-s17 > $R/short-t-l0-s17.log 2>&1
python3 -c "
import pandas as pd; d=pd.read_csv('$R/short-t-l0-s17/sweep_T.csv'); print(d[['provider','timer','T','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','max_rel_err','health']].to_string())"
timeout 100 python3 tools/host_probe.py --T 1024 --kernels --calls 100 > $D/kernels_T1024.log 2>&1; grep -E "us  x|in all|---" $D/kernels_T1024.log | head -5
cd /tmp/r11 && tar -czf $OUT/r11.tgz .
