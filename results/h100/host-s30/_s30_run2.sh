#!/bin/bash
# session 30, second call (asked for the H200 kind; exits at once on an H100): FA4's small wheels and first part staged for call 2;
# on an H200, issue 21's last row (T=1024 eager, sweep and in-process A/B against a8c3803 with FA2), the
# paper preset moda vs FA2 on today's kernels, and moda_attention's GPU gradient tests; on an H100, the
# T=1024 row and the launch tests of b7197e6 only
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD:$PWD/.abold
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME $(date -u +%T)"
case "$NAME" in *H200*) G=h200;; *) echo "not an H200: nothing to do"; exit 0;; esac
R=/tmp/r2; mkdir -p $R/$G
MB="python3 -m moda_bench.cli"
st() { local n=$1 t=$2; shift 2; echo "=== $n $(date -u +%T)"; timeout $t "$@" > $R/$G/$n.log 2>&1; echo "=== $n rc=$? $(date -u +%T)"; grep -a "x fa2\|passed\|failed\|health (end)\|new/old" $R/$G/$n.log | tail -4 | cut -c1-220; }
RESULTS=$R GPU=$G bash tools/device_session.sh fa4-small fa4-part1 > $R/fa4.log 2>&1; echo "fa4 staged rc=$?"
st doctor 60 $MB doctor
st short-t 100 $MB sweep --vary T --values 1024 --timer graph,eager --providers moda,fa2 --max-time 2 --out $R/$G/short-t-s30
python3 - $R/$G/short-t-s30 <<'PY'
import sys, glob, pandas as pd
for f in glob.glob(f"{sys.argv[1]}/*.csv"):
    for _, r in pd.read_csv(f).iterrows():
        print(f"{r['timer']:6s} {r['provider']:5s} {1e3*r['median_ms']:7.1f} us  x fa2 {r['ratio_to_fa2']:.3f} "
              f"[{r['ratio_to_fa2_lo']:.3f}-{r['ratio_to_fa2_hi']:.3f}] {r['health']}")
PY
st ab 100 python3 tools/host_ab.py --T 1024 --G 8 --L 64 --max-time 2
grep -a "ratio\|x fa2\|new/old" $R/$G/ab.log | tail -8
if [ $G = h200 ]; then
  st tests-launch 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_launch.py tests/test_moda_bwd_one.py tests/test_descriptors.py
  st tests-grad 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_depth_grad.py -k "moda_attention and not fa4"
  st paper-moda 200 $MB sweep --preset paper --providers moda,fa2 --max-time 1.5 --out $R/$G/paper-moda-s30
else
  st tests-launch 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_launch.py tests/test_moda_bwd_one.py tests/test_descriptors.py
fi
cd $R && tar -czf $OUT/r2.tgz $G
