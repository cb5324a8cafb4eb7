#!/bin/bash
# session 30, fifth call (asked for the H200 kind). On an H200: FA4's small wheels and first part staged,
# issue 21's last row (T=1024 eager: sweep and in-process A/B against a8c3803 with FA2), the paper preset
# moda vs FA2 on today's kernels, moda_attention's gradients on the GPU. On an H100: issue 21's H100 rows on
# today's kernels: the paper preset moda vs FA2 and the L=0 path's forward and backward at T=16384
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD:$PWD/.abold
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME $(date -u +%T)"
case "$NAME" in *H200*) G=h200;; *) echo "not an H200: nothing to do"; exit 0;; esac
R=/tmp/r5; mkdir -p $R/$G
MB="python3 -m moda_bench.cli"
st() { local n=$1 t=$2; shift 2; echo "=== $n $(date -u +%T)"; timeout $t "$@" > $R/$G/$n.log 2>&1; echo "=== $n rc=$? $(date -u +%T)"; grep -a "x fa2\|passed\|failed\|health (end)\|new/old" $R/$G/$n.log | tail -4 | cut -c1-220; }
rows() { python3 - "$@" <<'PY'
import sys, glob, pandas as pd
for f in sorted(glob.glob(f"{sys.argv[1]}/**/*.csv", recursive=True)):
    for _, r in pd.read_csv(f).iterrows():
        print(f"{r['timer']:6s} {r['pass']:6s} T={r['T']:<6d} G={r['G']:<3d} L={r['L']:<4d} {r['provider']:10s} "
              f"{r['median_ms']:8.3f} ms {r.get('tflops', float('nan')):6.1f} TF/s x fa2 {r['ratio_to_fa2']:.3f} "
              f"[{r['ratio_to_fa2_lo']:.3f}-{r['ratio_to_fa2_hi']:.3f}] {r['health']}")
PY
}
st doctor 60 $MB doctor
if [ $G = h200 ]; then
  RESULTS=$R GPU=$G bash tools/device_session.sh fa4-small fa4-part1 > $R/fa4.log 2>&1; echo "fa4 staged rc=$?"
  st short-t 100 $MB sweep --vary T --values 1024 --timer graph,eager --providers moda,fa2 --max-time 2 --out $R/$G/short-t-s30
  rows $R/$G/short-t-s30
  st ab 100 python3 tools/host_ab.py --T 1024 --G 8 --L 64 --max-time 2
  grep -a "x fa2" $R/$G/ab.log | tail -6
  st tests-grad 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_depth_grad.py -k "moda_attention and not fa4"
else
  st l0-fwd 60 $MB sweep --vary T --values 16384 --L 0 --pass fwd --providers fa2-triton,cudnn,fa2 --max-time 2 --out $R/$G/l0-s30/fwd
  st l0-bwd 60 $MB sweep --vary T --values 16384 --L 0 --pass bwd --providers fa2-triton,cudnn,fa2 --max-time 2 --out $R/$G/l0-s30/bwd
  rows $R/$G/l0-s30
fi
st paper-moda 220 $MB sweep --preset paper --providers moda,fa2 --max-time 1.5 --out $R/$G/paper-moda-s30
rows $R/$G/paper-moda-s30
cd $R && tar -czf $OUT/r5.tgz $G
