#!/bin/bash
# session 20, call 2: the G=32 (and G=16) depth part of the dq pass: config variants interleaved
# against the default (fwd+bwd, graph and eager), kernel breakdowns at G=16, ncu of the dq pass
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r2/$G; D=$R/s20-g32; mkdir -p $D
M=launch__registers_per_thread,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,smsp__inst_executed.sum,gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,launch__occupancy_limit_registers,launch__shared_mem_per_block_dynamic
for s in "8 32" "32 8"; do
  set -- $s
  echo "=== ncu _dq_kernel Hk=$1 G=$2 L=64" >> $D/ncu_dq.log
  timeout 100 ncu --kernel-name regex:_dq_kernel --launch-skip 1 --launch-count 1 --metrics $M \
    python3 -c "
from moda_bench.timing import make_inputs
from moda_bench.ops.moda import moda_attention
x = make_inputs(1, 16384, $1 * $2, $1, 64, 64, seed=0)
for _ in range(2):
    moda_attention(x['q'], x['k'], x['v'], x['k_depth'], x['v_depth']).backward(x['do'])
" >> $D/ncu_dq.log 2>&1
done
grep -E "===|registers|local_op|inst_executed|duration|hmma|dram|occupancy|shared" $D/ncu_dq.log
V32="bwd_block_l=32;bwd_block_l=16;bwd_q_maxnreg=0;bwd_block_l=32,bwd_depth_stages=3;q_m=128,q_w=8,bwd_block_l=32;fwd_depth=tma,fwd_m=128,fwd_w=8,block_l=32;fwd_depth=tma,fwd_m=128,fwd_w=8,block_l=64;fwd_depth=tma,fwd_m=128,fwd_w=8,block_l=32,bwd_block_l=32"
timeout 330 python3 tools/host_probe.py --T 16384 --Hk 8 --G 32 --L 64 --variants "$V32" --max-time 2 > $D/variants_g32.log 2>&1
grep -E "fwd\+bwd|graph|eager|failed" $D/variants_g32.log
for L in 0 64; do echo "=== Hk=8 G=16 L=$L" >> $D/kernels_g16.log
  timeout 60 python3 tools/host_probe.py --T 16384 --Hk 8 --G 16 --L $L --kernels >> $D/kernels_g16.log 2>&1; done
grep -E "===|in all|_kv_kernel|_dq_kernel|fwd" $D/kernels_g16.log | cut -c1-100
cd /tmp/r2 && tar -czf $OUT/r2.tgz .
