#!/bin/bash
# session 20, call 9 (diagnosis for the next session): ncu of the descriptor forward at G=32 against the
# same FLOPs folded as (Hk=32, G=8), L=0 and 64; the G=32 dq pass at its new 32-column default;
# GPU us per kernel of a T=1024 fwd+bwd
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
D=/tmp/r9/$G/s20-diag; mkdir -p $D
M=launch__registers_per_thread,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,smsp__inst_executed.sum,gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,launch__occupancy_limit_registers,launch__shared_mem_per_block_dynamic
run() {  # Hk G L kernel-regex fwd-tma(0/1)
  echo "=== ncu $4 Hk=$1 G=$2 L=$3 tma_fwd=$5" >> $D/ncu.log
  timeout 90 ncu --kernel-name regex:$4 --launch-skip 1 --launch-count 1 --metrics $M python3 -c "
from moda_bench.timing import make_inputs
from moda_bench.ops.moda import moda_attention
from moda_bench.ops.moda.config import resolve_config
from moda_bench.ops.moda.validate import check_inputs
x = make_inputs(1, 16384, $1 * $2, $1, 64, $3, seed=0)
a = (x['q'], x['k'], x['v'], x['k_depth'], x['v_depth'])
cfg = resolve_config(check_inputs(*a), x['q'].dtype)
if $5:
    cfg = cfg.replace(fwd_depth='tma', block_m=128, num_warps=8, num_stages=3, block_l=32)
for _ in range(2):
    moda_attention(*a, config=cfg).backward(x['do'])
" >> $D/ncu.log 2>&1
}
run 8 32 0 moda_fwd_tma_kernel 1
run 32 8 0 moda_fwd_tma_kernel 1
run 8 32 64 moda_fwd_tma_kernel 1
run 32 8 64 moda_fwd_tma_kernel 1
run 8 32 64 _dq_kernel 0
grep -E "===|registers|local_op|inst_executed|duration|hmma|occupancy|shared" $D/ncu.log
timeout 60 python3 tools/host_probe.py --T 1024 --kernels > $D/kernels_t1024.log 2>&1; grep -E "us" $D/kernels_t1024.log | cut -c1-110
cd /tmp/r9 && tar -czf $OUT/r9.tgz .
