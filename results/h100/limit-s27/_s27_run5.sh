#!/bin/bash
# session 27, fifth call (after the fourth's fa4-small fa4-part1 on the same machine): FA4's big libraries,
# then issue 20's rows that the last H200 runs could not settle, with twice the rounds (max-time 4):
# fwd+bwd and forward at T=16K/32K, and L=256, moda-fused beside moda-overlap and FA4
set -uo pipefail
export PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r5; mkdir -p $R
RESULTS=$R GPU=$G bash tools/device_session.sh fa4-big; tail -2 $R/fa4-big.log
export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
MB="python3 -m moda_bench.cli"; O=$R/$G/limit-s27; P=moda-fused,moda-overlap,fa4
Q="--require fa4,moda-fused --max-time 4 --providers $P"
timeout 200 $MB sweep $Q --vary T --values 16384,32768 --out $O/fwdbwd > $O.fwdbwd.log 2>&1; echo "fwdbwd rc=$?"
timeout 150 $MB sweep $Q --vary T --values 16384,32768 --pass fwd --out $O/fwd > $O.fwd.log 2>&1; echo "fwd rc=$?"
timeout 120 $MB sweep $Q --vary L --values 256 --out $O/l256 > $O.l256.log 2>&1; echo "l256 rc=$?"
mv $O.*.log $O/ 2>/dev/null
python3 - $O <<'PY'
import sys, glob, pandas as pd
for f in sorted(glob.glob(f"{sys.argv[1]}/*/*.csv")):
    d = pd.read_csv(f)
    for _, r in d[d.provider.str.startswith("moda")].iterrows():
        print(f"{f.split('/')[-2]:7s} {r['pass']:6s} T={r['T']} L={r['L']} {r.provider:12s} x best {r.ratio_to_best:.3f} "
              f"[{r.ratio_to_best_lo:.3f}-{r.ratio_to_best_hi:.3f}] of_floor {r.of_floor:.3f} {r.health}")
PY
cd $R && tar -czf $OUT/r5.tgz --exclude='*.whl' $G
