#!/bin/bash
# session 29, fourth call: the third round of host trims (kept launches of the descriptor kernels find their
# tensor maps by pointers and build no descriptor objects) against a8c3803 in one process with FA2, the
# GPU tests of the paths they touch, the default sweep, and the A/B at L=0
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD:$PWD/.abold
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r4; H=$R/$G/host-s29d; K=$R/$G/tests-s29d; mkdir -p $H $K
MB="python3 -m moda_bench.cli"
timeout 60 $MB doctor > $H/doctor.log 2>&1; echo "doctor rc=$?"; tail -3 $H/doctor.log
timeout 100 python3 tools/host_ab.py --T 1024 --G 8 --L 64 --max-time 2 > $H/ab_T1024_G8_L64.log 2>&1
echo "ab rc=$?"; cat $H/ab_T1024_G8_L64.log
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_launch.py tests/test_moda_bwd_one.py \
  tests/test_moda_bwd_tma.py tests/test_moda_bwd_chunks.py tests/test_decode_fused.py tests/test_descriptors.py \
  tests/test_moda_bwd_heads.py tests/test_moda_bwd_sub.py > $K/gpu_tests.log 2>&1
echo "gpu-tests rc=$?"; tail -4 $K/gpu_tests.log
timeout 180 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_depth_grad.py -k "moda_attention and not fa4" \
  > $K/grad_tests.log 2>&1; echo "grad-tests rc=$?"; tail -2 $K/grad_tests.log
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
for pt in "--G 8 --L 0"; do
  f=$H/ab_T1024$(echo $pt | tr -d ' -' | sed 's/G/_G/;s/L/_L/').log
  timeout 80 python3 tools/host_ab.py --T 1024 $pt --max-time 1.5 > $f 2>&1; echo "ab $pt rc=$?"; head -1 $f; tail -7 $f
done
cd $R && tar -czf $OUT/r4.tgz .
