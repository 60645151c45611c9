"""Peak extra memory and time of per-token log-probs: rmkit's chunked path vs the naive one.

Naive: `torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None])`.
Chunked: `rmkit.losses.next_token_logprobs` (fused float32 log-softmax per chunk; the backward
recomputes the softmax per chunk). In-place: the same with `inplace_backward=True` (the backward
writes the gradient into the logits' storage).

Each (variant, vocab, dtype) runs in a fresh subprocess, forward then forward+backward: it builds the
logits, resets the kernel's peak-RSS counter (`/proc/self/clear_refs`), runs the variant once and
reads VmHWM; peak extra memory = VmHWM - RSS before the call (the gradient of the logits, which any
backward returns, is included for both). Then it times `--repeats` further calls (median).

    python benchmarks/logprobs_memory.py            # writes benchmarks/results/logprobs_memory.json
    python benchmarks/logprobs_memory.py --quick    # smaller shapes, a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "logprobs_memory.json"
MODES = ("fwd", "fwd+bwd")
VARIANTS = ("naive", "chunked", "inplace")
# A fixed mmap threshold makes glibc return every freed buffer over 128 KiB to the kernel, so RSS
# before a measurement does not include scratch that an earlier one freed (and VmHWM sees it all).
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "PYTHONPATH": str(REPO)}
sys.path.insert(0, str(REPO))  # this checkout's rmkit, not an installed one


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _child(variant: str, vocab: int, dtype_name: str, batch: int, seq: int, repeats: int) -> list[dict]:
    """Both modes of one variant, forward first, in this (fresh) process."""
    return [_child_mode(variant, vocab, dtype_name, mode, batch, seq, repeats) for mode in MODES]


def _child_mode(
    variant: str, vocab: int, dtype_name: str, mode: str, batch: int, seq: int, repeats: int
) -> dict:
    import torch

    from rmkit.losses import next_token_logprobs

    torch.manual_seed(0)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    logits = torch.randn(batch, seq, vocab).to(dtype).requires_grad_(mode == "fwd+bwd")
    ids = torch.randint(0, vocab, (batch, seq))

    def naive():
        return torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)

    fn = {
        "naive": naive,
        "chunked": lambda: next_token_logprobs(logits, ids),
        "inplace": lambda: next_token_logprobs(logits, ids, inplace_backward=True),
    }[variant]

    def run():
        if mode == "fwd":
            with torch.no_grad():
                return fn()
        out = fn()
        return torch.autograd.grad(out, logits, torch.ones_like(out))[0]

    # Warm up both paths, backward included, on a small input: one-time costs (kernels, the autograd
    # engine's first use) must not count as either variant's extra memory.
    small = torch.randn(2, 3, vocab).to(dtype).requires_grad_()
    small_ids = torch.zeros(2, 3, dtype=torch.long)
    for out in (torch.log_softmax(small.float(), -1)[:, :-1, 0], next_token_logprobs(small, small_ids)):
        torch.autograd.grad(out, small, torch.ones_like(out))
    logits_mib = logits.numel() * logits.element_size() / 2**20
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status_kib("VmRSS")
    result = run()
    peak = _status_kib("VmHWM")
    del result
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return {
        "variant": variant,
        "vocab": vocab,
        "dtype": dtype_name,
        "mode": mode,
        "shape": [batch, seq, vocab],
        "logits_mib": logits_mib,
        "peak_extra_mib": (peak - before) / 1024,
        "time_s": statistics.median(times),
        "times_s": times,
    }


def _measure(args, variant, vocab, dtype) -> dict[str, dict]:
    cmd = [sys.executable, __file__, "--child", variant, str(vocab), dtype, str(args.batch), str(args.seq)]
    cmd.append(str(args.repeats))
    env = {**os.environ, **CHILD_ENV}
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return {row["mode"]: row for row in json.loads(out.stdout.strip().splitlines()[-1])}


def markdown_table(results: list[dict]) -> str:
    """The BENCHMARKS.md table: one line per (vocab, dtype, mode), each variant relative to naive."""
    from benchmarks.harness import markdown

    head = ["V", "logits", "mode", "naive peak extra", "chunked peak extra (ratio)", "in-place peak extra (ratio)",
            "naive time", "chunked time (ratio)", "in-place time (ratio)"]
    rows = []
    for naive, chunked, inplace in zip(results[0::3], results[1::3], results[2::3]):
        cells = [f"{naive['vocab']}", f"{naive['dtype']} {naive['shape']}", naive["mode"]]
        cells.append(f"{naive['peak_extra_mib']:.1f} MiB")
        for row in (chunked, inplace):
            ratio = row["peak_extra_mib"] / naive["peak_extra_mib"] if naive["peak_extra_mib"] else float("nan")
            cells.append(f"{row['peak_extra_mib']:.1f} MiB ({ratio:.3f})")
        cells.append(f"{naive['time_s']:.3f} s")
        for row in (chunked, inplace):
            cells.append(f"{row['time_s']:.3f} s ({row['time_s'] / naive['time_s']:.2f})")
        rows.append(cells)
    return markdown(head, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 150000])
    parser.add_argument("--dtype", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="batch 1, seq 64: a smoke test")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--markdown", action="store_true", help="print the table of --output and exit")
    args = parser.parse_args(argv)
    if args.child:
        v, vocab, dtype, batch, seq, repeats = args.child
        print(json.dumps(_child(v, int(vocab), dtype, int(batch), int(seq), int(repeats))))
        return 0
    if args.markdown:
        print(markdown_table(json.loads(args.output.read_text())["results"]))
        return 0
    if args.quick:
        args.batch, args.seq, args.repeats = 1, 64, 2

    import torch

    from rmkit.losses.logprobs import DEFAULT_CHUNK_ELEMENTS

    rows = []
    for vocab in args.vocab:
        for dtype in args.dtype:
            measured = {variant: _measure(args, variant, vocab, dtype) for variant in VARIANTS}
            for mode in MODES:
                naive = measured["naive"][mode]
                rows += [measured[variant][mode] for variant in VARIANTS]
                line = f"V={vocab:>6} {dtype} {mode:<7} naive {naive['peak_extra_mib']:8.1f} MiB {naive['time_s']:.3f} s"
                for variant in VARIANTS[1:]:
                    row = measured[variant][mode]
                    line += (
                        f" | {variant} {row['peak_extra_mib']:8.1f} MiB {row['time_s']:.3f} s "
                        f"(memory x{row['peak_extra_mib'] / naive['peak_extra_mib']:.3f} "
                        f"time x{row['time_s'] / naive['time_s']:.2f})"
                    )
                print(line, flush=True)
    machine = {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "torch_threads": args.threads or torch.get_num_threads(),
        "loadavg_at_end": Path("/proc/loadavg").read_text().split()[:3],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    settings = {
        "batch": args.batch,
        "seq": args.seq,
        "repeats": args.repeats,
        "chunk_elements": DEFAULT_CHUNK_ELEMENTS,
        "command": "python benchmarks/logprobs_memory.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    args.output.write_text(
        json.dumps({"machine": machine, "settings": settings, "results": rows}, indent=1) + "\n"
    )
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
