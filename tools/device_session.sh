#!/usr/bin/env bash
# The card's measurements on a GPU machine, in stages, so that each call of a remote GPU machine with
# a time limit runs a few of them. From the repository root on the GPU machine:
#
#   OUT=/path/to/out bash tools/device_session.sh STAGE [STAGE ...]
#
# FlashAttention-4 travels as wheels (no network there). Prepare them once on a machine with pip:
#   bash tools/device_session.sh pack           # .fa4/small/*.whl and .fa4/big/part00, part01 (< 32 MiB each)
# then carry .fa4/small + .fa4/big/part00 into the first call (stage fa4-small) and .fa4/big/part01 into
# the next (stage fa4-big): the large cu13 library wheel is split so that no call carries more than 64 MiB.
#
# Stages (each writes under $OUT/<gpu>/, gpu = h100 or h200 from nvidia-smi):
#   pack        (here, not on the GPU) download FA4 4.0.0b36 and its CuTe DSL wheels into .fa4/
#   fa4-small   install the small wheels into /tmp/fa4site, keep part00 in /tmp
#   fa4-big     join part00 + part01, unpack into /tmp/fa4site, check that FA4 imports
#   doctor      `moda-bench doctor` (GPU, clocks, health, what is installed)
#   tests       GPU-marked tests of every kernel (MoDA Triton and fused, depth-sep, decode, Depth-Attention) and
#               of every route behind moda_attention's dispatcher against fp64 (tests/test_dispatch_gpu.py, ~3 min)
#   paper       the paper's efficiency table with every peer (paper-efficiency/), merged into the gate
#               baseline (gate-baseline/<gpu>_gate_baseline.csv)
#   gate        the gate against that baseline in a second process (gate-baseline/gate.md)
#   precision   the paper preset in FP16 and at d = 128 (paper-fp16/, paper-d128/)
#   ladder      the cumulative ablation ladder with Nsight Compute counters (tools/ladder_profile.sh)
#   model       `moda-bench model` presets seed002-train and seed000-moda (model/), LAYERS layers each
#   shapes      MoDA at seed 000's model layer shapes (`--preset moda-models`: G=2, T=4096, an L sweep, every
#               route and FA4) into moda-models/, for the dispatcher's rules (`moda-bench dispatch --rules-from`)
#   generate    seed 002's generation run, short: dattn-3b, 8 layers, batch 64, 2048-token prompts, NEW_TOKENS
#               (default 256) generated, vanilla and Depth-Attention, GEN_TIME s of rounds (default 60: at 30 s the
#               H100 interval was 0.94-1.35) (model/; the report scales nothing: the
#               seed's 2048 tokens are NEW_TOKENS=2048)
#   compile     tools/compile_check.py: graph breaks, compile time and error against eager of every variant
#   dispatch    the fastest-MoDA check: every MoDA route and FA4 over T (eager and graph timers), then the
#               per-GPU dispatch rules regenerated from it into dispatch/rules/ (`moda-bench dispatch --rules-from`)
# MAX_TIME (default 2) is `--max-time` of the sweeps; each stage is capped at STAGE_TIMEOUT s (default 560).
set -uo pipefail
cd "$(dirname "$0")/.."
FA4_PKGS="flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
nvidia-cutlass-dsl-libs-core==4.8.1 quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5"
export PYTHONUNBUFFERED=1
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1   # FA4 keeps its compiled kernels on disk: the gate's second process reuses them
export PYTHONPATH=$PWD:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
MB="python3 -m moda_bench.cli"
MAX_TIME=${MAX_TIME:-2}
LAYERS=${LAYERS:-24}

gpu_name() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -q H200 && echo h200 || echo h100; }
stage() {  # name, command...: run capped, print the tail without progress bars
    local name=$1; shift
    echo "== $name ($(date -u +%H:%M:%S))"
    timeout "${STAGE_TIMEOUT:-560}" "$@" > "$R/$name.log" 2>&1
    echo "$name rc=$?"
    grep -v "━" "$R/$name.log" | tail -n 25
}

