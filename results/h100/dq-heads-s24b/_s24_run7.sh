#!/bin/bash
# session 24, seventh call: the per-head dq pass's GPU tests alone (call 6's timed out inside the
# slower test_moda_bwd_tma), then where its rule should start: T = 512, 1024, G = 32, T = 32768, G = 2 / 16 short
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r7; O=$R/$G/dq-heads-s24b; mkdir -p $O
timeout 200 python3 -m pytest -q tests/test_moda_bwd_heads.py > $O/tests.log 2>&1; echo "tests rc=$?"; tail -2 $O/tests.log
for spec in "1024 8 35" "512 8 35" "16384 32 60" "4096 2 35" "2048 16 35" "32768 8 100"; do
  set -- $spec
  timeout $3 python3 tools/host_probe.py --T $1 --G $2 --L 0 --max-time 2 --variants "bwd_dq_heads=0;bwd_dq_heads=1" > $O/fwdbwd_T$1_G$2.log 2>&1
  echo "T=$1 G=$2"; grep -E "^  (graph|eager) bwd_dq" $O/fwdbwd_T$1_G$2.log
done
cd $R && tar -czf $OUT/r7.tgz .
