#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r7/$G; mkdir -p $R
if [ $G = h200 ]; then RESULTS=/tmp/r7 GPU=$G bash tools/device_session.sh fa4-small fa4-part1 > $R/fa4.log 2>&1; tail -2 $R/fa4.log; cd /tmp/r7 && tar -czf $OUT/r7.tgz .; exit 0; fi
timeout 500 $MB sweep --preset paper --providers moda,fa2 --max-time 2 --out $R/paper-moda-s19 > $R/paper-moda-s19.log 2>&1; tail -3 $R/paper-moda-s19.log
python3 -c "
import pandas as pd, glob
for f in sorted(glob.glob('$R/paper-moda-s19/*.csv')):
    d = pd.read_csv(f); d = d[d.provider == 'moda']
    print(f.split('/')[-1], d[['T','G','L','median_ms','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','health','host_autograd_us']].to_string(index=False))"
cd /tmp/r7 && tar -czf $OUT/r7.tgz .
