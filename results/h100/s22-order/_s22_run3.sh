#!/bin/bash
# session 22, third call: the key-major pass's step and grid orders (kv_order), fwd+bwd and the
# backward alone against the default (second call's probe kept the
# autograd graph of its gradient check alive, so the graph capture failed)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r3/$G; mkdir -p $R/s22-order
MB="python3 -m moda_bench.cli"
$MB doctor > $R/s22-order/doctor.log 2>&1; tail -1 $R/s22-order/doctor.log
timeout 400 python3 tools/_s22_order.py "16384,8,0;16384,8,64;4096,8,64;32768,8,64" 2 > $R/s22-order/order.log 2>&1; grep -v "^\s*$" $R/s22-order/order.log | tail -40
cd /tmp/r3 && tar -czf $OUT/r3.tgz .
