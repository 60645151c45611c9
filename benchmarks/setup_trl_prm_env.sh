#!/usr/bin/env bash
# The environment of benchmarks/prm_vs_trl.py's TRL side: TRL 1.13.0 (its PRMTrainer lives in trl/experimental/prm/)
# in its own virtual environment, .venv-trl113 in the repository root (or the folder given as $1). torch is the CPU
# build this machine serves from its local wheel cache (an unpinned torch may pull a CUDA build); transformers,
# accelerate and datasets are pinned to the versions of rmkit's .venv (TRL 1.13.0 asks for transformers>=4.56.2,
# accelerate>=1.4.0, datasets>=4.7.0, all met), so both sides run the same model code and the benchmark can load
# TRL's saved token classifier in rmkit's environment. Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-trl113}
PY=${PYTHON:-python3.11}
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    "$VENV/bin/pip" install -q "torch==2.13.0"
fi
"$VENV/bin/pip" install -q "trl==1.13.0" "transformers==5.24.0" "accelerate==1.15.0" "datasets==5.2.0"
"$VENV/bin/python" -c "from trl.experimental.prm import PRMConfig, PRMTrainer; import trl; print('trl', trl.__version__)"
