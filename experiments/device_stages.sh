#!/usr/bin/env bash
# (Historical: the probe stages of earlier GPU sessions, kept for their commands; the maintained
# stages are tools/device_session.sh.)
# One GPU session's measurements, in stages, so that each call of a remote GPU box runs a few of
# them within its time limit. Usage, from the repository root on the GPU machine:
#
#   RESULTS=/path/to/folder GPU=h100 bash tools/device_session.sh STAGE [STAGE ...]
#
# Stages:
#   fa4-small   pip-install the small FlashAttention-4 wheels of .fa4/small into /tmp/fa4site
#   fa4-part1   keep the first half of the packed cu13 libraries (.fa4/p1) in /tmp
#   fa4-big     join it with the second half (.fa4/p2) and unpack into /tmp/fa4site
#   fa4-q1, fa4-q2, fa4-q3  the same in three parts (.fa4/q1..q3), one call each, for a tree too large for halves
#   tests       GPU-marked tests of the new operators (decode, Depth-Attention, detached depth)
#   kernel-tests GPU-marked tests of the decode and Depth-Attention kernels only (after a kernel edit)
#   fa4-tests   GPU-marked tests that need FA4 (moda-fa4 with detached depth, dattn on FA4)
#   proto       the two fused-depth forward prototypes (tools/fused_fwd_*.py)
#   paper       the paper preset with the Hopper peers (moda, moda-fa4, fa2, fa4, cudnn)
#   limit       issue 20's rows: T = 16K/32K/64K forward only and with detached depth,
#               T = 4096 under graph and eager timers
#   decode      the decode preset (graph and eager timers)
#   dattn-3b    the depth-attention preset's sweeps of the 3B heads (T = 16K, 8K, 4K, 2K; graph and eager)
#   dattn-1.5b  the same for the 1.5B heads (each stage capped by STAGE_TIMEOUT, default 580 s)
#   dattn-1.5b-short  the 1.5B heads at T = 4096 and 2048 only
#   dattn-ab    dattn (mix and FA4 as one autograd node) against dattn-composed, 1.5B heads, T = 16K
#   dattn-tests GPU-marked Depth-Attention tests (FA4 as the sequence attention when installed)
#   moda-tests  GPU-marked tests of the MoDA kernel (forward, gradients, detached depth) after a kernel edit
#   tma-tests   GPU-marked tests of the descriptor forward and moda_attention, then experiments/bwd_tma_check.py
#   paper-moda  the paper preset, moda against fa2 only (issue 21's rows)
#   tune-rows   retune the rows issue 21 names (G=2, L=256, T=4096) into $RESULTS/$GPU/tuning-tma, then export
#   launch-tax  issue 21's rows: T = 1024 and 4096 under eager and graph timers (moda, fa2, fa2-triton),
#               the L = 0 path's forward and backward at T = 16384 (TFLOP/s), the paper preset moda vs fa2
#   tune        the RUNBOOK's retuning for this GPU (results in $RESULTS/$GPU/tuning), then the export
#               into moda_bench/kernels/moda/tuned (copied beside the cache)
#   decode-tma  the decode kernel's tensor-descriptor (TMA) loads: GPU tests, then a tile grid with
#               and without them at B=1/T=32K, 8x2K, 32x8K, 128x2K (experiments/decode_probe.py)
#   decode-pdl  the decode combine launched with Programmatic Dependent Launch (DecodeConfig.pdl): GPU tests
#               of it and of the TMA tiles, then experiments/decode_probe.py with pdl off and on (TMA loads) at
#               B=1/T=32K, 1x8K, 8x2K, 8x8K (each part capped at 200 s; -k "tma_", since a bare "tma"
#               also matches the keyword "pytestmark" that every marked test carries)
#   tune-fa4    moda-fa4's depth launches (needs FA4): T = 4096 and 16384, G = 2, L = 256, same cache
#   bwd-tma     the folded "tma" backward: GPU tests of the MoDA kernel, then experiments/kernel_probe.py
#               (fwd+bwd, the default against the pointer backward it replaced and its knobs)
#   overlap-tests  GPU tests of the capped/persistent depth launches and moda-fa4 (FA4 where installed)
#   overlap-probe  the persistent depth backward's item shapes alone at 16 and 24 programs (no FA4 needed)
#   overlap-limit  issue 20's rows with moda-overlap: T = 16K/32K/64K fwd+bwd and forward only
#   overlap-rows   the same with detached depth; T = 4096 (graph, eager); G = 2, 16, 32; L = 256
#   overlap-paper  the paper preset with moda-overlap and every peer
#   tune-overlap   moda-overlap's program counts at issue 20's rows (T, G = 2/16/32, L = 256) into
#               $RESULTS/$GPU/tuning-overlap; then `moda-bench tune --export-shipped` ships the winners
#   overlap-tuned  the rows the tuner looks at again (T = 4096, 32768, 65536 under the graph timer, G = 2/16/32, L = 256)
#               with the shipped file in place: moda-overlap tuned against moda-fa4 and FA4
#   tune-overlap-items  moda-overlap's four groups (items and program counts) at G = 2, L = 256, T = 4096, from this
#               GPU's committed tuning cache (--force), the export, then those rows with the shipped file
#   depth-steps the streaming depth kernels alone with more depth steps an item (dbl: their block_l) at
#               G=8, L=64, where an item has 4 steps (experiments/overlap_probe.py; no FA4 needed)
#   depth-flat  the flat (item, step) streaming depth forward prototype against kernel_depth's, GB/s a program
#               (experiments/depth_flat_proto.py; no FA4 needed)
#   overlap-check  moda-overlap's results on full tensors at T = 32768 (and 4099, 65536 for the depth kernels):
#               experiments/overlap_check.py against an fp32 depth reference and against moda-fa4
#   overlap-det  which part of moda-fa4 / moda-overlap varies from run to run (experiments/overlap_check.py --determinism)
#   depth-rates the streaming depth kernels alone (experiments/depth_ncu.py): GB/s a program over program counts and item
#               variants at G=8/L=64, G=2, L=256, T=16384 (no FA4 needed)
#   depth-rates-b  the backward's items (rows, warps, stages) and the forward's 256-row 8-warp items at G=2/16, L=256, T=4096
#   overlap-items2 moda-overlap with the forward's items at 256 rows and 8 warps (and fewer programs) against its heuristic,
#               beside FA4 at T=16384, 4096 (graph timer), 32768, forward and fwd+bwd (experiments/overlap_probe.py)
#   overlap-ab  moda-overlap's forward items now (256 rows, 8 warps) against before (128 rows, 4 warps) in one
#               process, beside FA4: T=16384 and 4096 (graph) fwd and fwd+bwd, 32768 fwd, G=2, L=256
#   decode-floor per decode point, plain kernels moving the same bytes (a copy, a read-only sum) under the same timer:
#               the share of the copy rate a transfer of that size reaches at all (experiments/decode_probe.py --copy-floor)
#   depth-ncu   the same kernels under ncu (forward at 12 and 132 programs, backward at 24): speed of light, memory,
#               warp stalls, into $RESULTS/depth_ncu.csv.gz
#   overlap-realloc  moda-overlap against FA4 at T=16384/32768 fwd+bwd three times in one process, the inputs
#               allocated anew behind a growing pad each time (does the depth tensors' placement move the ratio?)
#   host        where an eager fwd+bwd's host time goes at T=1024 (experiments/host_probe.py: issue time per call, cProfile)
#   host-split  the same split without a profiler: --phases (each piece alone; the backward alone with and without
#               AccumulateGrad; a five-input Python node) and --engine (a Python and a C++ node, moda and FA2, with
#               and without autograd's device threads), then the key-major pass after the dq pass (no side stream)
#               and unchunked against the default (--variants: host time alone and interleaved ratios)
#   launch-tests GPU tests of the cached launches (tests/test_launch.py, test_dattn_launch.py: bitwise Triton's own
#               path, launch counts) and of the merges (tests/test_merge.py; its moda-fa4 routes need FA4)
#   host-timeline  the stamp-by-stamp host timeline of an eager fwd+bwd at T=1024 (experiments/host_timeline.py, device threads
#               on and off), then each kept launch's host cost piece by piece (experiments/launch_pieces.py)
#   pdl-test    the decode PDL tests alone (tests/test_decode.py -k pdl)
#   fused-check route B's fused forward (moda_bench/kernels/moda/cute/fwd_sm90.py) against the fp64 reference at odd shapes
#               (experiments/fused_sm90_check.py --check); needs FA4
#   fused-time  its forward beside FA4, moda-fa4 and moda-overlap at FUSED_T (default 16K, 32K, 64K, 4096) for the
#               FUSED_VARIANTS depth tile x stages (default 64x2;128x1;32x2)
#   fused-ncu   ncu of the fused forward's variants FUSED_NCU_VARIANTS (default: spread, spread without its math,
#               offset) at the first FUSED_T, one kernel each (NVTX fused0, fused1, ...), into $RESULTS/fused_ncu.csv.gz
#   fused-sass  ncu's per-instruction view (SASS, stall samples) of FUSED_NCU_VARIANTS (default: spread and spread
#               without its math) at the first FUSED_T, into $RESULTS/fused_sass.csv.gz
#   depth-bwd-sass  ncu of the CuTe and Triton depth backward kernels alone (T=16384, G=8, L=64, 24 programs):
#               details and the per-instruction SASS view into $RESULTS/depth_bwd_{ncu,sass}.csv.gz
#   cute-bwd-tests  GPU tests of the CuTe depth backward (tests/test_depth_bwd_sm90.py)
#   depth-bwd-ab  the CuTe depth backward against fp64 at odd shapes, then alone beside Triton's kernel at
#               G=8/L=64, G=2, G=16, L=256 (T=16384, DBWD_PROGRAMS programs, default 24), in the configurations
#               DBWD_CONFIGS (warps x stages x keys a step, k: q/do held, n: no TMA store; default 8x2x32k,8x2x32)
#   fused-mask-ab  the fused forward (spread, offset) against fp64, then its row-wise mask against the
#               score-by-score one ("cellmask") at FUSED_T (default 16384,4096,32768), graph timer; other
#               variants by FUSED_VARIANTS (tile x stages:placement:lead:probe, e.g. 32x1:spread:0:cuteaddr)
#   fused-tests GPU tests of the fused forward (tests/test_fused_sm90.py: gradients vs reference, determinism)
#   fused-sweep-a, fused-sweep-b  issue 20's rows with moda-fused beside moda-overlap, moda-fa4, FA4, cuDNN: T=4096 (graph, eager),
#               16K/32K/64K forward, 16K/32K fwd+bwd, G=2, L=256 (into $RESULTS/$GPU/$FUSED_RUN, default fused-limit;
#               FUSED_PROVIDERS overrides the providers)
#   fused-ab    moda-overlap with and without the fused forward (fa4_fused_fwd) in one process, beside FA4: T=4096
#               graph (fwd, bwd, fwd+bwd) and eager (fwd, fwd+bwd), T=16K/32K eager fwd, bwd, fwd+bwd (overlap_probe)
#   doctor      moda-bench doctor (GPU, health canary)
# The FA4 wheels and the packed libraries are prepared as docs/RUNBOOK.md describes. Each stage
# writes under $RESULTS/$GPU/<run>/ and logs to $RESULTS/<stage>.log.
set -uo pipefail
RESULTS=${RESULTS:?set RESULTS to an output folder}
GPU=${GPU:?set GPU to a short name such as h100}
MAX_TIME=${MAX_TIME:-8}
export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
mkdir -p "$RESULTS/$GPU"
MB="python3 -m moda_bench.cli"
# a sweep whose FA4 rows would be skipped (FA4 not installed on this box) stops at once instead
REQ="--require fa4,moda-fa4"

