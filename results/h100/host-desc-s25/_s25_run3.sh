#!/bin/bash
# session 25, third call: host-side tensor descriptors. GPU tests of the descriptor kernels, then
# host vs device-side descriptors interleaved (fwd+bwd, graph and eager) at the rows that matter
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r3; O=$R/$G/host-desc-s25; mkdir -p $O
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_moda_tma.py tests/test_moda_bwd_tma.py tests/test_moda_bwd_heads.py tests/test_launch.py > $O/tests.log 2>&1; echo "tests rc=$?"; tail -2 $O/tests.log
timeout 60 python3 tools/host_probe.py --kernels --T 1024 > $O/kernels_t1024.log 2>&1; grep -A6 -- "--- moda" $O/kernels_t1024.log
for spec in "1024 8 64" "4096 8 64" "16384 8 64" "16384 8 0" "16384 2 64" "2048 8 64"; do
  set -- $spec
  echo "== T=$1 G=$2 L=$3" | tee -a $O/desc_ab.log
  timeout 90 python3 tools/host_probe.py --desc --T $1 --G $2 --L $3 --max-time 2 >> $O/desc_ab.log 2>&1
  tail -4 $O/desc_ab.log
done
cd $R && tar -czf $OUT/r3.tgz .
