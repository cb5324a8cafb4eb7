#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r11/$G; mkdir -p $R/s16-final2
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_tma.py -k "not fa4" > $R/s16-final2/tests_bwd_tma.log 2>&1; tail -n 2 $R/s16-final2/tests_bwd_tma.log
timeout 100 python3 tools/bwd_tma_check.py > $R/s16-final2/bwd_tma_check.log 2>&1; tail -n 1 $R/s16-final2/bwd_tma_check.log
$MB sweep --preset paper --providers moda,fa2 --max-time 3 --out $R/paper-moda-s16 > $R/paper-moda-s16.log 2>&1
python3 -c "
import pandas as pd; d=pd.read_csv('$R/paper-moda-s16/'+'sweep_T.csv')" 2>/dev/null
for f in $R/paper-moda-s16/*.csv; do python3 -c "
import pandas as pd; d=pd.read_csv('$f'); d=d[d.provider=='moda']; print(d[['sweep','T','G','L','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','health']].to_string(header=False))"; done
if [ $G = h200 ]; then
  $MB sweep --vary T --values 16384 --L 0 --pass bwd --providers fa2-triton,fa2,cudnn --max-time 3 --out $R/l0-bwd-s16 2>&1 | tail -6
  $MB sweep --vary T --values 1024 --timer graph,eager --providers moda,fa2 --max-time 2 --out $R/t1024-s16 2>&1 | tail -6
fi
cd /tmp/r11 && tar -czf $OUT/r11.tgz .
