#!/usr/bin/env bash
# GPU call (issue 8): correctness of every depth placement at realistic sizes, then the probe of
# placements / tile shapes vs FA2 and cuDNN in one process per shape family.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MODA_BENCH_NO_TUNING=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 200 python3 -m pytest -q -m gpu tests/test_moda.py -s 2>&1 | grep -E "rel errors|fused:|split:|overlap:|passed|failed|Error" | tail -20
P="python3 scripts/kernel_probe.py"
timeout ${PROBE_T_LIMIT:-330} $P --T ${PROBE_T:-4096,16384} --G 8 --L 64 --variants ${VARIANTS_T:-fused,split,overlap,splitovl,rev,dbm128,f128w8,kv128w8,q128w8} \
  --l0-variants default,rev,f128w8 --passes fwdbwd,fwd --out $OUT/r/probe3_T.csv > $OUT/r/probe3_T.log 2>&1
grep -E "^T=" $OUT/r/probe3_T.log
tar czf $OUT/results.tgz -C $OUT/r . && ls $OUT
