#!/bin/bash
# session 25, fourth call: where host-side descriptors lose at T=16384 (per pass), the crossover
# in T, their host cost, and the kernels' registers and spills either way
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r4; O=$R/$G/host-desc-s25b; mkdir -p $O
timeout 150 python3 tools/_s25_hostcost.py 1024,8,64 16384,8,64 16384,2,64 16384,8,0 > $O/hostcost.log 2>&1; cat $O/hostcost.log | cut -c1-250
for spec in "16384 8 64 fwd" "16384 8 64 bwd" "16384 2 64 fwd" "16384 2 64 bwd" "8192 8 64 fwdbwd" "16384 8 0 fwd"; do
  set -- $spec
  echo "== T=$1 G=$2 L=$3 pass=$4" | tee -a $O/desc_ab.log
  timeout 90 python3 tools/host_probe.py --desc --T $1 --G $2 --L $3 --pass $4 --max-time 2 >> $O/desc_ab.log 2>&1
  grep "eager\|graph" $O/desc_ab.log | tail -2
done
cd $R && tar -czf $OUT/r4.tgz .
