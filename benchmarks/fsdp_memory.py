"""Per-rank memory of parameters + gradients + AdamW state under DDP and FSDP2, 2 processes (gloo, CPU).

A random Llama classifier of ~110M parameters (hidden 768, 12 layers, MLP 2048, vocab 32000: ~440 MB in
float32) is built on every rank, wrapped the way `rmkit train` wraps it (DDP: `wrap_data_parallel`;
FSDP2: the recipe's `shard_reward_model` with `policy.dtensor_cfg.enabled`), and trained for `--steps` AdamW
steps (rmkit's `build_optimizer`) on random token ids. After the last step, before the gradients are
cleared, each rank counts the bytes of the local storage of its parameters, gradients and optimizer
state (a DTensor counts its `to_local()` shard; storage shared by two tensors counts once), and reads
its peak RSS: over the steps alone (VmHWM reset after setup through /proc/self/clear_refs) and over the
whole process (`resource.getrusage`, which includes building the full model before it is sharded), and
the RSS after the imports alone (torch, transformers, rmkit: the same in both modes).

    python benchmarks/fsdp_memory.py              # both modes, writes benchmarks/results/fsdp_memory.json
    python benchmarks/fsdp_memory.py --markdown   # prints the BENCHMARKS.md table from the JSON

Each mode runs in its own `torchrun --nproc-per-node 2` launch (fresh processes, so peaks do not mix).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "fsdp_memory.json"
MODES = ("ddp", "fsdp2")
MIB = 1 << 20
SHAPE = ("hidden", "intermediate", "layers", "batch", "seq_len", "steps")
# glibc returns freed buffers over 128 KiB to the kernel, so RSS tracks what is live (as in logprobs_memory.py).
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
sys.path.insert(0, str(REPO))  # this checkout's rmkit, not an installed one


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def local_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (a DTensor's local shard, not its global size)."""
    from torch.distributed.tensor import DTensor

    seen = {}
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def build(mode: str, args):
    """The random classifier, wrapped for `mode` as `rmkit train` wraps it, its optimizer and forward."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from rmkit import distributed as dist
    from rmkit.config import config_from_dict
    from rmkit.trainer.optim import build_optimizer
    from rmkit.trainer.sharding import shard_reward_model

    info = dist.init_distributed()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=12, num_key_value_heads=12,
                         num_labels=1, pad_token_id=0, max_position_embeddings=512)
    model = LlamaForSequenceClassification(config)
    cfg = config_from_dict({"policy": {"dtensor_cfg": {"enabled": mode == "fsdp2"}}})
    if mode == "fsdp2":
        shard_reward_model(model, cfg.policy, info)
        forward = model
    else:
        forward = dist.wrap_data_parallel(model, info)
    return model, forward, build_optimizer(model, cfg.policy.optimizer), info


def worker(mode: str, args) -> None:
    """One rank: build, train `args.steps` steps, measure, write `rank_<r>.json` into `args.out`."""
    import torch

    from rmkit import distributed as dist

    torch.set_num_threads(1)
    import transformers  # noqa: F401  (the imports' RSS is the baseline: torch, transformers, rmkit)

    import rmkit.recipes.rm  # noqa: F401

    baseline = _status_kib("VmRSS") * 1024
    model, forward, optimizer, info = build(mode, args)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS: the steps' peak from here on
    generator = torch.Generator().manual_seed(info.rank)
    for step in range(args.steps):
        if step:  # the last step's gradients stay: they are counted
            optimizer.zero_grad(set_to_none=True)
        ids = torch.randint(1, 32000, (args.batch, args.seq_len), generator=generator)
        forward(input_ids=ids).logits.float().sum().backward()
        optimizer.step()
    params = list(model.parameters())
    result = {
        "mode": mode, "rank": info.rank, "world_size": dist.world_size(),
        "global_params": sum(p.numel() for p in params),
        "param_bytes": local_bytes(params),
        "grad_bytes": local_bytes(p.grad for p in params if p.grad is not None),
        "optimizer_bytes": local_bytes(v for s in optimizer.state.values() for v in s.values()
                                       if isinstance(v, torch.Tensor)),
        "rss_imports_bytes": baseline,
        "rss_now_bytes": _status_kib("VmRSS") * 1024,
        "peak_rss_steps_bytes": _status_kib("VmHWM") * 1024,
        "peak_rss_process_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }  # fmt: skip
    result["total_bytes"] = result["param_bytes"] + result["grad_bytes"] + result["optimizer_bytes"]
    Path(args.out, f"rank_{info.rank}.json").write_text(json.dumps(result))
    dist.destroy()


def run_mode(mode: str, args) -> list[dict]:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
               "127.0.0.1", "--master-port", str(args.port), __file__, "--worker", mode, "--out", out,
               *_shape_args(args)]  # fmt: skip
        subprocess.run(cmd, env={**os.environ, **CHILD_ENV}, check=True)
        return [json.loads(Path(out, f"rank_{r}.json").read_text()) for r in range(2)]


def _shape_args(args) -> list[str]:
    return [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in SHAPE]


def markdown(payload: dict) -> str:
    """The BENCHMARKS.md table: MiB per rank, and FSDP2 / DDP."""
    from benchmarks import harness

    rows = {(r["mode"], r["rank"]): r for r in payload["ranks"]}
    keys = [("param_bytes", "parameters"), ("grad_bytes", "gradients"), ("optimizer_bytes", "AdamW state"),
            ("total_bytes", "**params + grads + AdamW**"), ("peak_rss_steps_bytes", "peak RSS during the steps"),
            ("peak_rss_process_bytes", "peak RSS of the process (setup included)"),
            ("rss_imports_bytes", "RSS after the imports (torch, transformers, rmkit)")]  # fmt: skip
    lines = []
    for key, name in keys:
        values = [rows[(mode, r)][key] / MIB for mode in MODES for r in (0, 1)]
        lines.append([name, *(f"{v:,.1f}" for v in values), f"{values[2] / values[0]:.2f}"])
    head = ["per rank (MiB)", "DDP rank 0", "DDP rank 1", "FSDP2 rank 0", "FSDP2 rank 1", "FSDP2 / DDP (rank 0)"]
    return harness.markdown(head, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--markdown", action="store_true", help="print the table from the results JSON")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--port", type=int, default=29531)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args)
    if args.markdown:
        return print(markdown(json.loads(RESULTS.read_text())))
    from benchmarks.common import machine_info, write_json

    ranks = [row for mode in MODES for row in run_mode(mode, args)]
    payload = {"machine": machine_info(), "command": " ".join(["python benchmarks/fsdp_memory.py", *sys.argv[1:]]),
               "shape": {k: getattr(args, k) for k in SHAPE}, "ranks": ranks}
    write_json(RESULTS, payload)
    print(markdown(payload))


if __name__ == "__main__":
    main()
