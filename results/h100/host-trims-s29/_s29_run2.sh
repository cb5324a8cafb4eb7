#!/bin/bash
# session 29, second call: the eager call's host trims (route memo, the forward's descriptor check kept
# for the backward, the rows' statistics in per-stream scratch, lse an output only where asked, one
# stream-state read a backward, interned descriptor metadata keys) checked on the GPU and timed in one
# process against a8c3803's package (tools/host_ab.py) and FA2, at four points; the default sweep again
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD:$PWD/.abold
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r2; H=$R/$G/host-s29b; K=$R/$G/tests-s29b; mkdir -p $H $K
MB="python3 -m moda_bench.cli"
timeout 60 $MB doctor > $H/doctor.log 2>&1; echo "doctor rc=$?"; tail -3 $H/doctor.log
timeout 100 python3 tools/host_ab.py --T 1024 --G 8 --L 64 --max-time 2 > $H/ab_T1024_G8_L64.log 2>&1
echo "ab rc=$?"; cat $H/ab_T1024_G8_L64.log
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_launch.py tests/test_moda_bwd_one.py \
  tests/test_moda_bwd_tma.py tests/test_moda_bwd_chunks.py tests/test_moda.py tests/test_moda_tma.py \
  tests/test_decode_fused.py > $K/bwd_tests.log 2>&1; echo "bwd-tests rc=$?"; tail -4 $K/bwd_tests.log
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_depth_grad.py -k "moda_attention and not fa4" \
  > $K/grad_tests.log 2>&1; echo "grad-tests rc=$?"; tail -2 $K/grad_tests.log
for pt in "--G 1 --L 64" "--G 8 --L 256" "--G 16 --L 64"; do
  f=$H/ab_T1024$(echo $pt | tr -d ' -' | sed 's/G/_G/;s/L/_L/').log
  timeout 80 python3 tools/host_ab.py --T 1024 $pt --max-time 1.5 > $f 2>&1; echo "ab $pt rc=$?"; tail -7 $f
done
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
timeout 60 python3 tools/host_timeline.py --T 1024 --calls 300 > $H/timeline_1024.log 2>&1; echo "timeline rc=$?"
cat $H/timeline_1024.log
cd $R && tar -czf $OUT/r2.tgz .