stage() {
  local name=$1; shift
  echo "=== $name $(date -u +%H:%M:%S)"
  "$@" > "$RESULTS/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc $(date -u +%H:%M:%S)"
  tail -n 25 "$RESULTS/$name.log"
}

for s in "$@"; do
  case $s in
    fa4-small) stage fa4-small python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa4site .fa4/small/*.whl ;;
    fa4-part1) stage fa4-part1 cp .fa4/p1/cu13.part.aa /tmp/ ;;
    fa4-q1) stage fa4-q1 cp .fa4/q1/cu13.q.aa /tmp/ ;;
    fa4-q2) stage fa4-q2 cp .fa4/q2/cu13.q.ab /tmp/ ;;
    fa4-q3) stage fa4-q3 bash -c 'cat /tmp/cu13.q.aa /tmp/cu13.q.ab .fa4/q3/cu13.q.ac | xz -d | tar -xf - -C /tmp/fa4site && python3 -c "from flash_attn.cute import flash_attn_func; print(\"FA4 ok\")"' ;;
    fa4-big) stage fa4-big bash -c 'cat /tmp/cu13.part.aa .fa4/p2/cu13.part.ab | xz -d | tar -xf - -C /tmp/fa4site && python3 -c "from flash_attn.cute import flash_attn_func; print(\"FA4 ok\")"' ;;
    tests) stage tests timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 300 tests/test_decode.py tests/test_dattn.py tests/test_depth_grad.py -k "not fa4" ;;
    kernel-tests) stage kernel-tests timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 300 tests/test_decode.py tests/test_dattn.py tests/test_dattn_chained.py -k "not fa4" ;;
    fa4-tests) stage fa4-tests timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 200 tests/test_depth_grad.py tests/test_dattn.py -k "fa4 or FA4" ;;
    proto) stage proto-triton timeout 200 python3 experiments/fused_fwd_triton.py --quick
           stage proto-cute timeout 150 python3 experiments/fused_fwd_cute.py ;;
    paper) stage paper $MB sweep $REQ --preset paper --providers moda,moda-fa4,fa2,fa4,cudnn --max-time "$MAX_TIME" --out "$RESULTS/$GPU/paper-peers" ;;
    limit) R=$RESULTS/$GPU/limit
           stage limit-fwd $MB sweep $REQ --vary T --values 16384,32768,65536 --pass fwd --providers moda-fa4,moda,fa4,cudnn,fa2 --max-time "$MAX_TIME" --out "$R/fwd"
           stage limit-detached $MB sweep $REQ --vary T --values 16384,32768,65536 --depth-grad off --providers moda-fa4,moda,fa4,cudnn,fa2 --max-time "$MAX_TIME" --out "$R/detached"
           stage limit-t4096 $MB sweep $REQ --vary T --values 4096 --timer graph,eager --providers moda-fa4,moda,fa4,cudnn,fa2 --max-time "$MAX_TIME" --out "$R/t4096" ;;
    decode) stage decode $MB sweep --preset decode --require fa4 --max-time "$MAX_TIME" --out "$RESULTS/$GPU/decode" ;;
    dattn-3b) stage dattn-3b timeout "${STAGE_TIMEOUT:-580}" $MB sweep --preset depth-attention --only 'dattn-3B-*' $REQ --max-time "$MAX_TIME" --out "$RESULTS/$GPU/depth-attention-3B" ;;
    dattn-1.5b) stage dattn-1.5b timeout "${STAGE_TIMEOUT:-580}" $MB sweep --preset depth-attention --only 'dattn-1.5B-*' $REQ --max-time "$MAX_TIME" --out "$RESULTS/$GPU/depth-attention-1.5B" ;;
    dattn-1.5b-short) stage dattn-1.5b-short timeout "${STAGE_TIMEOUT:-580}" $MB sweep --preset depth-attention --only 'dattn-1.5B-T4096,dattn-1.5B-T2048' $REQ --max-time "$MAX_TIME" --out "$RESULTS/$GPU/depth-attention-1.5B-short" ;;
    dattn-ab) stage dattn-ab timeout "${STAGE_TIMEOUT:-580}" $MB sweep --vary S --values 1,2,4 --T 16384 --G 4 --Hk 6 --timer graph,eager --providers dattn,dattn-composed,fa4 --require fa4 --max-time "$MAX_TIME" --out "$RESULTS/$GPU/dattn-chained-ab" ;;
    dattn-tests) stage dattn-tests timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 200 tests/test_dattn.py tests/test_dattn_chained.py ;;
    moda-tests) stage moda-tests timeout 500 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 300 tests/test_moda.py tests/test_moda_tma.py tests/test_depth_grad.py -k "not fa4" ;;
    tma-tests) stage tma-tests timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_moda.py tests/test_moda_tma.py
           stage bwd-tma-check timeout 200 python3 experiments/bwd_tma_check.py ;;
    paper-moda) stage paper-moda $MB sweep --preset paper --providers moda,fa2 --max-time 5 --out "$RESULTS/$GPU/paper-moda" ;;
    tune-rows) R=$RESULTS/$GPU/tuning-tma; mkdir -p "$R"
           TUNE="$MB tune --kernels fwd_depth,bwd_depth,fwd,bwd_q,bwd_kv --min-gain 3% --cache $R/tuning.json --budget 6"
           stage tune-rows-g timeout 200 $TUNE --vary G --values 2 --out "$R/tune_G.csv"
           stage tune-rows-l timeout 200 $TUNE --vary L --values 256 --out "$R/tune_L.csv"
           stage tune-rows-t timeout 170 $TUNE --vary T --values 4096 --out "$R/tune_T.csv"
           stage tune-rows-export $MB tune --cache "$R/tuning.json" --export-shipped moda_bench/kernels/moda/tuned
           cp moda_bench/kernels/moda/tuned/*.json "$R/" ;;
    launch-tax) R=$RESULTS/$GPU/launch-tax
           stage short-t $MB sweep --vary T --values 1024,4096 --timer eager,graph --providers moda,fa2,fa2-triton --max-time "$MAX_TIME" --out "$R/short-t"
           stage l0-fwd $MB sweep --vary T --values 16384 --L 0 --pass fwd --providers fa2-triton,fa2,cudnn --max-time "$MAX_TIME" --out "$R/l0-fwd"
           stage l0-bwd $MB sweep --vary T --values 16384 --L 0 --pass bwd --providers fa2-triton,fa2,cudnn --max-time "$MAX_TIME" --out "$R/l0-bwd"
           stage paper-moda $MB sweep --preset paper --providers moda,fa2 --max-time "$MAX_TIME" --out "$R/paper" ;;
    tune) R=$RESULTS/$GPU/tuning; mkdir -p "$R"
           TUNE="$MB tune --kernels fwd_depth,bwd_depth,fwd,bwd_q,bwd_kv --min-gain 3% --cache $R/tuning.json"
           stage tune-t timeout "${STAGE_TIMEOUT:-580}" $TUNE --vary T --values 4096,8192,16384,32768 --budget 6 --out "$R/tune_T.csv"
           stage tune-g timeout "${STAGE_TIMEOUT:-580}" $TUNE --vary G --values 2,4,16,32 --budget 5 --out "$R/tune_G.csv"
           stage tune-l timeout "${STAGE_TIMEOUT:-580}" $TUNE --vary L --values 128,256 --budget 5 --out "$R/tune_L.csv"
           stage tune-export $MB tune --cache "$R/tuning.json" --export-shipped moda_bench/kernels/moda/tuned
           cp moda_bench/kernels/moda/tuned/*.json "$R/" ;;
    decode-tma) stage decode-tma-tests timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_decode.py -k "tma"
           G="--block-n 64,128 --warps 2,4 --stages 2,3,4 --tma 0,1"
           stage decode-tma-grid bash -c "python3 experiments/decode_probe.py $G --points 1x32768 --splits 16,33,66 --budget-s 110;
             python3 experiments/decode_probe.py $G --points 8x2048,32x8192,128x2048 --budget-s 150" ;;
    decode-pdl) stage decode-pdl-tests timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_decode.py -k "pdl or tma_"
           stage decode-pdl-probe timeout 200 python3 experiments/decode_probe.py --points 1x32768,1x8192,8x2048,8x8192 --pdl 0,1 --tma 1 --budget-s 120 ;;
    tune-fa4) R=$RESULTS/$GPU/tuning; mkdir -p "$R"
           TUNE="$MB tune --op moda-fa4 --kernels fwd_depth,bwd_depth --budget 8 --min-gain 3% --cache $R/tuning.json"
           stage tune-fa4-t timeout "${STAGE_TIMEOUT:-580}" $TUNE --vary T --values 4096,16384 --out "$R/tune_fa4_T.csv"
           stage tune-fa4-g timeout "${STAGE_TIMEOUT:-580}" $TUNE --vary G --values 2 --out "$R/tune_fa4_G.csv"
           stage tune-fa4-l timeout "${STAGE_TIMEOUT:-580}" $TUNE --vary L --values 256 --out "$R/tune_fa4_L.csv"
           stage tune-fa4-export $MB tune --cache "$R/tuning.json" --export-shipped moda_bench/kernels/moda/tuned
           cp moda_bench/kernels/moda/tuned/*.json "$R/" ;;
    bwd-tma) stage bwd-tma-tests bash -c 'timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_moda_bwd_tma.py -k "not fa4";
             timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_moda.py tests/test_moda_tma.py tests/test_depth_grad.py -k "not fa4"' 
           R=$RESULTS/$GPU/bwd-tma-probe; mkdir -p "$R"; KP="timeout 150 python3 experiments/kernel_probe.py --passes fwdbwd"
           stage bwd-tma-probe bash -c "$KP --T 4096,16384 --G 8 --L 64 --variants default,oldbwd,q0,kv0,qn128,bbl64,bds3 --l0-variants default,oldbwd --out $R/g8.csv;
             $KP --T 4096,16384 --G 2 --L 64 --variants default,oldbwd,q0,qn128,bbl64,g2fwd --l0-variants none --out $R/g2.csv;
             $KP --T 16384 --G 8 --L 256 --variants default,oldbwd,q0,qn128,bbl64 --l0-variants none --out $R/l256.csv;
             $KP --T 1024,2048 --G 8 --L 64 --variants default,oldbwd --l0-variants default,oldbwd --out $R/short.csv;
             $KP --T 16384 --G 32 --L 64 --variants default,oldbwd --l0-variants none --out $R/g32.csv" ;;
    overlap-tests) stage overlap-tests timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_merge.py tests/test_depth_ctas.py tests/test_fa4.py ;;
    overlap-probe) stage overlap-probe timeout 300 python3 experiments/overlap_probe.py --seq cudnn --T 16384 --passes bwd \
             --variants "P=1,b=24,p=1,dbm=64,ds=3" --depth-alone --kernels persist --ctas 16,24 \
             --alone-variants "dbm=64,ds=3;dbm=64,ds=4;dbm=128,ds=3;dbm=64,ds=3,dw=8;dbm=32,ds=3;dbm=128,ds=2,dw=8" \
             --max-time 8 --out "$RESULTS/$GPU/overlap_probe_bwd.csv" ;;
    overlap-limit) R=$RESULTS/$GPU/overlap; P=moda-overlap,moda-fa4,fa4,cudnn,fa2; OV="--require fa4,moda-overlap"
           stage overlap-fwdbwd $MB sweep $OV --vary T --values 16384,32768,65536 --providers $P --max-time "$MAX_TIME" --out "$R/fwdbwd"
           stage overlap-fwd $MB sweep $OV --vary T --values 16384,32768,65536 --pass fwd --providers $P --max-time "$MAX_TIME" --out "$R/fwd" ;;
    overlap-rows) R=$RESULTS/$GPU/overlap; P=moda-overlap,moda-fa4,fa4,cudnn,fa2; OV="--require fa4,moda-overlap"
           stage overlap-detached $MB sweep $OV --vary T --values 16384,32768,65536 --depth-grad off --providers $P --max-time "$MAX_TIME" --out "$R/detached"
           stage overlap-t4096 $MB sweep $OV --vary T --values 4096 --timer graph,eager --providers $P --max-time "$MAX_TIME" --out "$R/t4096"
           stage overlap-g $MB sweep $OV --vary G --values 2,16,32 --providers $P --max-time "$MAX_TIME" --out "$R/g"
           stage overlap-l256 $MB sweep $OV --vary L --values 256 --providers $P --max-time "$MAX_TIME" --out "$R/l256" ;;
    overlap-paper) stage overlap-paper $MB sweep --require fa4,moda-overlap --preset paper --providers moda-overlap,moda,moda-fa4,fa2,fa4,cudnn --max-time "$MAX_TIME" --out "$RESULTS/$GPU/paper-overlap" ;;
    tune-overlap) R=$RESULTS/$GPU/tuning-overlap; mkdir -p "$R"
           TUNE="timeout ${STAGE_TIMEOUT:-300} $MB tune --op moda-overlap --budget 8 --min-gain 3% --cache $R/tuning.json"
           stage tune-overlap-T $TUNE --vary T --values 4096,16384,32768,65536 --out "$R/tune_T.csv"
           stage tune-overlap-G $TUNE --vary G --values 2,16,32 --out "$R/tune_G.csv"
           stage tune-overlap-L $TUNE --vary L --values 256 --out "$R/tune_L.csv"
           stage tune-overlap-export $MB tune --cache "$R/tuning.json" --export-shipped moda_bench/kernels/moda/tuned
           cp moda_bench/kernels/moda/tuned/*.json "$R/" ;;
    overlap-tuned) R=$RESULTS/$GPU/overlap-tuned; P=moda-overlap,moda-fa4,fa4; OV="--require fa4,moda-overlap"
           stage overlap-tuned-t $MB sweep $OV --vary T --values 4096,32768,65536 --timer graph --providers $P --max-time "$MAX_TIME" --out "$R/t"
           stage overlap-tuned-g $MB sweep $OV --vary G --values 2,16,32 --providers $P --max-time "$MAX_TIME" --out "$R/g"
           stage overlap-tuned-l $MB sweep $OV --vary L --values 256 --providers $P --max-time "$MAX_TIME" --out "$R/l256" ;;
    tune-overlap-items) R=$RESULTS/$GPU/tuning-overlap-items; mkdir -p "$R"; cp "results/$GPU/tuning-overlap/tuning.json" "$R/"
           TUNE="timeout ${STAGE_TIMEOUT:-300} $MB tune --op moda-overlap --kernels fwd_items,fwd_ctas,bwd_items,bwd_ctas --budget 8 --min-gain 3% --force --cache $R/tuning.json"
           stage tune-items-G $TUNE --vary G --values 2 --out "$R/tune_G.csv"
           stage tune-items-L $TUNE --vary L --values 256 --out "$R/tune_L.csv"
           stage tune-items-T $TUNE --vary T --values 4096 --out "$R/tune_T.csv"
           stage tune-items-export $MB tune --cache "$R/tuning.json" --export-shipped moda_bench/kernels/moda/tuned
           cp moda_bench/kernels/moda/tuned/*.json "$R/"
           R=$RESULTS/$GPU/overlap-items; P=moda-overlap,moda-fa4,fa4; OV="--require fa4,moda-overlap"
           stage items-rows-t $MB sweep $OV --vary T --values 4096 --timer graph --providers $P --max-time "$MAX_TIME" --out "$R/t4096"
           stage items-rows-g $MB sweep $OV --vary G --values 2 --providers $P --max-time "$MAX_TIME" --out "$R/g2"
           stage items-rows-l $MB sweep $OV --vary L --values 256 --providers $P --max-time "$MAX_TIME" --out "$R/l256" ;;
    depth-steps) stage depth-steps timeout 300 python3 experiments/overlap_probe.py --seq cudnn --T 16384 --G 8 --L 64 --passes fwd,bwd \
             --variants default --depth-alone --kernels persist --ctas 8,16 \
             --alone-variants "dbm=128,ds=3;dbm=128,ds=3,dbl=16;dbm=128,ds=4,dbl=16;dbm=256,ds=3,dbl=16" \
             --max-time 3 --out "$RESULTS/$GPU/depth_steps.csv" ;;
    depth-flat) stage depth-flat bash -c "python3 experiments/depth_flat_proto.py --check && timeout 240 python3 experiments/depth_flat_proto.py \
             --T 16384 --G 8,2 --L 64,256 --programs 8,16,32 --max-time 2 --out $RESULTS/$GPU/depth_flat.csv" ;;
    overlap-check) stage overlap-check timeout 400 python3 experiments/overlap_check.py --T 32768 --programs 132,10,8,4 --reps 2 --full \
             --out "$RESULTS/$GPU/overlap_check_32k.csv"
           stage overlap-check-odd timeout 200 python3 experiments/overlap_check.py --T 4099,65536 --programs 132,10,4 --reps 2 \
             --out "$RESULTS/$GPU/overlap_check_odd.csv" ;;
    overlap-det) stage overlap-det timeout 400 python3 experiments/overlap_check.py --determinism --T 32768,16384,4099 \
             --out "$RESULTS/$GPU/overlap_determinism.csv" ;;
    overlap-lse) stage overlap-lse timeout 300 python3 experiments/overlap_check.py --lse --T 32768,16384 \
             --out "$RESULTS/$GPU/overlap_lse.csv" ;;
    depth-rates) DN="timeout 240 python3 experiments/depth_ncu.py --T 16384 --max-time 0.4"
           stage depth-rates bash -c "$DN --G 8 --L 64 --programs 1,4,12,24,66,132 \
               --variants 'default;s=4;bl=32;bl=32,w=8;bm=256,w=8;bl=64,w=8';
             $DN --G 2 --L 64 --programs 12,24,48 --variants 'default;s=4;bl=32,w=8';
             $DN --G 8 --L 256 --programs 12,24,48 --variants 'default;s=4;bl=32,w=8'" ;;
    depth-rates-b) DN="timeout 200 python3 experiments/depth_ncu.py --max-time 0.4"
           stage depth-rates-b bash -c "$DN --T 16384 --passes bwd --G 8 --L 64 --programs 12,24 \
               --variants 'default;bm=128;bm=128,w=8;bm=64,w=8;bm=32;bm=32,w=2;s=2';
             $DN --T 16384 --passes fwd --G 2,16 --L 64 --programs 12,24 --variants 'default;bm=256,w=8;bm=256,w=8,s=2';
             $DN --T 16384 --passes fwd --G 8 --L 256 --programs 12,24 --variants 'default;bm=256,w=8;bm=256,w=8,s=2';
             $DN --T 4096 --G 8 --L 64 --programs 24,48 --variants 'default;bm=256,w=8'" ;;
    overlap-items2) OP="timeout 170 python3 experiments/overlap_probe.py --seq fa4 --passes fwd,fwdbwd --max-time 3 \
             --out $RESULTS/$GPU/overlap_items2.csv"; W="overlap,depth_block_m=256,depth_warps=8"
           stage overlap-items2 bash -c "$OP --T 16384 --variants 'overlap;$W;$W,f=10';
             $OP --T 4096 --timer graph --variants 'overlap;$W;$W,f=40';
             $OP --T 32768 --variants 'overlap;$W'" ;;
    overlap-ab) OP="timeout 150 python3 experiments/overlap_probe.py --seq fa4 --max-time 3 --out $RESULTS/$GPU/overlap_ab.csv"
           V="overlap;overlap,depth_block_m=128,depth_warps=4"
           stage overlap-ab bash -c "$OP --T 16384 --passes fwd,fwdbwd --variants '$V'; $OP --T 4096 --timer graph \
             --passes fwd,fwdbwd --variants '$V'; $OP --T 32768 --passes fwd --variants '$V';
             $OP --T 16384 --G 2 --passes fwdbwd --variants '$V'; $OP --T 16384 --L 256 --passes fwdbwd --variants '$V'" ;;
    decode-floor) stage decode-floor timeout 150 python3 experiments/decode_probe.py --points 1x32768,1x8192,8x2048,8x8192,32x8192 \
             --copy-floor --splits 1 --budget-s 100 ;;
    depth-ncu|fused-ncu) NCU="ncu --clock-control none --nvtx --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
             --section SchedulerStats --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
             --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio --csv --page details"
           if [ "$s" = fused-ncu ]; then
             FN="${FUSED_NCU_VARIANTS:-32x1:spread;32x1:spread:0:nomath;64x2:offset}"
             INC=$(python3 -c "import sys; print(' '.join(f\"--nvtx-include fused{i}/\" for i in range(len(sys.argv[1].split(';')))))" "$FN")
             stage fused-ncu bash -c "timeout 300 $NCU $INC python3 experiments/fused_sm90_check.py --ncu --T ${FUSED_T:-16384} \
               --variants '$FN' > $RESULTS/fused_ncu.csv; gzip -f $RESULTS/fused_ncu.csv"
           else
             stage depth-ncu bash -c "timeout 240 $NCU --nvtx-include 'fwd-G8-L64-n12-v0/' --nvtx-include 'bwd-G8-L64-n24-v0/' \
               --nvtx-include 'fwd-G8-L64-n132-v0/' python3 experiments/depth_ncu.py --calls 1 --G 8 --L 64 --programs 12,24,132 \
               > $RESULTS/depth_ncu.csv; gzip -f $RESULTS/depth_ncu.csv"
           fi ;;
    overlap-realloc) stage overlap-realloc timeout 400 python3 experiments/overlap_probe.py --seq fa4 --T 16384,32768 --passes fwdbwd \
             --variants overlap --repeat 3 --max-time 4 --out "$RESULTS/$GPU/overlap_realloc.csv" ;;
    fused-sass) FN="${FUSED_NCU_VARIANTS:-32x1:spread;32x1:spread:0:nomath}"
           INC=$(python3 -c "import sys; print(' '.join(f\"--nvtx-include fused{i}/\" for i in range(len(sys.argv[1].split(';')))))" "$FN")
           stage fused-sass bash -c "timeout 300 ncu --clock-control none --nvtx $INC --import-source no --section SourceCounters \
               --section WarpStateStats --section InstructionStats -f -o $RESULTS/fused_sass python3 experiments/fused_sm90_check.py --ncu \
               --T ${FUSED_T:-16384} --variants '$FN' && ncu -i $RESULTS/fused_sass.ncu-rep --page source --csv --print-source sass \
               > $RESULTS/fused_sass.csv; gzip -f $RESULTS/fused_sass.csv; rm -f $RESULTS/fused_sass.ncu-rep" ;;
    depth-bwd-sass) stage depth-bwd-sass bash -c "timeout 300 ncu --clock-control none --nvtx --nvtx-include dbwd-cute/ \
               --nvtx-include dbwd-triton/ --import-source no --section SpeedOfLight --section WarpStateStats \
               --section SchedulerStats --section Occupancy --section SourceCounters --section InstructionStats \
               -f -o $RESULTS/depth_bwd_sass python3 experiments/depth_bwd_check.py --ncu --programs 24 && \
               ncu -i $RESULTS/depth_bwd_sass.ncu-rep --page details --csv > $RESULTS/depth_bwd_ncu.csv; \
               ncu -i $RESULTS/depth_bwd_sass.ncu-rep --page source --csv --print-source sass > $RESULTS/depth_bwd_sass.csv; \
               gzip -f $RESULTS/depth_bwd_ncu.csv $RESULTS/depth_bwd_sass.csv; rm -f $RESULTS/depth_bwd_sass.ncu-rep" ;;
    pdl-test) stage pdl-test timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_decode.py -k "pdl" ;;
    fused-check) stage fused-check timeout 180 python3 experiments/fused_sm90_check.py --check --placements "${FUSED_PLACEMENTS:-offset,first}" \
             --out "$RESULTS/$GPU/fused_sm90_check.csv" ;;
    fused-time) stage fused-time timeout "${STAGE_TIMEOUT:-400}" python3 experiments/fused_sm90_check.py --T "${FUSED_T:-16384,32768,65536,4096}" \
             --variants "${FUSED_VARIANTS:-64x2;64x2:offset:0;64x2:offset:8;64x2:first}" --timer "${FUSED_TIMER:-graph}" --max-time "$MAX_TIME" --out "$RESULTS/$GPU/fused_sm90_time.csv" ;;
    fused-gl) FV="--variants '${FUSED_VARIANTS:-64x2;64x2:offset:0}' --timer ${FUSED_TIMER:-graph} --max-time $MAX_TIME --out $RESULTS/$GPU/fused_sm90_time.csv"
           stage fused-gl bash -c "timeout 150 python3 experiments/fused_sm90_check.py --T 16384 --G 2 $FV; timeout 150 python3 experiments/fused_sm90_check.py --T 16384 --L 256 $FV" ;;
    fused-tests) stage fused-tests timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fused_sm90.py ;;
    depth-bwd-ab) R=$RESULTS/$GPU/${DBWD_RUN:-depth-bwd-split}; mkdir -p "$R"; DB="python3 experiments/depth_bwd_check.py"
           stage depth-bwd-ab bash -c "timeout 200 $DB --check --configs ${DBWD_CONFIGS:-8x2x32k,8x2x32} --out $R/check.csv; for s in '8 64' '2 64' '16 64' '8 256'; do set -- \$s;
               timeout 100 $DB --rates --G \$1 --L \$2 --programs ${DBWD_PROGRAMS:-24} --configs ${DBWD_CONFIGS:-8x2x32k,8x2x32} --max-time ${MAX_TIME} --out $R/rates.csv; done" ;;
    fused-mask-ab) R=$RESULTS/$GPU/${FUSED_RUN:-fused-rowmask}; mkdir -p "$R"
           stage fused-mask-ab bash -c "timeout 200 python3 experiments/fused_sm90_check.py --check --placements spread,offset --out $R/check.csv; \
               timeout 300 python3 experiments/fused_sm90_check.py --T ${FUSED_T:-16384,4096,32768} --timer graph --max-time ${MAX_TIME} \
               --variants '${FUSED_VARIANTS:-32x1:spread;32x1:spread:0:cellmask;64x2:offset;64x2:offset:0:cellmask}' --out $R/time.csv" ;;
    cute-bwd-tests) stage cute-bwd-tests timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_depth_bwd_sm90.py ;;
    fused-sweep-a) R=$RESULTS/$GPU/${FUSED_RUN:-fused-limit}; P="${FUSED_PROVIDERS:-moda-fused,moda-overlap,moda-fa4,fa4,cudnn}"; Q="--require fa4,moda-fused --max-time $MAX_TIME"
           stage fused-t4096 $MB sweep $Q --vary T --values 4096 --timer graph,eager --providers $P --out "$R/t4096"
           stage fused-fwd $MB sweep $Q --vary T --values 16384,32768,65536 --pass fwd --providers $P --out "$R/fwd" ;;
    fused-sweep-b) R=$RESULTS/$GPU/${FUSED_RUN:-fused-limit}; P="${FUSED_PROVIDERS:-moda-fused,moda-overlap,moda-fa4,fa4,cudnn}"; Q="--require fa4,moda-fused --max-time $MAX_TIME"
           stage fused-fwdbwd $MB sweep $Q --vary T --values 16384,32768 --providers $P --out "$R/fwdbwd"
           stage fused-g2 $MB sweep $Q --vary G --values 2 --providers $P --out "$R/g2"
           stage fused-l256 $MB sweep $Q --vary L --values 256 --providers $P --out "$R/l256" ;;
    fused-ab) OP="timeout 170 python3 experiments/overlap_probe.py --seq fa4 --max-time 3 --out $RESULTS/$GPU/fused_ab.csv"
           V="overlap;overlap,fa4_fused_fwd=1"
           stage fused-ab bash -c "$OP --T 4096 --timer graph --passes fwd,bwd,fwdbwd --variants '$V'; $OP --T 4096 \
             --passes fwd,fwdbwd --variants '$V'; $OP --T 16384,32768 --passes fwd,bwd,fwdbwd --variants '$V'" ;;
    host) stage host timeout 200 python3 experiments/host_probe.py --T 1024 --calls 300 --top 30 ;;
    host-split) stage host-split bash -c "timeout 150 python3 experiments/host_probe.py --phases --T 1024 --calls 300; \
               timeout 150 python3 experiments/host_probe.py --engine --T 1024 --calls 300; \
               timeout 150 python3 experiments/host_probe.py --T 1024 --variants 'beside=0;chunk=0' --max-time 2" ;;
    launch-tests) stage launch-tests timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_launch.py \
               tests/test_dattn_launch.py tests/test_merge.py ;;
    host-timeline) stage host-timeline bash -c "timeout 90 python3 experiments/host_timeline.py --T 1024 --calls 300 --threads-off; \
               timeout 120 python3 experiments/launch_pieces.py --T 1024 --n 2000" ;;
    doctor) stage doctor $MB doctor ;;
    *) echo "unknown stage $s"; exit 2 ;;
  esac
done
