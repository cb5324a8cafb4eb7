#!/usr/bin/env bash
# First GPU call: environment, GPU correctness tests, kernel timing probe.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
export PYTHONPATH=$PWD
python3 -c "import flash_attn" 2>&1 | tail -1
timeout 330 python3 scripts/kernel_probe.py --T 16384 --variants default,dense,bl32,ds2,f128w8,f128w4,f64s3,bq128,kv128,kv128w4 --out $OUT/probe.csv 2>&1 | tee $OUT/probe.log
