#!/bin/bash
# On a lent GPU machine, from the repository root, with .devcheck carried (scripts/gpu_check/prepare.sh):
# the test suite with every in-process recipe on cuda:0, then `rmkit serve --device cuda` against
# `--device cpu` over HTTP. Logs and the JUnit report go to $OUT. Arguments replace pytest's default `tests`.
set -o pipefail
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .devcheck/whl/*.whl || exit 1
mkdir -p ../shared && cp -r .devcheck/data ../shared/
export PYTHONPATH=$PWD:$PWD/.devcheck/site PYTHONUNBUFFERED=1 RMKIT_SLOW=1 TOKENIZERS_PARALLELISM=false
nvidia-smi -L
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
timeout "${PYTEST_LIMIT:-300}" python3 -m pytest -q -p no:cacheprovider -n 10 --timeout 300 -rfE --durations=10 \
    --junitxml "$OUT/junit.xml" --ignore tests/serve/test_openapi.py --ignore tests/bench --ignore tests/data \
    "${@:-tests}" 2>&1 | tee "$OUT/pytest.log"
echo "pytest exit status $?"
timeout 200 python3 scripts/gpu_check/serve_devices.py cuda 2>&1 | grep -v "Writing model" | tee "$OUT/serve.log"
