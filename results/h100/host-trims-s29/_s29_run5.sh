#!/bin/bash
# session 29, fifth call: the GPU tests call 4 left out after the last change (test_moda, test_moda_tma,
# test_decode), and the default sweep at T = 1024, 2048, 4096 (graph, eager) on the final code
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r5; H=$R/$G/host-s29e; K=$R/$G/tests-s29e; mkdir -p $H $K
MB="python3 -m moda_bench.cli"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_moda.py tests/test_moda_tma.py tests/test_decode.py \
  > $K/gpu_tests.log 2>&1; echo "gpu-tests rc=$?"; tail -4 $K/gpu_tests.log
timeout 200 $MB sweep --vary T --values 1024,2048,4096 --timer graph,eager --providers moda,fa2 --max-time 1.5 \
  --out $H/short-t > $H/short-t.log 2>&1; echo "sweep rc=$?"
python3 - $H <<'PY'
import sys, glob, pandas as pd
for f in glob.glob(f"{sys.argv[1]}/short-t/*.csv"):
    d = pd.read_csv(f)
    for _, r in d.iterrows():
        print(f"T={r.T:5d} {r.timer:6s} {r.provider:5s} {1e3*r.median_ms:7.1f} us  x fa2 {r.ratio_to_fa2:.3f} "
              f"[{r.ratio_to_fa2_lo:.3f}-{r.ratio_to_fa2_hi:.3f}] {r.health}")
PY
cd $R && tar -czf $OUT/r5.tgz .
