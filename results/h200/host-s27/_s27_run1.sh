#!/bin/bash
# session 27, first call: where an eager fwd+bwd's host time goes at T=1024 (Python share on this host,
# each piece alone, CUDA API calls a call, GPU kernels), moda vs FA2 at T=1024 (graph, eager), the
# backward's side stream and chunks; then the tuner (kept defaults now confirmed against the closest
# candidate) on issue 21's rows T=4096, G=2, L=256 with a fresh cache
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"; nproc; lscpu | grep -i "model name" | head -1
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r1; H=$R/$G/host-s27; T=$R/$G/tuning-s27; mkdir -p $H $T
MB="python3 -m moda_bench.cli"
timeout 60 $MB doctor > $H/doctor.log 2>&1; echo "doctor rc=$?"; grep -a "canary\|TFLOP\|GB/s" $H/doctor.log | head -3
timeout 60 python3 tools/host_python_probe.py --calls 300 --top 30 > $H/python_share.log 2>&1; echo "py rc=$?"; head -3 $H/python_share.log
timeout 120 python3 tools/host_probe.py --phases --T 1024 --calls 200 > $H/phases.log 2>&1; echo "phases rc=$?"; cat $H/phases.log
timeout 90 python3 tools/host_probe.py --api --T 1024 --top 30 > $H/api.log 2>&1; echo "api rc=$?"; cat $H/api.log | cut -c1-140
timeout 60 python3 tools/host_probe.py --kernels --T 1024 > $H/kernels.log 2>&1; echo "kernels rc=$?"; cat $H/kernels.log | cut -c1-140
timeout 90 python3 tools/host_probe.py --engine --T 1024 --calls 300 > $H/engine.log 2>&1; echo "engine rc=$?"; cat $H/engine.log
timeout 100 $MB sweep --vary T --values 1024 --timer graph,eager --providers moda,fa2 --max-time 1.5 --out $H/short-t > $H/short_t.log 2>&1
echo "sweep rc=$?"; grep -a "moda\|fa2" $H/short_t.log | tail -6 | cut -c1-200
timeout 120 python3 tools/host_probe.py --T 1024 --variants 'beside=0;chunk=0;beside=0,chunk=0' --max-time 1.5 > $H/variants.log 2>&1
echo "variants rc=$?"; cat $H/variants.log | cut -c1-160
TUNE="$MB tune --kernels fwd_depth,bwd_depth,fwd,bwd_q,bwd_kv --budget 6 --min-gain 3% --cache $T/tuning.json"
for a in "T 4096" "G 2" "L 256"; do set -- $a
  echo "=== tune $1=$2 $(date -u +%T)"; timeout 100 $TUNE --vary $1 --values $2 --out $T/tune_$1.csv > $T/tune_$1.log 2>&1
  echo "rc=$?"; grep -a "kept\|closest\|wall time\|winner\|default" $T/tune_$1.log | tail -4 | cut -c1-240
done
cd $R && tar -czf $OUT/r1.tgz .
