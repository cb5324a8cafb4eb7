#!/bin/bash
# second call on a warm H200: FA4's big library, then issue 20's rows (graph timer) and T=4096 both timers
set -uo pipefail
export PYTHONUNBUFFERED=1
R=/tmp/r9; mkdir -p $R/h200
RESULTS=$R GPU=h200 bash tools/device_session.sh fa4-big > $R/fa4-big.log 2>&1; tail -1 $R/fa4-big.log
export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
MB="python3 -m moda_bench.cli sweep --require fa4,moda-fused --providers moda-fused,moda-overlap,fa4,cudnn --max-time 2"
O=$R/h200/limit-s19; mkdir -p $O
$MB --timer graph --vary T --values 16384,32768,65536 --out $O/fwdbwd > $O/fwdbwd.log 2>&1; tail -1 $O/fwdbwd.log
$MB --timer graph --vary T --values 16384,32768,65536 --pass fwd --out $O/fwd > $O/fwd.log 2>&1; tail -1 $O/fwd.log
$MB --timer graph --vary T --values 16384,32768,65536 --depth-grad off --out $O/detached > $O/detached.log 2>&1; tail -1 $O/detached.log
$MB --timer graph,eager --vary T --values 4096 --out $O/t4096 > $O/t4096.log 2>&1; tail -1 $O/t4096.log
$MB --vary G --values 2 --out $O/g2 > $O/g2.log 2>&1; tail -1 $O/g2.log
$MB --vary L --values 256 --out $O/l256 > $O/l256.log 2>&1; tail -1 $O/l256.log
python3 - <<'PY'
import glob, pandas as pd
for f in sorted(glob.glob('/tmp/r9/h200/limit-s19/*/sweep_*.csv')):
    d = pd.read_csv(f)
    d = d[d.provider.isin(['moda-fused', 'moda-overlap'])]
    print(f.split('/')[-2], d[['provider', 'pass', 'timer', 'T', 'G', 'L', 'depth_grad', 'ratio_to_best', 'ratio_to_best_lo', 'ratio_to_best_hi', 'of_floor', 'health']].to_string(index=False))
PY
cd $R && tar -czf $OUT/r9.tgz .
