#!/bin/bash
# session 26, sixth call (H200, FA4 installed): GPU tests of moda_attention's gradients and moda-fused,
# then the tuner on three more paper rows (L=128, G=16, T=32768) and the export again
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r6; mkdir -p $R/$G/tests-s26
MB="python3 -m moda_bench.cli"
timeout 190 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_depth_grad.py -k "moda_attention" > $R/$G/tests-s26/tests_grad.log 2>&1
echo "grad rc=$?"; tail -1 $R/$G/tests-s26/tests_grad.log
timeout 140 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fused_sm90.py > $R/$G/tests-s26/tests_fused.log 2>&1
echo "fused rc=$?"; tail -1 $R/$G/tests-s26/tests_fused.log
T=$R/$G/tuning-s26; mkdir -p $T; cp /tmp/r5/$G/tuning-s26/tuning.json $T/ 2>/dev/null
TUNE="$MB tune --kernels fwd_depth,bwd_depth,fwd,bwd_q,bwd_kv --budget 6 --min-gain 3% --cache $T/tuning.json"
for a in "L 128" "G 16" "T 32768"; do set -- $a
  echo "=== tune $1=$2 $(date -u +%T)"; timeout 60 $TUNE --vary $1 --values $2 --out $T/tune2_$1.csv > $T/tune2_$1.log 2>&1
  echo "rc=$?"; grep -a "stored\|found nothing\|best" $T/tune2_$1.log | tail -2 | cut -c1-220
done
$MB tune --cache $T/tuning.json --export-shipped moda_bench/ops/moda/tuned > $T/export2.log 2>&1; echo "export rc=$?"; tail -2 $T/export2.log
cd $R && tar -czf $OUT/r6.tgz .
