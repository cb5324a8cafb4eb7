#!/bin/bash
# session 31, call 1 (asked for the H200 kind; exits at once on an H100): issue 21's last row on an
# H200 (T=1024 eager: sweep and in-process A/B against a8c3803 with FA2), the paper preset moda vs FA2, and
# moda_attention's gradient tests
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD:$PWD/.abold
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME $(date -u +%T)"
case "$NAME" in *H200*) G=h200;; *)
  if [ "${H100_TESTS:-0}" = 1 ]; then mkdir -p $OUT/h100; timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_launch.py tests/test_moda_tma.py tests/test_descriptors.py > $OUT/h100/tests-8ee3d54.log 2>&1
    echo "h100 tests rc=$?"; tail -2 $OUT/h100/tests-8ee3d54.log; fi
  echo "not an H200: nothing else to do"; exit 0;; esac
R=/tmp/r10; mkdir -p $R/$G
MB="python3 -m moda_bench.cli"
st() { local n=$1 t=$2; shift 2; echo "=== $n $(date -u +%T)"; timeout $t "$@" > $R/$G/$n.log 2>&1; echo "=== $n rc=$? $(date -u +%T)"; grep -a "passed\|failed\|health (end)" $R/$G/$n.log | tail -3 | cut -c1-220; }
rows() { python3 - "$@" <<'PY'
import sys, glob, pandas as pd
for f in sorted(glob.glob(f"{sys.argv[1]}/**/*.csv", recursive=True)):
    for _, r in pd.read_csv(f).iterrows():
        print(f"{r['timer']:6s} T={r['T']:<6d} G={r['G']:<3d} L={r['L']:<4d} {r['provider']:5s} {r['median_ms']:8.3f} ms "
              f"x fa2 {r['ratio_to_fa2']:.3f} [{r['ratio_to_fa2_lo']:.3f}-{r['ratio_to_fa2_hi']:.3f}] {r['health']}")
PY
}
st doctor 60 $MB doctor
st short-t 100 $MB sweep --vary T --values 1024 --timer graph,eager --providers moda,fa2 --max-time 2 --out $R/$G/short-t-s30
rows $R/$G/short-t-s30
st ab 100 python3 tools/host_ab.py --T 1024 --G 8 --L 64 --max-time 2
grep -a "x fa2\|x old" $R/$G/ab.log | tail -8
st paper-moda 200 $MB sweep --preset paper --providers moda,fa2 --max-time 1.5 --out $R/$G/paper-moda-s30
rows $R/$G/paper-moda-s30 | grep moda
st tests-grad 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_depth_grad.py -k "moda_attention and not fa4"
cd $R && tar -czf $OUT/r10.tgz $G
