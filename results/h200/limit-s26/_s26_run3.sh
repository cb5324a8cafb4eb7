#!/bin/bash
# session 26, third call (FA4 joined). On an H200: issue 20's rows (fused-sweep-a, -b). On an H100:
# the "late" probe of moda-fused's warp steps (correctness, forward / FA4 at 16K-64K).
set -uo pipefail
export PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"; ls /tmp/fa4site >/dev/null 2>&1 || echo "NO FA4 SMALL WHEELS (fresh machine)"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r3; mkdir -p $R/$G
RESULTS=$R GPU=$G bash tools/device_session.sh fa4-big
export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
if [ $G = h200 ]; then
  RESULTS=$R GPU=$G MAX_TIME=2 FUSED_RUN=limit-s26 timeout 560 bash tools/device_session.sh fused-sweep-a fused-sweep-b
else
  O=$R/$G/fused-late-s26; mkdir -p $O
  timeout 200 python3 tools/fused_sm90_check.py --check --placements "spread,spread:late" --out $O/check.csv > $O/check.log 2>&1
  echo "check rc=$?"; grep -c ": ok" $O/check.log; grep -a "WRONG\|FAILED\|ROUTE" $O/check.log | head
  timeout 330 python3 tools/fused_sm90_check.py --T 16384,32768,65536 --timer graph --max-time 3 \
      --variants "32x1:spread;32x1:spread:0:late;16x2:spread:0:late;16x2:spread" --out $O/time.csv > $O/time.log 2>&1
  echo "time rc=$?"; grep -a "fwd \|rounds" $O/time.log
fi
cd $R && tar -czf $OUT/r3.tgz .
