#!/usr/bin/env bash
# The GPU check of `moda-bench model` (issue 59) for one device call (<= 6 minutes): the 1.5B
# configurations' training step, eager, every variant interleaved in one process, then the report.
#   - seed 002's 1.5B (dattn-1.5b) at 24 of its 48 layers, B=1, T=2048, fp16: vanilla, moda, moda
#     detached, depth-attention, denseformer, attnres, mhc, with the torch.profiler breakdown;
#   - our MoDA 1.5B (moda-1.5b) at 12 of its 36 layers, B=1, T=4096, bf16: vanilla, moda, moda detached.
# Results (model_*.csv, profile_*.csv, logs, REPORT/MODELS.md) go under $OUT (default /tmp/model-check).
# FlashAttention-4 is the vanilla attention where it imports (PYTHONPATH, or /tmp/fa4site from
# tools/device_session.sh's fa4 stages); else SDPA. From the repository root:
#   bash tools/model_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/model-check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -d /tmp/fa4site ] && export PYTHONPATH=$PYTHONPATH:/tmp/fa4site
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt" 2>&1
timeout 230 python3 -m moda_bench.cli model --model dattn-1.5b --layers 24 --batch 1 \
  --variants vanilla,moda,moda-detached,depth-attention,denseformer,attnres,mhc \
  --quick --max-time-s 40 --profile --out "$OUT" > "$OUT/dattn-1.5b.log" 2>&1
echo "dattn-1.5b rc=$?" >> "$OUT/rc.txt"
timeout 90 python3 -m moda_bench.cli model --model moda-1.5b --layers 12 --batch 1 \
  --variants vanilla,moda,moda-detached --quick --max-time-s 25 --out "$OUT" > "$OUT/moda-1.5b.log" 2>&1
echo "moda-1.5b rc=$?" >> "$OUT/rc.txt"
timeout 30 python3 -m moda_bench.cli report "$OUT" --out "$OUT/report" > "$OUT/report.log" 2>&1
echo "report rc=$?" >> "$OUT/rc.txt"
cat "$OUT/rc.txt"; tail -n 25 "$OUT/dattn-1.5b.log" "$OUT/moda-1.5b.log"
