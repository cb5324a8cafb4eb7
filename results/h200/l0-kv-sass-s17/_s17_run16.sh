#!/bin/bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=/tmp/r16/h100; D=$R/l0-kv-sass-s17; mkdir -p $D
ncu --version | tail -1 > $D/ncu_version.txt
# the L=0 key-major pass at T=16384 (second call's launch): per-SASS-instruction stall samples
timeout 400 ncu --clock-control none -k regex:_kv_kernel --launch-skip 1 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section Occupancy --section LaunchStats \
  -o $D/kv_l0_16k python3 tools/_s17_l0_once.py > $D/ncu.log 2>&1; tail -3 $D/ncu.log
timeout 120 ncu --import $D/kv_l0_16k.ncu-rep --page source --csv --print-source sass > $D/kv_l0_16k_sass.csv 2> $D/sass.err; wc -l $D/kv_l0_16k_sass.csv; head -c 600 $D/sass.err
timeout 60 ncu --import $D/kv_l0_16k.ncu-rep --page details --csv > $D/kv_l0_16k_details.csv 2>/dev/null; wc -l $D/kv_l0_16k_details.csv
gzip -9 $D/kv_l0_16k_sass.csv $D/kv_l0_16k_details.csv; ls -la $D
cd /tmp/r16 && tar -czf $OUT/r16.tgz .
