# session 15, start 5 (no FA4): the launch cache on the GPU, A/B of host time and T=1024
export PYTHONPATH=$PWD
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
R=/tmp/r5/$G/launch-cache-s15; mkdir -p $R
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_triton_launch.py tests/test_moda_tma.py > $R/tests.log 2>&1; tail -2 $R/tests.log
for c in 1 0; do
  MODA_BENCH_NO_LAUNCH_CACHE=$c timeout 100 python3 tools/host_probe.py --T 1024 --calls 300 --top 30 > $R/host_nocache$c.log 2>&1; head -2 $R/host_nocache$c.log
done
i=0; for c in 1 0 1 0; do i=$((i+1)); O=$R/t1024_run${i}_nocache$c
  MODA_BENCH_NO_LAUNCH_CACHE=$c timeout 100 python3 -m moda_bench.cli sweep --max-time 2 --timer graph,eager --vary T --values 1024 --providers moda,fa2 --out $O > $O.log 2>&1
  python3 -c "import pandas as pd; d=pd.read_csv('$O/sweep_T.csv'); d=d[d.provider=='moda']; print('run $i nocache=$c', [(r.timer, round(r.ratio_to_fa2,3), round(r.ratio_to_fa2_lo,3), round(r.ratio_to_fa2_hi,3)) for _,r in d.iterrows()])"
done
cd /tmp/r5 && tar -czf $OUT/e.tgz .
