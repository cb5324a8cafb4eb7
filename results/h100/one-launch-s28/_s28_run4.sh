#!/bin/bash
# session 28, fourth call: the chunked key-major pass's depth items with host descriptors (the allocator fix)
# and the one launch's tests again; the one launch's grid orders and chunking against the two launches and
# FA2, interleaved in one process, at T=1024 (G=8 L=64, G=1, L=0) and T=2048
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r4; K=$R/$G/tests-s28; O=$R/$G/one-launch-s28; mkdir -p $K $O
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_moda_bwd_one.py tests/test_moda_bwd_chunks.py \
  > $K/one_tests2.log 2>&1; echo "tests rc=$?"; tail -2 $K/one_tests2.log
for pt in "1024 8 64" "2048 8 64" "1024 1 64" "1024 8 0"; do set -- $pt
  timeout 100 python3 tools/_s28_one_ab.py --T $1 --G $2 --L $3 --max-time 2 > $O/ab_T$1_G$2_L$3.log 2>&1
  echo "rc=$?"; cat $O/ab_T$1_G$2_L$3.log | grep -v "^\s*$"
done
cd $R && tar -czf $OUT/r4.tgz .
