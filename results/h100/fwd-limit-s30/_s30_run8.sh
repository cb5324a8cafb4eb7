#!/bin/bash
# session 30, eighth call (right after the seventh, on its machine): on an H200, the sixth call's program
# (_s30_run6.sh); on an H100, FA4's big libraries, then issue 20's forward rows on today's code: in one
# process (graph timer) the fused forward beside its "nomath" probe (the depth bytes streamed, no depth math),
# moda-fa4, moda-overlap and FA4 at T=16K and 32K; then the provider sweep of the forward rows (max-time 4)
set -uo pipefail
export PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME $(date -u +%T)"
case "$NAME" in *H200*) exec bash tools/_s30_run6.sh;; esac
G=h100; R=/tmp/r8; mkdir -p $R/$G
RESULTS=$R GPU=$G bash tools/device_session.sh fa4-big; tail -2 $R/fa4-big.log
export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
O=$R/$G/fwd-limit-s30; mkdir -p $O
echo "=== probes $(date -u +%T)"
timeout 200 python3 tools/fused_sm90_check.py --T 16384,32768 --timer graph --max-time 2 \
  --variants "32x1:spread;32x1:spread:0:nomath" --out $O/fused_sm90.csv > $O/probes.log 2>&1; echo "probes rc=$?"
grep -a " fwd \|# T=" $O/probes.log | tail -14 | cut -c1-200
echo "=== sweep $(date -u +%T)"
timeout 170 python3 -m moda_bench.cli sweep --require fa4,moda-fused --max-time 4 --providers moda-fused,moda-overlap,fa4 \
  --vary T --values 16384,32768 --pass fwd --out $O/fwd > $O/fwd.log 2>&1; echo "fwd rc=$?"
python3 - $O <<'PY'
import sys, glob, pandas as pd
for f in sorted(glob.glob(f"{sys.argv[1]}/*/*.csv")):
    d = pd.read_csv(f)
    for _, r in d[d.provider.str.startswith("moda")].iterrows():
        print(f"{r['pass']:6s} T={r['T']} {r.provider:12s} x best {r.ratio_to_best:.3f} "
              f"[{r.ratio_to_best_lo:.3f}-{r.ratio_to_best_hi:.3f}] of_floor {r.of_floor:.3f} {r.health}")
PY
cd $R && tar -czf $OUT/r8.tgz --exclude='*.whl' $G
