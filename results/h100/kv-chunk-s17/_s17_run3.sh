#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r3/$G; D=$R/kv-chunk-s17; mkdir -p $D
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_chunks.py tests/test_moda_bwd_tma.py tests/test_decode_fused.py -k "not fa4" > $D/tests_final.log 2>&1; tail -n 3 $D/tests_final.log
timeout 100 python3 tools/host_probe.py --T 1024 --kernels --calls 100 > $D/kernels_T1024_final.log 2>&1; grep -E "us  x|in all|---" $D/kernels_T1024_final.log | head -6
timeout 150 python3 tools/host_probe.py --T 1024 --variants "chunk=-1;chunk=0;chunk=0,beside=1" --max-time 4 > $D/ab3_T1024_G8_L64.log 2>&1; grep -E "graph|eager" $D/ab3_T1024_G8_L64.log
timeout 150 python3 tools/host_probe.py --T 1024 --L 256 --variants "chunk=0;chunk=0,beside=1" --max-time 3 > $D/ab3_T1024_G8_L256.log 2>&1; grep -E "graph|eager" $D/ab3_T1024_G8_L256.log
$MB sweep --vary T --values 1024,2048,4096 --timer graph,eager --providers moda,fa2 --max-time 3 --out $R/short-t-s17-final > $R/short-t-s17-final.log 2>&1
python3 -c "
import pandas as pd; d=pd.read_csv('$R/short-t-s17-final/sweep_T.csv'); print(d[['provider','timer','T','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','of_floor','max_rel_err','health']].to_string())"
$MB sweep --vary T --values 1024,2048 --L 0 --timer graph,eager --providers moda,fa2 --max-time 3 --out $R/short-t-l0-s17 > $R/short-t-l0-s17.log 2>&1
python3 -c "
import pandas as pd; d=pd.read_csv('$R/short-t-l0-s17/sweep_T.csv'); print(d[['provider','timer','T','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','max_rel_err','health']].to_string())"
cd /tmp/r3 && tar -czf $OUT/r3.tgz .
