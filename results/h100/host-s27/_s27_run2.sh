#!/bin/bash
# session 27, second call: the stamp-by-stamp host timeline of an eager fwd+bwd at T=1024 and 2048
# (tools/host_timeline.py), then the tuner on the other three paper rows it looks at (L=128, G=16,
# T=32768), the six rows' cache exported
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r2; H=$R/$G/host-s27; T=$R/$G/tuning-s27; mkdir -p $H $T
MB="python3 -m moda_bench.cli"
for t in 1024 2048; do
  timeout 60 python3 tools/host_timeline.py --T $t --calls 300 > $H/timeline_$t.log 2>&1; echo "timeline rc=$?"; cat $H/timeline_$t.log
done
[ -f tools/_s27_tuning.json ] && cp tools/_s27_tuning.json $T/tuning.json
TUNE="$MB tune --kernels fwd_depth,bwd_depth,fwd,bwd_q,bwd_kv --budget 6 --min-gain 3% --cache $T/tuning.json"
for a in "L 128" "G 16" "T 32768"; do set -- $a
  echo "=== tune $1=$2 $(date -u +%T)"; timeout 100 $TUNE --vary $1 --values $2 --out $T/tune2_$1.csv > $T/tune2_$1.log 2>&1
  echo "rc=$?"; grep -a "wall time" $T/tune2_$1.log | tail -1
done
cd $R && tar -czf $OUT/r2.tgz .
