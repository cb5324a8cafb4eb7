#!/bin/bash
# session 22, ninth call: the descriptor forward in 64-row 4-warp programs against the default's
# 128-row 8-warp ones, fwd+bwd at the 11 paper rows, T=1024 and 2048, L=0, and the forward alone
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r9/$G/s22-fwd64; mkdir -p $R
python3 -m moda_bench.cli doctor > $R/doctor.log 2>&1; tail -1 $R/doctor.log
P="16384,8,64;4096,8,64;8192,8,64;32768,8,64;65536,8,64;16384,2,64;16384,4,64;16384,16,64;16384,8,128;16384,8,256;16384,8,0;1024,8,64;2048,8,64"
P="$P;16384,2,64,fwd;16384,16,64,fwd;16384,8,256,fwd;65536,8,64,fwd"
timeout 420 python3 tools/_s22_fwd64.py "$P" 2 > $R/fwd64.log 2>&1; grep "T=" $R/fwd64.log
cd /tmp/r9 && tar -czf $OUT/r9.tgz .
