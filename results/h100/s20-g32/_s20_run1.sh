#!/bin/bash
# session 20, call 1: (H200 only) FA4's small wheels; the cached-launch GPU tests of ee06074; where
# the G=32 time goes: GPU us per kernel at (Hk, G) = (8, 32) against (32, 8) (same Hq, same FLOPs),
# and L2 behaviour of the key-major pass (ncu)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r1/$G; D=$R/s20-g32; mkdir -p $D
python3 -m moda_bench.cli doctor > $D/doctor.log 2>&1; tail -1 $D/doctor.log
if [ $G = h200 ]; then
  RESULTS=/tmp/r1 GPU=h200 bash tools/device_session.sh fa4-small fa4-part1 > /tmp/r1/fa4.log 2>&1; tail -2 /tmp/r1/fa4.log
fi
timeout 150 python3 -m pytest -q -rA -p no:cacheprovider tests/test_launch.py -m gpu > $D/tests_gpu_launch.log 2>&1; grep -E "PASSED|FAILED|passed|failed" $D/tests_gpu_launch.log | tail -6
for s in "8 32 0" "32 8 0" "8 32 64" "32 8 64" "8 8 0" "16 4 0" "8 8 64"; do
  set -- $s
  echo "=== Hk=$1 G=$2 L=$3" >> $D/kernels.log
  timeout 120 python3 tools/host_probe.py --T 16384 --Hk $1 --G $2 --L $3 --kernels >> $D/kernels.log 2>&1
done
grep -E "===|in all|_kv_kernel|_dq_kernel|fwd" $D/kernels.log | cut -c1-100
M=lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
for s in "8 32" "32 8" "8 8" "16 4"; do
  set -- $s
  echo "=== ncu _kv_kernel Hk=$1 G=$2 L=0" >> $D/ncu.log
  timeout 100 ncu --kernel-name regex:_kv_kernel --launch-skip 2 --launch-count 1 --metrics $M \
    python3 -c "
from moda_bench.timing import make_inputs
from moda_bench.ops.moda import moda_attention
x = make_inputs(1, 16384, $1 * $2, $1, 64, 0, seed=0)
for _ in range(3):
    moda_attention(x['q'], x['k'], x['v']).backward(x['do'])
" >> $D/ncu.log 2>&1
done
grep -E "===|hit_rate|dram__bytes|duration|hmma" $D/ncu.log
cd /tmp/r1 && tar -czf $OUT/r1.tgz .
