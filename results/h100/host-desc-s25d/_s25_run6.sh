#!/bin/bash
# session 25, sixth call: host cost with the kept tensor maps, GPU tests (host vs device-side
# descriptors bitwise on CUDA; cached launches; decode's descriptor tiles), issue 21's T=1024 / 2048 rows
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r6; O=$R/$G/host-desc-s25d; mkdir -p $O
timeout 60 python3 tools/_s25_hostcost.py 1024,8,64 > $O/hostcost.log 2>&1; grep "host us\|maps" $O/hostcost.log | cut -c1-120
timeout 120 python3 -m moda_bench.cli sweep --vary T --values 1024,2048 --timer graph,eager --providers moda,fa2 --max-time 2 --pin-cpu 3 --out $O/short-t > $O/short-t.log 2>&1; tail -3 $O/short-t.log
timeout 280 python3 -m pytest -q -p no:cacheprovider tests/test_descriptors.py > $O/tests_desc.log 2>&1; echo "tests rc=$?"; tail -1 $O/tests_desc.log
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_launch.py tests/test_decode.py -k "launch or tma or cached" > $O/tests_gpu.log 2>&1; echo "tests rc=$?"; tail -1 $O/tests_gpu.log
cd $R && tar -czf $OUT/r6.tgz .
