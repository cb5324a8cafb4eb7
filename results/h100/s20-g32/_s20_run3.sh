#!/bin/bash
# session 20, call 3: the backward's depth columns per step (bwd_block_l) at G=32 / 16 / 8 and T=4096,
# the G=32 descriptor forward, ncu of the G=32 dq pass at 16 columns
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r3/$G; D=$R/s20-g32; mkdir -p $D
P="python3 tools/host_probe.py --max-time 2"
V="bwd_block_l=16;bwd_block_l=16,bwd_depth_stages=3;bwd_block_l=16,bwd_depth_stages=1;bwd_block_l=16,bwd_q_maxnreg=0;bwd_block_l=32,bwd_depth_stages=3;fwd_depth=tma,fwd_m=128,fwd_w=8,block_l=16,bwd_block_l=16;fwd_depth=tma,fwd_m=64,fwd_w=4,block_l=16,bwd_block_l=16"
timeout 200 $P --T 16384 --Hk 8 --G 32 --L 64 --variants "$V" > $D/variants_g32_b.log 2>&1; grep -E "graph|eager|failed" $D/variants_g32_b.log
timeout 60 $P --T 16384 --Hk 8 --G 32 --L 0 --variants "fwd_depth=tma,fwd_m=128,fwd_w=8;fwd_depth=tma,fwd_m=64,fwd_w=4" > $D/variants_g32_l0.log 2>&1; grep -E "graph|eager|failed" $D/variants_g32_l0.log
timeout 60 $P --T 16384 --Hk 8 --G 16 --L 64 --variants "bwd_block_l=16" > $D/variants_g16.log 2>&1; grep -E "graph|eager|failed" $D/variants_g16.log
timeout 60 $P --T 16384 --Hk 8 --G 8 --L 64 --variants "bwd_block_l=16" > $D/variants_g8.log 2>&1; grep -E "graph|eager|failed" $D/variants_g8.log
timeout 60 $P --T 4096 --Hk 8 --G 32 --L 64 --variants "bwd_block_l=16;bwd_block_l=32" > $D/variants_g32_t4096.log 2>&1; grep -E "graph|eager|failed" $D/variants_g32_t4096.log
M=launch__registers_per_thread,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
echo "=== ncu _dq_kernel Hk=8 G=32 L=64 bwd_block_l=16" >> $D/ncu_dq16.log
timeout 60 ncu --kernel-name regex:_dq_kernel --launch-skip 1 --launch-count 1 --metrics $M python3 -c "
from moda_bench.timing import make_inputs
from moda_bench.ops.moda import moda_attention
from moda_bench.ops.moda.config import resolve_config
from moda_bench.ops.moda.validate import check_inputs
x = make_inputs(1, 16384, 256, 8, 64, 64, seed=0)
a = (x['q'], x['k'], x['v'], x['k_depth'], x['v_depth'])
cfg = resolve_config(check_inputs(*a), x['q'].dtype).replace(bwd_block_l=16)
for _ in range(2):
    moda_attention(*a, config=cfg).backward(x['do'])
" >> $D/ncu_dq16.log 2>&1
grep -E "===|registers|local_op|duration|hmma" $D/ncu_dq16.log
cd /tmp/r3 && tar -czf $OUT/r3.tgz .