for s in "$@"; do
    if [ "$s" = pack ]; then
        mkdir -p .fa4/small .fa4/big
        for p in $FA4_PKGS nvidia-cutlass-dsl-libs-cu13==4.8.1; do
            python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
                --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 -d .fa4/dl "$p" || exit 1
        done
        mv .fa4/dl/nvidia_cutlass_dsl_libs_cu13-*.whl .fa4/big/ && mv .fa4/dl/*.whl .fa4/small/
        (mkdir -p /tmp/cu13 && cd /tmp/cu13 && unzip -q -o "$OLDPWD"/.fa4/big/nvidia_cutlass_dsl_libs_cu13-*.whl \
            && tar -cf - . | xz -T0 -9) | split -b 31M -d - .fa4/big/part
        ls -la .fa4/small .fa4/big
        continue
    fi
    OUT=${OUT:?set OUT to the output folder}
    GPU=$(gpu_name); R=$OUT/$GPU; mkdir -p "$R"
    case "$s" in
    fa4-small) stage fa4-small bash -c 'mkdir -p /tmp/fa4site && python3 -m pip install -q --no-index --no-deps \
                   --no-compile --target /tmp/fa4site .fa4/small/*.whl && cp .fa4/big/part00 /tmp/part00' ;;
    fa4-big) stage fa4-big bash -c 'cat /tmp/part00 .fa4/big/part01 | xz -d -T0 | tar -xf - -C /tmp/fa4site \
                 && rm -f /tmp/part00 && python3 -c "from flash_attn.cute import flash_attn_func; print(\"FA4 ok\")"' ;;
    doctor) stage doctor $MB doctor ;;
    tests) stage tests python3 -m pytest -q -m gpu -p no:cacheprovider tests/ ;;
    paper) stage paper $MB sweep --preset paper --providers moda,moda-fused,fa2,fa2-triton,fa4,depth-sep,cudnn \
               --max-time "$MAX_TIME" --out "$R/paper-efficiency"
           stage merge $MB merge "$R"/paper-efficiency/sweep_{T,G,L}.csv \
               --out "$R/gate-baseline/${GPU}_gate_baseline.csv" ;;
    gate) stage gate $MB gate --run --baseline "$R/gate-baseline/${GPU}_gate_baseline.csv" \
              --current "$R/gate-baseline/gate_current.csv" --summary "$R/gate-baseline/gate.md" --max-time "$MAX_TIME" ;;
    precision) stage fp16 $MB sweep --preset paper --dtype fp16 --providers moda,moda-fused,fa2,fa4 \
                   --max-time "$MAX_TIME" --out "$R/paper-fp16"
               stage d128 $MB sweep --preset paper --d 128 --providers moda,moda-fused,fa2,fa4 \
                   --max-time "$MAX_TIME" --out "$R/paper-d128" ;;
    ladder) stage ladder env OUT="$R/ablation" bash tools/ladder_profile.sh ;;
    model) stage model-train $MB model --preset seed002-train --layers "$LAYERS" --profile --out "$R/model"
           stage model-moda $MB model --preset seed000-moda --layers "$LAYERS" --profile --out "$R/model" ;;
    compile) stage compile python3 tools/compile_check.py --out "$R/compile-check" ;;
    shapes) stage shapes $MB sweep --preset moda-models --require fa4 --max-time "$MAX_TIME" --out "$R/moda-models" ;;
    generate) stage generate $MB model --model dattn-3b --mode generate --layers 8 --batch 64 \
                  --new-tokens "${NEW_TOKENS:-256}" --variants vanilla,depth-attention --quick --max-time-s "${GEN_TIME:-60}" \
                  --out "$R/model" ;;
    dispatch) stage dispatch-sweep $MB sweep --require fa4,moda-fused --vary T \
                  --values 1024,2048,4096,8192,16384,32768,65536 --timer eager,graph \
                  --providers moda,moda-triton,moda-fa4,moda-overlap,moda-fused,fa4 --max-time "$MAX_TIME" --out "$R/dispatch"
              stage dispatch-rules $MB dispatch --rules-from "$R/dispatch" --out "$R/dispatch/rules" ;;
    *) echo "unknown stage: $s (see the header of $0)"; exit 2 ;;
    esac
done
