#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MB="python3 -m moda_bench.cli"
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r6/$G; mkdir -p $R/s18-probes
$MB doctor > $R/s18-probes/doctor.log 2>&1; tail -1 $R/s18-probes/doctor.log
show() { python3 -c "
import pandas as pd,glob
for f in sorted(glob.glob('$1/sweep_*.csv')):
    d=pd.read_csv(f); c=[x for x in ['provider','pass','timer','T','L','median_ms','tflops','ratio_to_fa2','ratio_to_fa2_lo','ratio_to_fa2_hi','of_floor','health'] if x in d]
    print(d[c].to_string())"; }
timeout 150 $MB sweep --vary T --values 1024,2048,4096 --timer graph,eager --providers moda,fa2 --max-time 2 --out $R/short-t-s18b > $R/short-t-s18b.log 2>&1; show $R/short-t-s18b
timeout 80 $MB sweep --vary T --values 16384 --L 0 --pass bwd --providers fa2-triton,fa2,cudnn --max-time 3 --out $R/l0-bwd-s18 > $R/l0-bwd-s18.log 2>&1; show $R/l0-bwd-s18
timeout 80 $MB sweep --vary T --values 16384 --L 0 --pass fwd --providers fa2-triton,fa2,cudnn --max-time 3 --out $R/l0-fwd-s18 > $R/l0-fwd-s18.log 2>&1; show $R/l0-fwd-s18
timeout 150 python3 tools/_s18_ab3.py > $R/s18-probes/ab3.log 2>&1; cat $R/s18-probes/ab3.log
for gl in "8 64" "2 64" "8 0"; do set -- $gl
  timeout 70 python3 tools/host_probe.py --T 8192 --G $1 --L $2 --variants 'bwd_kv_maxnreg=0' --max-time 2 > $R/s18-probes/t8192_G$1_L$2.log 2>&1; tail -n 6 $R/s18-probes/t8192_G$1_L$2.log
done
cd /tmp/r6 && tar -czf $OUT/r6.tgz .
