#!/usr/bin/env bash
# The environment of a benchmark's TRL side that needs another TRL release than rmkit's own .venv holds, in its own
# virtual environment in the repository root (or the folder given as $2):
#   ppo: TRL 1.12.0, the last release that ships a PPOTrainer (trl/experimental/ppo/; 1.13.0 removed it), in
#        .venv-trl112, for benchmarks/ppo_vs_trl.py;
#   prm: TRL 1.13.0, whose PRMTrainer lives in trl/experimental/prm/ (1.16 removed it), in .venv-trl113, for
#        benchmarks/prm_vs_trl.py.
# torch is the CPU build this machine serves from its local wheel cache (an unpinned torch may pull a CUDA build);
# transformers, accelerate and datasets are pinned to the versions of rmkit's .venv (both TRL releases ask for
# transformers>=4.56.2, accelerate>=1.4.0, datasets>=4.7.0), so both sides run the same model code and a benchmark
# can load TRL's saved model in rmkit's environment. Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    ppo) TRL=1.12.0; VENV=${2:-.venv-trl112}; CHECK="from trl.experimental.ppo import PPOConfig, PPOTrainer" ;;
    prm) TRL=1.13.0; VENV=${2:-.venv-trl113}; CHECK="from trl.experimental.prm import PRMConfig, PRMTrainer" ;;
    *) echo "usage: bash benchmarks/setup_trl_env.sh {ppo|prm} [VENV]" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3.11}
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    "$VENV/bin/pip" install -q "torch==2.13.0"
fi
"$VENV/bin/pip" install -q "trl==$TRL" "transformers==5.24.0" "accelerate==1.15.0" "datasets==5.2.0"
"$VENV/bin/python" -c "$CHECK; import trl; print('trl', trl.__version__)"
