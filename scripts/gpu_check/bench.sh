#!/bin/bash
# The GPU benchmark (benchmarks/device_suite.py) on a lent machine, from the repository root, with .devcheck carried
# (scripts/gpu_check/prepare.sh): rmkit against TRL for every recipe on one GPU, one section per process, most
# important first, each under its own timeout and all within BENCH_BUDGET seconds (default 330: the machine's
# 10-minute call limit leaves room for a second try). $OUT receives results.json (rewritten after every section),
# rm_profile.txt and log.txt. BENCH_SECTIONS picks the sections and their limits (below), BENCH_VARIANTS the
# reward-model sections' compiled runs (device_suite.py --variants), BENCH_PROFILE more device_suite.py arguments
# for the profile section (e.g. '--profile-precision bf16 --profile-override policy.compile=true').
# Dry run on a CPU (tiny models; slower than the GPU, hence a larger budget and per-section limits):
#   OUT=/tmp/out BENCH_DEVICE=cpu BENCH_TINY=1 BENCH_INSTALL=0 BENCH_THREADS=1 BENCH_BUDGET=900 BENCH_LIMIT_SCALE=3 \
#   PYTHON=.venv/bin/python bash scripts/gpu_check/bench.sh
set -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to the folder that receives the results}
DEVICE=${BENCH_DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
BUDGET=${BENCH_BUDGET:-330}
mkdir -p "$OUT"

run() {
    if [ "${BENCH_INSTALL:-1}" = 1 ]; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .devcheck/whl/*.whl \
            .devcheck/whl_bench/*.whl || return 1
    fi
    export PYTHONPATH=$PWD:$PWD/.devcheck/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false \
        HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1
    [ "$DEVICE" = cuda ] && nvidia-smi -L
    "$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    "$PYTHON" -c "import trl, datasets; print('trl', trl.__version__, 'datasets', datasets.__version__)" \
        || echo "TRL does not import: the TRL sides will fail, each section records it"
    local args=(--device "$DEVICE" --threads "${BENCH_THREADS:-8}" --data-dir .devcheck/data
                --work-dir "${BENCH_WORK:-/tmp/rmkit-device-suite}" --output "$OUT/results.json")
    [ "${BENCH_TINY:-0}" = 1 ] && args+=(--tiny)
    [ -n "${BENCH_VARIANTS+set}" ] && args+=(--variants "$BENCH_VARIANTS")
    # shellcheck disable=SC2206 # BENCH_PROFILE is a list of arguments
    [ -n "${BENCH_PROFILE:-}" ] && args+=(${BENCH_PROFILE})
    # section:seconds, in the order of importance (BENCH_SECTIONS, default below); a section gets what is left of
    # the budget at most.
    for entry in ${BENCH_SECTIONS:-setup:45 rm_minilm:240 rm_smollm2:200 score:40 profile:70 dpo:60 sft:60 grpo:70}; do
        local name=${entry%%:*} limit=$((${entry##*:} * ${BENCH_LIMIT_SCALE:-1})) left=$((BUDGET - SECONDS))
        if [ "$left" -lt 20 ]; then echo "section $name: skipped, ${left} s of the budget left"; continue; fi
        [ "$left" -lt "$limit" ] && limit=$left
        echo "== section $name (limit ${limit} s, at ${SECONDS} s)"
        timeout -k 5 "$limit" "$PYTHON" benchmarks/device_suite.py --section "$name" "${args[@]}" 2>&1 \
            | grep --line-buffered -v "Writing model shards"
        local status=${PIPESTATUS[0]}
        echo "section $name exit status $status at ${SECONDS} s"
        if [ "$status" = 124 ] || [ "$status" = 137 ]; then
            "$PYTHON" benchmarks/device_suite.py --record-timeout "$name:$limit" "${args[@]}"
        fi
    done
    echo "done in ${SECONDS} s"
}

run 2>&1 | tee "$OUT/log.txt"
