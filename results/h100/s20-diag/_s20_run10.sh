#!/bin/bash
# session 20, call 10: the G=32 descriptor forward with its registers capped (probe), and ncu of it
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
D=/tmp/r10/$G/s20-diag; mkdir -p $D
timeout 300 python3 tools/_s20_fwdreg.py > $D/fwdreg.log 2>&1; grep -v Warn $D/fwdreg.log | tail -6
M=launch__registers_per_thread,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,gpu__time_duration.sum,launch__occupancy_limit_registers
timeout 60 ncu --kernel-name regex:moda_fwd_tma_kernel --launch-skip 0 --launch-count 1 --metrics $M python3 -c "
from moda_bench.timing import make_inputs
from moda_bench.ops.moda.kernel_fwd_tma import moda_fwd_tma
x = make_inputs(1, 16384, 256, 8, 64, 0, seed=0, requires_grad=False)
moda_fwd_tma(x['q'], x['k'], x['v'], None, None, 0.125, 32, block_m=128, num_warps=8, block_l=32, maxnreg=128)
" > $D/ncu_fwd_r128.log 2>&1; grep -E "registers|local_op|duration|occupancy" $D/ncu_fwd_r128.log
cd /tmp/r10 && tar -czf $OUT/r10.tgz .
