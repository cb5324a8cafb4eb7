#!/bin/bash
# session 28, first call: the cached merge/delta/depth launches (commits 5654155, 6bb6da0) checked
# bitwise against Triton's own launches on the GPU, moda's gradients through them, the host timeline
# and launch_pieces of the eager T=1024 call, and moda vs FA2 at T=1024 (graph, eager)
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r1; H=$R/$G/host-s28; K=$R/$G/tests-s28; mkdir -p $H $K
MB="python3 -m moda_bench.cli"
timeout 60 $MB doctor > $H/doctor.log 2>&1; echo "doctor rc=$?"; tail -5 $H/doctor.log
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_launch.py tests/test_dattn_launch.py \
  tests/test_merge.py > $K/launch_tests.log 2>&1; echo "launch-tests rc=$?"; tail -15 $K/launch_tests.log
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_depth_grad.py -k "moda_attention and not fa4" \
  > $K/grad_tests.log 2>&1; echo "grad-tests rc=$?"; tail -3 $K/grad_tests.log
timeout 90 $MB sweep --vary T --values 1024 --timer graph,eager --providers moda,fa2 --max-time 1.5 --out $H/short-t \
  > $H/short-t.log 2>&1; echo "sweep rc=$?"
timeout 60 python3 tools/host_timeline.py --T 1024 --calls 300 > $H/timeline_1024.log 2>&1; echo "timeline rc=$?"
cat $H/timeline_1024.log
timeout 120 python3 tools/launch_pieces.py --T 1024 --n 2000 > $H/launch_pieces.log 2>&1; echo "pieces rc=$?"
cat $H/launch_pieces.log
python3 - $H <<'PY'
import sys, glob, pandas as pd
for f in glob.glob(f"{sys.argv[1]}/short-t/*.csv"):
    d = pd.read_csv(f)
    for _, r in d.iterrows():
        print(f"{r.timer:6s} {r.provider:5s} {1e3*r.median_ms:7.1f} us  x fa2 {r.ratio_to_fa2:.3f} "
              f"[{r.ratio_to_fa2_lo:.3f}-{r.ratio_to_fa2_hi:.3f}] {r.health}")
PY
cd $R && tar -czf $OUT/r1.tgz .
