#!/bin/bash
# session 26, fifth call (H200): the tuner on issue 21's rows (T=4096, G=2, L=256), then the export of
# the shipped file for this GPU (winners only)
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r5; T=$R/$G/tuning-s26; mkdir -p $T
MB="python3 -m moda_bench.cli"
TUNE="$MB tune --kernels fwd_depth,bwd_depth,fwd,bwd_q,bwd_kv --budget 6 --min-gain 3% --cache $T/tuning.json"
for a in "T 4096" "G 2" "L 256"; do set -- $a
  echo "=== tune $1=$2 $(date -u +%T)"; timeout 175 $TUNE --vary $1 --values $2 --out $T/tune_$1.csv > $T/tune_$1.log 2>&1
  echo "rc=$?"; grep -a "stored\|kept\|found nothing\|best\|winner" $T/tune_$1.log | tail -3 | cut -c1-220
done
$MB tune --cache $T/tuning.json --export-shipped moda_bench/ops/moda/tuned > $T/export.log 2>&1; echo "export rc=$?"; tail -3 $T/export.log
cp moda_bench/ops/moda/tuned/*.json $T/ 2>/dev/null; ls $T
cd $R && tar -czf $OUT/r5.tgz .
