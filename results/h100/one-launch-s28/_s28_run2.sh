#!/bin/bash
# session 28, second call: FA4's small wheels and the first half of its libraries (for the next call);
# the one-launch backward (bwd_kv_beside=2, commit 3cf6da1) and the refactored dq pass checked on the
# GPU; one launch against the default, interleaved, graph and eager, at short T
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r2; K=$R/$G/tests-s28; O=$R/$G/one-launch-s28; mkdir -p $K $O
RESULTS=$R GPU=$G bash tools/device_session.sh fa4-small fa4-part1 2>&1 | tail -3
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_moda_bwd_one.py tests/test_moda_bwd_tma.py \
  tests/test_moda_bwd_chunks.py > $K/one_tests.log 2>&1; echo "one-tests rc=$?"; tail -3 $K/one_tests.log
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_depth_grad.py -k "moda_attention and not fa4" \
  > $K/grad_tests.log 2>&1; echo "grad-tests rc=$?"; tail -2 $K/grad_tests.log
for pt in "1024 8 64" "2048 8 64" "1024 1 64" "1024 16 64" "1024 8 256" "1024 8 0" "4096 8 64"; do set -- $pt
  timeout 90 python3 tools/host_probe.py --T $1 --G $2 --L $3 --variants 'beside=2' --max-time 2 \
    > $O/variants_T$1_G$2_L$3.log 2>&1; echo "T=$1 G=$2 L=$3 rc=$?"; grep -a -v "^\s*$" $O/variants_T$1_G$2_L$3.log | tail -8
done
cd $R && tar -czf $OUT/r2.tgz .
