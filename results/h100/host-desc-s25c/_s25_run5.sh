#!/bin/bash
# session 25, fifth call (b0be268): GPU tests of the descriptor kernels with host-side descriptors
# (test_descriptors on CUDA: host vs device-side bitwise), issue 21's T=1024 / 2048 rows, the
# backward rule's boundary (T=8192), host costs
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r5; O=$R/$G/host-desc-s25c; mkdir -p $O
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_descriptors.py > $O/tests_desc.log 2>&1; echo "tests rc=$?"; tail -1 $O/tests_desc.log
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_moda_tma.py tests/test_moda_bwd_tma.py tests/test_moda_bwd_heads.py tests/test_launch.py > $O/tests_gpu.log 2>&1; echo "tests rc=$?"; tail -1 $O/tests_gpu.log
timeout 120 python3 -m moda_bench.cli sweep --vary T --values 1024,2048 --timer graph,eager --providers moda,fa2 --max-time 2 --pin-cpu 3 --out $O/short-t > $O/short-t.log 2>&1; tail -12 $O/short-t.log
for spec in "8192 8 64 bwd" "8192 2 64 fwdbwd"; do
  set -- $spec
  echo "== T=$1 G=$2 L=$3 pass=$4" | tee -a $O/desc_ab.log
  timeout 90 python3 tools/host_probe.py --desc --T $1 --G $2 --L $3 --pass $4 --max-time 2 >> $O/desc_ab.log 2>&1
  grep "eager\|graph" $O/desc_ab.log | tail -2
done
timeout 60 python3 tools/_s25_hostcost.py 1024,8,64 > $O/hostcost.log 2>&1; head -4 $O/hostcost.log | cut -c1-200
cd $R && tar -czf $OUT/r5.tgz .
