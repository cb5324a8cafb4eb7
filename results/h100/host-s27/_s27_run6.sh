#!/bin/bash
# session 27, sixth call (the fifth's machine): the tuner on T=4096, G=2, L=256 into this GPU's session
# cache (the other three rows ran in the second call), the export; moda vs FA2 at T=1024 (graph, eager) and
# the host timeline of its eager call on this host
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200; C=tools/_s27_tuning.json;; *) G=h100; C=tools/_s27_tuning_h100.json;; esac
R=/tmp/r6; H=$R/$G/host-s27b; T=$R/$G/tuning-s27; mkdir -p $H $T; cp $C $T/tuning.json
MB="python3 -m moda_bench.cli"
TUNE="$MB tune --kernels fwd_depth,bwd_depth,fwd,bwd_q,bwd_kv --budget 6 --min-gain 3% --cache $T/tuning.json"
for a in "T 4096" "G 2" "L 256"; do set -- $a
  echo "=== tune $1=$2 $(date -u +%T)"; timeout 100 $TUNE --vary $1 --values $2 --out $T/tune6_$1.csv > $T/tune6_$1.log 2>&1
  echo "rc=$?"; grep -a "wall time" $T/tune6_$1.log | tail -1
done
$MB tune --cache $T/tuning.json --export-shipped $T/shipped > $T/export.log 2>&1; echo "export rc=$?"; tail -2 $T/export.log
timeout 90 $MB sweep --vary T --values 1024 --timer graph,eager --providers moda,fa2 --max-time 1.5 --out $H/short-t > $H/short-t.log 2>&1
echo "sweep rc=$?"
timeout 60 python3 tools/host_timeline.py --T 1024 --calls 300 --threads-off > $H/timeline_1024.log 2>&1; echo "timeline rc=$?"; cat $H/timeline_1024.log
python3 - $H <<'PY'
import sys, glob, pandas as pd
for f in glob.glob(f"{sys.argv[1]}/short-t/*.csv"):
    d = pd.read_csv(f)
    for _, r in d.iterrows():
        print(f"{r.timer:6s} {r.provider:5s} {1e3*r.median_ms:7.1f} us  x fa2 {r.ratio_to_fa2:.3f} "
              f"[{r.ratio_to_fa2_lo:.3f}-{r.ratio_to_fa2_hi:.3f}] {r.health}")
PY
cd $R && tar -czf $OUT/r6.tgz .
