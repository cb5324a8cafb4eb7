#!/usr/bin/env bash
# First GPU call: environment, GPU correctness tests, kernel timing probe.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
export PYTHONPATH=$PWD
python3 -c "import flash_attn" 2>&1 | tail -1
timeout 200 python3 -m pytest tests/test_moda.py -m gpu -q -s -x 2>&1 | tee $OUT/gpu_tests.log | grep -E "rel errors|passed|failed|Error" 
timeout 330 python3 scripts/kernel_probe.py --T 4096,16384 --out $OUT/probe.csv 2>&1 | tee $OUT/probe.log
