#!/bin/bash
# session 27, third call: the launch path's two host cuts (tensor arguments of kept launches as integer
# addresses; the side stream's events kept) -- GPU tests of the cached launches and the tma backward,
# the host timeline with integer pointers on and off, then moda vs FA2 at T=1024 with the session's start
# code (tools/_s27_old) and today's, alternated A B A B; then the tuner's other three rows on this GPU
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r3; H=$R/$G/host-cuts-s27; T=$R/$G/tuning-s27; mkdir -p $H $T
MB="python3 -m moda_bench.cli"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_launch.py tests/test_dattn_launch.py \
  tests/test_moda_bwd_tma.py tests/test_descriptors.py > $H/tests_gpu.log 2>&1; echo "tests rc=$?"; tail -2 $H/tests_gpu.log
timeout 60 python3 tools/host_timeline.py --T 1024 --calls 300 > $H/timeline_1024.log 2>&1; echo "timeline rc=$?"; cat $H/timeline_1024.log
SW="sweep --vary T --values 1024 --timer graph,eager --providers moda,fa2 --max-time 1.5"
for i in 1 2; do
  (cd tools/_s27_old && PYTHONPATH=$PWD timeout 90 python3 -m moda_bench.cli $SW --out $H/old$i > $H/old$i.log 2>&1); echo "old$i rc=$?"
  timeout 90 $MB $SW --out $H/new$i > $H/new$i.log 2>&1; echo "new$i rc=$?"
done
python3 - $H <<'PY'
import sys, glob, pandas as pd
for run in ("old1", "new1", "old2", "new2"):
    for f in glob.glob(f"{sys.argv[1]}/{run}/*.csv"):
        d = pd.read_csv(f)
        for _, r in d[d.provider == "moda"].iterrows():
            print(f"{run} {r.timer:6s} moda {1e3*r.median_ms:7.1f} us  x fa2 {r.ratio_to_fa2:.3f} "
                  f"[{r.ratio_to_fa2_lo:.3f}-{r.ratio_to_fa2_hi:.3f}] {r.health}")
PY
if [ $G = h200 ]; then ROWS="L 128;G 16;T 32768"; cp tools/_s27_tuning.json $T/tuning.json
else ROWS="T 4096;G 2;L 256"; cp tools/_s27_tuning_h100.json $T/tuning.json; fi
TUNE="$MB tune --kernels fwd_depth,bwd_depth,fwd,bwd_q,bwd_kv --budget 6 --min-gain 3% --cache $T/tuning.json"
IFS=';' read -ra RR <<< "$ROWS"
for a in "${RR[@]}"; do set -- $a
  echo "=== tune $1=$2 $(date -u +%T)"; timeout 100 $TUNE --vary $1 --values $2 --out $T/tune3_$1.csv > $T/tune3_$1.log 2>&1
  echo "rc=$?"; grep -a "wall time" $T/tune3_$1.log | tail -1
done
$MB tune --cache $T/tuning.json --export-shipped $T/shipped > $T/export.log 2>&1; echo "export rc=$?"; tail -3 $T/export.log
cd $R && tar -czf $OUT/r3.tgz .
