#!/bin/bash
# session 26, first call: what GPUs came? On H200s: FA4's first half, the H200 GPU tests and
# issue 21's H200 rows (GPU 0), the tuner on issue 21's rows (GPU 1). On H100s: the GPU tests of
# 4ea8a33 and the dq pass's registers and tiles at T <= 4096 (issue 21's short rows).
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
nvidia-smi -L
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
NG=$(python3 -c "import torch;print(torch.cuda.device_count())")
echo "GPU: $NAME x $NG"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r1; mkdir -p $R/$G
MB="python3 -m moda_bench.cli"
G1=0; [ "$NG" -ge 2 ] && G1=1
lane0_h200() {
  RESULTS=$R GPU=$G bash tools/device_session.sh fa4-small fa4-part1 doctor
  O=$R/$G/tests-s26; mkdir -p $O
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_descriptors.py tests/test_launch.py \
      tests/test_moda_bwd_tma.py tests/test_moda_bwd_heads.py > $O/tests_tma.log 2>&1; echo "tests_tma rc=$?"; tail -1 $O/tests_tma.log
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_depth_grad.py -k "moda_attention" > $O/tests_grad.log 2>&1
  echo "tests_grad rc=$?"; tail -1 $O/tests_grad.log
  O=$R/$G/paper-moda-s26; mkdir -p $O
  timeout 300 $MB sweep --preset paper --providers moda,fa2 --max-time 1.5 --out $O > $O/sweep.log 2>&1; echo "paper rc=$?"
}
lane1_h200() {
  export CUDA_VISIBLE_DEVICES=$G1
  T=$R/$G/tuning-s26; mkdir -p $T
  TUNE="$MB tune --kernels fwd_depth,bwd_depth,fwd,bwd_q,bwd_kv --budget 6 --min-gain 3% --cache $T/tuning.json"
  timeout 170 $TUNE --vary T --values 4096 --out $T/tune_T.csv > $T/tune_T.log 2>&1; echo "tune T rc=$?"
  timeout 170 $TUNE --vary G --values 2 --out $T/tune_G.csv > $T/tune_G.log 2>&1; echo "tune G rc=$?"
  timeout 170 $TUNE --vary L --values 256 --out $T/tune_L.csv > $T/tune_L.log 2>&1; echo "tune L rc=$?"
  for f in $T/tune_*.log; do grep -a "stored\|kept\|found nothing\|best" $f | tail -2 | cut -c1-220; done
}
lane0_h100() {
  O=$R/$G/tests-s26; mkdir -p $O
  $MB doctor > $O/doctor.log 2>&1; tail -3 $O/doctor.log
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_descriptors.py tests/test_launch.py \
      tests/test_moda_bwd_tma.py tests/test_moda_bwd_heads.py > $O/tests_tma.log 2>&1; echo "tests_tma rc=$?"; tail -1 $O/tests_tma.log
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_depth_grad.py -k "moda_attention" > $O/tests_grad.log 2>&1
  echo "tests_grad rc=$?"; tail -1 $O/tests_grad.log
}
lane1_h100() {
  export CUDA_VISIBLE_DEVICES=$G1
  O=$R/$G/dq-regs-s26; mkdir -p $O
  for t in 1024 4096; do
    timeout 200 python3 tools/host_probe.py --T $t --variants "bwd_q_maxnreg=168;bwd_q_maxnreg=200;q_n=32;q_s=2;q_m=32" \
        --max-time 2 > $O/variants_T$t.log 2>&1; echo "variants T=$t rc=$?"; tail -8 $O/variants_T$t.log
  done
}
if [ $G = h200 ]; then lane1_h200 > $R/lane1.log 2>&1 & P1=$!; lane0_h200; wait $P1; cat $R/lane1.log
else
  if [ "$NG" -ge 2 ]; then lane1_h100 > $R/lane1.log 2>&1 & P1=$!; lane0_h100; wait $P1; cat $R/lane1.log
  else lane0_h100; lane1_h100; fi
fi
cd $R && tar -czf $OUT/r1.tgz .
