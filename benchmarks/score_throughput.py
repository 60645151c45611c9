"""Scoring throughput: rmkit's batch scorer against transformers' `pipeline("text-classification")`.

One exported reward model (default: MiniLM with a seeded 1-label head; `--model DIR` for a trained one),
the held-out pairs of `hh_harmless_val.jsonl`, each pair scored as two texts (prompt + chosen, prompt +
rejected). Timed, after the model is loaded and warmed up, in this one process:

- `rmkit`: the inference core, `rmkit.inference`, as `rmkit score` uses it: `load_scorer(model,
  max_length=--max-length)`, then `encode_pairs` (each side of a pair cut on its own) plus `score_ids`
  (length-sorted, token-budgeted batches, inference mode);
- `rmkit_btN` (`--batch-tokens N,...`): the same with a budget of N padded tokens per forward pass instead of the
  device's default (`rmkit.models.scoring.default_batch_tokens`; `rmkit score --batch-tokens N`);
- `pipeline bs=1`: one text per pipeline call, the way most scripts use it;
- `pipeline bs=B`: the whole list in one call with the pipeline's own `batch_size` batching;
- `rmkit score` (the CLI, `--cli`): the whole command as a subprocess, start-up and model loading included.

Pairs/s are medians over `--repeats`; the ratio is rmkit over the pipeline's best setting. Each setting also
gets its model FLOP utilization: 2 x non-embedding parameters x the tokens scored, over its time, against
the fp32 matmul peak measured in the same run; `ceiling_pairs_per_s` is the pairs/s that would take 100%.

`--device cuda` runs the model (one object, shared by both paths) on the GPU, with CUDA synchronized before each
clock reading; `--precision bf16` runs both paths under bf16 autocast (rmkit `precision="bfloat16"`, the
pipeline inside `torch.autocast`), and the peak is then measured in bf16.

    python benchmarks/score_throughput.py
    python benchmarks/score_throughput.py --pairs 64 --batch-sizes 1,16 --repeats 1
    python benchmarks/score_throughput.py --batch-sizes "" --batch-tokens 1024,4096,16384 --repeats 1
    python benchmarks/score_throughput.py --device cuda --precision bf16 --batch-sizes 1,64 --threads 8
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import common, harness  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="exported reward model (default: MiniLM, seeded head)")
    parser.add_argument("--data", type=Path, default=common.DEFAULT_DATA_DIR / "hh_harmless_val.jsonl")
    parser.add_argument("--pairs", type=int, help="score the first N pairs (default: all)")
    parser.add_argument("--batch-sizes", default="1,8,32,64",
                        help="pipeline settings; 1 = one text per call; empty: no pipeline")
    parser.add_argument("--batch-tokens", default="",
                        help="rmkit's padded tokens per forward pass to time beside the device's default, comma list")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast, both paths")
    parser.add_argument("--cli", action="store_true", help="also time the `rmkit score` command end to end")
    parser.add_argument(
        "--output", type=Path, default=common.REPO_ROOT / "benchmarks" / "results" / "score_throughput.json"
    )
    args = parser.parse_args(argv)
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    args.batch_tokens = [int(b) for b in args.batch_tokens.split(",") if b]
    return args


def rmkit_scores(scorer, records) -> torch.Tensor:
    """Rewards `[2N]` interleaved `[c0, r0, ...]`: the inference core's encoding (each side cut on its own)
    and batch scoring, as `rmkit score` does."""
    tokenized = scorer.encode_pairs(records)
    rows = [seq for p in tokenized.pairs for seq in (p.chosen_ids, p.rejected_ids)]
    return scorer.score_ids(rows)[:, 0]


def pipeline_scores(pipe, texts: list[str], batch_size: int, max_length: int, bf16: bool = False) -> torch.Tensor:
    """Raw scores `[len(texts)]` from the pipeline; batch size 1 calls it once per text; `bf16`: under autocast."""
    kwargs = {"truncation": True, "max_length": max_length, "function_to_apply": "none"}
    with torch.autocast(pipe.device.type, dtype=torch.bfloat16, enabled=bf16):
        if batch_size == 1:
            outputs = [pipe(text, **kwargs)[0] for text in texts]
        else:
            outputs = pipe(texts, batch_size=batch_size, **kwargs)
    return torch.tensor([out["score"] for out in outputs])


def timed(fn, repeats: int) -> tuple[float, object]:
    """Median seconds of `repeats` calls of `fn()` and the last result."""
    times, result = [], None
    for _ in range(repeats):
        start = common.synchronized_time()
        result = fn()
        times.append(common.synchronized_time() - start)
    return common.median(times), result


def time_cli(model_dir: Path, data: Path, threads: int, max_length: int) -> float:
    """Wall seconds of `python -m rmkit score` on `data`, process start-up and model loading included."""
    env = {**os.environ, "PYTHONPATH": str(common.REPO_ROOT), "OMP_NUM_THREADS": str(threads)}
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-m",
            "rmkit",
            "score",
            "--model",
            str(model_dir),
            "--input",
            str(data),
            "--max-length",
            str(max_length),
            "--threads",
            str(threads),
            "--output",
            str(Path(tmp) / "scored.jsonl"),
        ]
        start = time.perf_counter()
        subprocess.run(command, env=env, check=True, capture_output=True)
        return time.perf_counter() - start


def markdown_table(payload: dict) -> str:
    """The results as the BENCHMARKS.md table (pairs/s, seconds and MFU per setting, then the ratio)."""
    rows = [[name, f"{value['seconds']:.2f}", f"{value['pairs_per_s']:.1f}",
             f"{100 * value['mfu']:.1f}%" if "mfu" in value else ""]
            for name, value in payload["results"].items() if isinstance(value, dict)]
    if "ratio_rmkit_over_best_pipeline" in payload["results"]:
        ratio = payload["results"]["ratio_rmkit_over_best_pipeline"]
        rows.append(["**rmkit / best pipeline**", "", f"**{ratio:.2f}x**", ""])
    if "ceiling_pairs_per_s" in payload:
        rows.append([f"{payload.get('precision', 'fp32')} matmul peak, all FLOPs useful (ceiling)", "",
                     f"{payload['ceiling_pairs_per_s']:.1f}", "100%"])
    return harness.markdown(["setting", "seconds", "pairs/s", "MFU"], rows)


def main(argv: list[str] | None = None) -> int:
    from transformers import pipeline

    from rmkit.data import load_preference_data
    from rmkit.inference import load_scorer

    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    info = common.machine_info()
    model_dir = args.model or common.export_reward_model(
        common.minilm_path(), Path(tempfile.gettempdir()) / "rmkit-score-bench-model", seed=0
    )
    records = load_preference_data(args.data).records[: args.pairs]
    data_file = args.data
    if args.pairs:  # the CLI reads a file: give it exactly the pairs scored in process
        data_file = Path(tempfile.gettempdir()) / "rmkit-score-bench.jsonl"
        data_file.write_text("".join(args.data.read_text().splitlines(keepends=True)[: args.pairs]))
    texts = [r.prompt + response for r in records for response in (r.chosen, r.rejected)]
    bf16 = args.precision == "bf16"
    scorer = load_scorer(model_dir, device=args.device, dtype="float32", precision="bfloat16" if bf16 else "float32",
                         max_length=args.max_length)
    model, tokenizer = scorer.model, scorer.tokenizer  # the pipeline runs the very same model object
    pipe = pipeline("text-classification", model=model, tokenizer=tokenizer, device=args.device)

    # Warm up both paths (first-call allocations, kernel selection) outside the timings.
    rmkit_scores(scorer, records[:4])
    pipeline_scores(pipe, texts[:8], 1, args.max_length, bf16)

    # Model FLOPs of the workload: 2 x non-embedding parameters per token scored (the inference core's encoding).
    tokenized = scorer.encode_pairs(records).pairs
    tokens = sum(len(p.chosen_ids) + len(p.rejected_ids) for p in tokenized)
    flops = 2 * common.non_embedding_params(model) * tokens
    on_gpu = {"size": 8192, "device": "cuda"} if args.device == "cuda" else {}
    peak = common.matmul_peak_flops(torch.bfloat16 if bf16 else torch.float32, args.threads, **on_gpu)

    def measured(seconds: float) -> dict:
        return {"seconds": seconds, "pairs_per_s": len(records) / seconds, "mfu": flops / seconds / peak}

    results = {}
    seconds, rewards = timed(lambda: rmkit_scores(scorer, records), args.repeats)
    results["rmkit"] = measured(seconds)
    default_budget, budget_difference = scorer.max_batch_tokens, 0.0
    for budget in args.batch_tokens:
        scorer.max_batch_tokens = budget
        seconds, scores = timed(lambda: rmkit_scores(scorer, records), args.repeats)
        results[f"rmkit_bt{budget}"] = measured(seconds)
        budget_difference = max(budget_difference, (scores - rewards).abs().max().item())
    scorer.max_batch_tokens = default_budget
    # The pipeline keeps a text's first tokens; rmkit keeps its leading special tokens and its last tokens.
    # Compare where neither truncates: texts that fit (each side of a pair is cut on its own).
    fits = torch.tensor([len(ids) <= args.max_length for ids in tokenizer(texts).input_ids])
    max_diff = 0.0
    for batch_size in args.batch_sizes:
        seconds, scores = timed(
            lambda b=batch_size: pipeline_scores(pipe, texts, b, args.max_length, bf16), args.repeats
        )
        results[f"pipeline_bs{batch_size}"] = measured(seconds)
        max_diff = max(max_diff, (scores - rewards.cpu())[fits].abs().max().item())
    if args.batch_sizes:
        best = max((v for k, v in results.items() if k.startswith("pipeline")), key=lambda v: v["pairs_per_s"])
        results["ratio_rmkit_over_best_pipeline"] = results["rmkit"]["pairs_per_s"] / best["pairs_per_s"]
    if args.cli:
        seconds = time_cli(model_dir, data_file, args.threads, args.max_length)
        results["rmkit_score_cli"] = {"seconds": seconds, "pairs_per_s": len(records) / seconds}
    payload = {
        "command": "python benchmarks/score_throughput.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": info,
        "model": str(model_dir),
        "data": str(args.data),
        "pairs": len(records),
        "threads": args.threads,
        **({"device": args.device, "precision": args.precision} if args.device != "cpu" or bf16 else {}),
        "rmkit_batch_tokens": default_budget,
        "max_abs_reward_difference_vs_pipeline": max_diff,
        "max_abs_reward_difference_across_batch_tokens": budget_difference,
        "tokens": tokens,
        "model_flops": flops,
        "matmul_peak_flops": peak,
        "ceiling_pairs_per_s": len(records) / (flops / peak),
        "results": results,
    }
    common.write_json(args.output, payload)
    print(markdown_table(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
