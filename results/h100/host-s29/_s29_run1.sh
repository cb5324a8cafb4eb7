#!/bin/bash
# session 29, first call: the one-launch backward (default in eager at T <= 1024, L > 0) checked on
# the GPU (tests, including test_launch's cached-launch counts), the default sweep at T=1024, and
# where the eager call's host time goes now (timeline, API calls and torch ops, cProfile), moda and FA2
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r1; H=$R/$G/host-s29; K=$R/$G/tests-s29; mkdir -p $H $K
MB="python3 -m moda_bench.cli"
timeout 60 $MB doctor > $H/doctor.log 2>&1; echo "doctor rc=$?"; tail -5 $H/doctor.log
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_launch.py tests/test_moda_bwd_one.py \
  tests/test_moda_bwd_tma.py tests/test_moda_bwd_chunks.py > $K/bwd_tests.log 2>&1; echo "bwd-tests rc=$?"
tail -15 $K/bwd_tests.log
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_depth_grad.py -k "moda_attention and not fa4" \
  > $K/grad_tests.log 2>&1; echo "grad-tests rc=$?"; tail -3 $K/grad_tests.log
timeout 90 $MB sweep --vary T --values 1024 --timer graph,eager --providers moda,fa2 --max-time 1.5 --out $H/short-t \
  > $H/short-t.log 2>&1; echo "sweep rc=$?"
python3 - $H <<'PY'
import sys, glob, pandas as pd
for f in glob.glob(f"{sys.argv[1]}/short-t/*.csv"):
    d = pd.read_csv(f)
    for _, r in d.iterrows():
        print(f"{r.timer:6s} {r.provider:5s} {1e3*r.median_ms:7.1f} us  x fa2 {r.ratio_to_fa2:.3f} "
              f"[{r.ratio_to_fa2_lo:.3f}-{r.ratio_to_fa2_hi:.3f}] {r.health}")
PY
timeout 90 python3 tools/host_timeline.py --T 1024 --calls 300 --threads-off > $H/timeline_1024.log 2>&1
echo "timeline rc=$?"; cat $H/timeline_1024.log
timeout 90 python3 tools/host_probe.py --T 1024 --api --top 30 > $H/api_1024.log 2>&1; echo "api rc=$?"
cat $H/api_1024.log
timeout 90 python3 tools/host_probe.py --T 1024 --engine > $H/engine_1024.log 2>&1; echo "engine rc=$?"
cat $H/engine_1024.log
timeout 120 python3 tools/host_probe.py --T 1024 --top 40 > $H/cprofile_1024.log 2>&1; echo "cprofile rc=$?"
head -60 $H/cprofile_1024.log
cd $R && tar -czf $OUT/r1.tgz .
