#!/bin/bash
# session 28, third call (the second's machine): FA4's libraries joined; moda-fa4 and moda-overlap through
# the cached merge/delta/depth launches (commits 5654155, 6bb6da0) against the reference and bitwise run to
# run; moda vs FA2 at T=1024 with the one-launch rule on (KV_ONE_MAX_T=2048) and off, alternated in separate
# processes; moda-fa4/moda-overlap vs FA4 at T=4096 from the code before the cached launches (3fbbd6b,
# tools/_s28_old) and now, alternated
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r3; K=$R/$G/tests-s28; O=$R/$G/one-launch-s28; F=$R/$G/fa4-launch-s28; mkdir -p $K $O $F
RESULTS=$R GPU=$G bash tools/device_session.sh fa4-big 2>&1 | tail -2
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_depth_grad.py tests/test_merge.py tests/test_launch.py \
  -k "fa4 or FA4 or merge or cached" > $K/fa4_tests.log 2>&1; echo "fa4-tests rc=$?"; tail -3 $K/fa4_tests.log
ONE="import sys, runpy, moda_bench.ops.moda.kernel_bwd_rules as r; r.KV_ONE_MAX_T = 2048; sys.argv[0] = 'moda-bench'; runpy.run_module('moda_bench.cli', run_name='__main__')"
for rep in 1 2; do
  timeout 80 python3 -m moda_bench.cli sweep --vary T --values 1024 --timer graph,eager --providers moda,fa2 --max-time 1.5 \
    --out $O/two$rep > $O/two$rep.log 2>&1; echo "two$rep rc=$?"
  timeout 80 python3 -c "$ONE" sweep --vary T --values 1024 --timer graph,eager --providers moda,fa2 --max-time 1.5 \
    --out $O/one$rep > $O/one$rep.log 2>&1; echo "one$rep rc=$?"
done
for rep in 1 2; do
  (cd tools/_s28_old && PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages timeout 110 python3 -m moda_bench.cli \
    sweep --vary T --values 4096 --timer graph,eager --providers moda-fa4,moda-overlap,fa4 --max-time 1.5 --require fa4 \
    --out $F/old$rep > $F/old$rep.log 2>&1); echo "old$rep rc=$?"
  timeout 110 python3 -m moda_bench.cli sweep --vary T --values 4096 --timer graph,eager --providers moda-fa4,moda-overlap,fa4 \
    --max-time 1.5 --require fa4 --out $F/new$rep > $F/new$rep.log 2>&1; echo "new$rep rc=$?"
done
python3 - $O $F <<'PY'
import sys, glob, os, pandas as pd
for d in sys.argv[1:]:
    for f in sorted(glob.glob(f"{d}/*/*.csv")):
        run = os.path.basename(os.path.dirname(f))
        x = pd.read_csv(f)
        col = "ratio_to_fa2" if "fa2" in set(x.provider) else "ratio_to_best"
        for _, r in x.iterrows():
            print(f"{run:5s} {r.timer:6s} {r.provider:13s} {1e3*r.median_ms:8.1f} us  {col[9:]} {r[col]:.3f} "
                  f"[{r[col + '_lo']:.3f}-{r[col + '_hi']:.3f}] {r.health}")
PY
cd $R && tar -czf $OUT/r3.tgz .
