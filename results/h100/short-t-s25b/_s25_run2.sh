#!/bin/bash
# session 25, second call: ncu of the three passes with the backward on the calling thread (inside the NVTX range)
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r2; O=$R/$G/short-t-s25b; mkdir -p $O
timeout 240 ncu --clock-control none --nvtx --nvtx-include v0/ --nvtx-include v1/ --nvtx-include v2/ --import-source no \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SourceCounters --section InstructionStats \
  -f -o $O/t1024 python3 tools/_s25_ncu.py 1024 > $O/ncu.log 2>&1; echo "ncu rc=$?"; tail -3 $O/ncu.log
ncu -i $O/t1024.ncu-rep --page details --csv > $O/t1024_details.csv 2>/dev/null
ncu -i $O/t1024.ncu-rep --page source --csv --print-source sass > $O/t1024_sass.csv 2>/dev/null
gzip -f $O/t1024_details.csv $O/t1024_sass.csv; rm -f $O/t1024.ncu-rep
timeout 150 python3 tools/host_probe.py --T 1024 --pass fwd --max-time 2 --variants "depth_stages=3;block_l=64;block_l=16,depth_stages=3;num_stages=2" > $O/fwd_var.log 2>&1; tail -12 $O/fwd_var.log
cd $R && tar -czf $OUT/r2.tgz .
