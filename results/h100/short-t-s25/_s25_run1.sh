#!/bin/bash
# session 25, first call: where T=1024's time goes (issue 21's eager target). Kernel split, ncu of
# the three passes (default, detached depth, L=0 on the same folded kernels), the key-major pass
# beside the dq pass with the chunked grid.
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
NAME=$(python3 -c "import torch;print(torch.cuda.get_device_name())")
echo "GPU: $NAME"
case "$NAME" in *H200*) G=h200;; *) G=h100;; esac
R=/tmp/r1; O=$R/$G/short-t-s25; mkdir -p $O
timeout 60 python3 -m moda_bench.cli doctor > $O/doctor.log 2>&1; tail -3 $O/doctor.log
timeout 90 python3 tools/host_probe.py --kernels --T 1024 > $O/kernels.log 2>&1; grep -A12 -- "---" $O/kernels.log | head -40
timeout 240 ncu --clock-control none --nvtx --nvtx-include v0/ --nvtx-include v1/ --nvtx-include v2/ --import-source no \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SourceCounters --section InstructionStats \
  -f -o $O/t1024 python3 tools/_s25_ncu.py 1024 > $O/ncu.log 2>&1; echo "ncu rc=$?"; tail -3 $O/ncu.log
ncu -i $O/t1024.ncu-rep --page details --csv > $O/t1024_details.csv 2>/dev/null
ncu -i $O/t1024.ncu-rep --page source --csv --print-source sass > $O/t1024_sass.csv 2>/dev/null
gzip -f $O/t1024_details.csv $O/t1024_sass.csv; rm -f $O/t1024.ncu-rep
timeout 150 python3 tools/host_probe.py --T 1024 --max-time 2 --variants "beside=1;beside=1,chunk=0;q_s=2" > $O/beside.log 2>&1; tail -12 $O/beside.log
cd $R && tar -czf $OUT/r1.tgz .
