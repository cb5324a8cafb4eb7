# session 15, start 6: ncu of the paired and unpaired steps; the 16K rows with long graph runs
export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
R=/tmp/r6/$G; mkdir -p $R/fused-s15-sass $R/fused-s15-long
MB="python3 -m moda_bench.cli"
RESULTS=$R/fused-s15-sass GPU=$G FUSED_T=16384 FUSED_NCU_VARIANTS='32x1:spread;32x1:spread:0:unpaired' \
   bash tools/device_session.sh fused-sass 2>&1 | grep "rc=" 
timeout 150 $MB sweep --require fa4,moda-fused --max-time 10 --timer graph --vary T --values 16384 --providers moda-fused,fa4 --out $R/fused-s15-long/fwdbwd > $R/fused-s15-long/fwdbwd.log 2>&1
timeout 100 $MB sweep --require fa4,moda-fused --max-time 8 --timer graph --depth-grad off --vary T --values 16384 --providers moda-fused,fa4 --out $R/fused-s15-long/detached > $R/fused-s15-long/detached.log 2>&1
timeout 100 $MB sweep --require fa4,moda-fused --max-time 6 --timer graph --pass fwd --vary T --values 16384,32768 --providers moda-fused,fa4 --out $R/fused-s15-long/fwd > $R/fused-s15-long/fwd.log 2>&1
for f in $R/fused-s15-long/*/sweep_T.csv; do python3 -c "import pandas as pd; d=pd.read_csv('$f'); d=d[d.provider=='moda-fused']; print('$f'.split('/')[-2], [(r['pass'], r['T'], round(r.ratio_to_best,3), round(r.ratio_to_best_lo,3), round(r.ratio_to_best_hi,3), r.samples, round(r.noise_pct,1)) for _,r in d.iterrows()])"; done
cd /tmp/r6 && tar -czf $OUT/f.tgz .
