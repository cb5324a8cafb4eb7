#!/bin/bash
# session 25, eleventh call: GPU tests on the final commit (50f6fdc)
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r11; O=$R/$G/host-desc-s25g; mkdir -p $O
timeout 170 python3 -m pytest -q -p no:cacheprovider -rf --tb=line tests/test_descriptors.py > $O/tests_desc.log 2>&1; echo "desc rc=$?"; tail -1 $O/tests_desc.log
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rf --tb=line tests/test_depth_grad.py -k "moda_attention" > $O/tests_depth_grad.log 2>&1; echo "depth_grad rc=$?"; tail -1 $O/tests_depth_grad.log
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rf --tb=line tests/test_moda_bwd_tma.py tests/test_moda_bwd_heads.py tests/test_launch.py > $O/tests_tma.log 2>&1; echo "tma rc=$?"; tail -1 $O/tests_tma.log
cd $R && tar -czf $OUT/r11.tgz .
