#!/bin/bash
# session 22, second call: the key-major pass's step and grid orders (kv_order), fwd+bwd and the
# backward alone against the default; exp_poly's GPU gradients (test fixed to fit memory)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r2/$G; mkdir -p $R/s22-order $R/s22-poly
MB="python3 -m moda_bench.cli"
$MB doctor > $R/s22-order/doctor.log 2>&1; tail -1 $R/s22-order/doctor.log
timeout 400 python3 tools/_s22_order.py "16384,8,0;16384,8,64;4096,8,64;32768,8,64" 2 > $R/s22-order/order.log 2>&1; grep -v "^\s*$" $R/s22-order/order.log | tail -40
timeout 120 python3 -m pytest -q tests/test_exp_poly.py -m gpu > $R/s22-poly/tests_gpu2.log 2>&1; tail -2 $R/s22-poly/tests_gpu2.log
cd /tmp/r2 && tar -czf $OUT/r2.tgz .
