#!/usr/bin/env bash
# The cumulative kernel ablation ladder on one GPU, for one device call of about 4 minutes:
# `moda-bench ablate` at the paper's shape (B=1, G=8, Hk=8, d=64, L=64, C=64, bf16, fwd+bwd) at
# T = 1024, 4096, 16384, then, where Nsight Compute (`ncu`) exists, DRAM bytes, L2 hit rate and
# achieved occupancy per Triton rung at each T (experiments/ladder_ncu.py; docs/ABLATION.md says
# what to read in them). Run from anywhere on the GPU machine:
#
#   OUT=/path/to/out bash tools/ladder_profile.sh        # e.g. the device tool's $OUT
#
# Writes $OUT/ablation/ablation.csv (+ .png, .svg), $OUT/ablate.log and, with ncu,
# $OUT/ncu/T<T>.ncu-rep (open in Nsight Compute), T<T>_raw.csv, T<T>_per_rung.csv, per_rung.csv.
# Each step is capped: ABLATE_TIMEOUT (default 170 s; each T's rows are saved as it ends) and
# NCU_TIMEOUT a T (default 25 s).
# TS (default 1024,4096,16384) picks the sequence lengths; METRICS overrides ncu's metric list.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the output folder}
TS=${TS:-1024,4096,16384}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"

echo "== ablate at T=$TS ($(date -u +%H:%M:%S))"
timeout "${ABLATE_TIMEOUT:-170}" python3 -m moda_bench.cli ablate --T "$TS" --naive-reps 3 --out "$OUT/ablation" \
    > "$OUT/ablate.log" 2>&1
echo "ablate rc=$?"
grep -v "━" "$OUT/ablate.log" | tail -n 80

if ! command -v ncu > /dev/null; then
    echo "ncu not found: no counters collected (ablation only)"
    exit 0
fi
DEFAULT_METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct
DEFAULT_METRICS+=,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
METRICS=${METRICS:-$DEFAULT_METRICS}
mkdir -p "$OUT/ncu"
first=1
for T in ${TS//,/ }; do
    echo "== ncu at T=$T ($(date -u +%H:%M:%S))"
    P=$OUT/ncu/T$T
    timeout "${NCU_TIMEOUT:-25}" ncu --profile-from-start off --clock-control none --metrics "$METRICS" -f -o "$P" \
        python3 experiments/ladder_ncu.py --T "$T" --order "${P}_order.json" > "$P.log" 2>&1
    echo "ncu rc=$?"; tail -n 3 "$P.log"
    [ -f "$P.ncu-rep" ] || continue
    ncu --import "$P.ncu-rep" --csv --page raw --print-units base > "${P}_raw.csv" 2>> "$P.log"
    python3 experiments/ladder_ncu.py --summarize "${P}_raw.csv" --order "${P}_order.json" --out "${P}_per_rung.csv" \
        || continue
    if [ $first = 1 ]; then cat "${P}_per_rung.csv" > "$OUT/ncu/per_rung.csv"; first=0
    else tail -n +2 "${P}_per_rung.csv" >> "$OUT/ncu/per_rung.csv"; fi
done
[ -f "$OUT/ncu/per_rung.csv" ] && column -s, -t < "$OUT/ncu/per_rung.csv"
echo "done ($(date -u +%H:%M:%S))"
