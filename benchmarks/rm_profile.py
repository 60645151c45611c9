"""Why rmkit's bf16 reward-model step is slower than its fp32 one: configs/rm.yaml's recipe under torch.profiler.

`rmkit train --config configs/rm.yaml` (validation, checkpoints and loggers off; `--backbone` instead of MiniLM's
packaged weights when given), once per precision, each in a fresh subprocess, for `--warmup-steps` +
`--timed-steps` + `--active-steps` optimizer steps. Per precision:

- `seconds_per_step`: the `--timed-steps` after the warmup, without the profiler, on the harness clock (from the
  end of the last warmup step to the end of the last timed one, `benchmarks/harness.py`);
- then `--active-steps` under torch.profiler (CPU, and CUDA on a GPU), per step: kernel launches (the CUDA
  runtime's launch calls), memcpy and synchronize calls, aten ops dispatched, the GPU's busy time (the sum of
  the kernels' self time; far below the step time = the GPU waits on the CPU, launch-bound), and the top ops by
  self CUDA time and by self CPU time.

The JSON (`--output`) holds the numbers, a `.txt` beside it the profiler's tables.

    python benchmarks/rm_profile.py --device cuda --output /tmp/rm_profile.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common, harness  # noqa: E402

PRECISIONS = {"fp32": "float32", "bf16": "bfloat16"}
# CUDA runtime / driver calls counted per step, by a substring of their profiler name.
RUNTIME_CALLS = {"kernel_launches": "LaunchKernel", "memcpy_calls": "Memcpy", "synchronize_calls": "Synchronize"}
TOP = 15


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--precision", default="fp32,bf16", help="comma list of fp32, bf16")
    parser.add_argument("--backbone", help="policy.model_name (default: configs/rm.yaml's, MiniLM)")
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--timed-steps", type=int, default=10)
    parser.add_argument("--active-steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="another dotted override of configs/rm.yaml (repeatable)")
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rmkit-rm-profile"))
    parser.add_argument("--output", type=Path, default=Path("/tmp/rmkit-rm-profile/rm_profile.json"))
    args = parser.parse_args(argv)
    args.precision = [p for p in args.precision.split(",") if p]
    if not args.precision or not set(args.precision) <= set(PRECISIONS):
        parser.error("--precision takes fp32,bf16")
    return args


# ---------------------------------------------------------------- inside the training process


class ProfiledSteps:
    """The profiler over the `active` torch optimizer steps after `warmup` + `timed` ones, started and stopped by
    the harness clock's step callback (its reading has waited for the last step's kernels)."""

    def __init__(self, warmup: int, timed: int, active: int, cuda: bool) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.start, self.stop = warmup + timed, warmup + timed + active
        self.profiler = profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])])

    def __call__(self, steps: int) -> None:
        if steps == self.start:
            self.profiler.start()
        elif steps == self.stop:
            self.profiler.stop()


def self_device_us(event) -> float:
    """An averaged event's self time on the GPU in microseconds (the attribute's name changed across torch)."""
    return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)


def summarize_profile(profiler, active: int) -> dict:
    """Per-step counts and the top ops of a stopped `profiler` over `active` steps."""
    from torch.autograd import DeviceType

    averages = profiler.key_averages()
    summary = {name: sum(e.count for e in averages if part in e.key) / active for name, part in RUNTIME_CALLS.items()}
    summary["aten_ops"] = sum(e.count for e in averages if e.key.startswith("aten::")) / active
    # Events that ran on the GPU (kernels, copies, fills): their summed duration is the GPU's busy time.
    busy_us = sum(e.time_range.elapsed_us() for e in profiler.events() if e.device_type == DeviceType.CUDA)
    summary["gpu_busy_s"] = busy_us / active / 1e6

    def top(key) -> list[dict]:
        rows = sorted((e for e in averages if key(e) > 0), key=key, reverse=True)[:TOP]
        return [{"op": e.key, "calls_per_step": e.count / active, "self_cuda_ms_per_step": self_device_us(e) / active / 1e3,
                 "self_cpu_ms_per_step": e.self_cpu_time_total / active / 1e3} for e in rows]

    summary["top_by_cuda_time"] = top(self_device_us)
    summary["top_by_cpu_time"] = top(lambda e: e.self_cpu_time_total)
    return summary


def worker(spec: dict) -> dict:
    """One profiled `rmkit train` in this (fresh) process; returns its numbers."""
    from rmkit.cli import main as rmkit_main

    profiled = ProfiledSteps(spec["warmup"], spec["timed"], spec["active"], spec["device"] == "cuda")
    clock = harness.PhaseClock(on_step=profiled)
    clock.watch()
    status = rmkit_main(["train", "--config", str(common.REPO_ROOT / "configs" / "rm.yaml"), *spec["overrides"]])
    clock.close()
    if status != 0:
        raise SystemExit(f"rmkit train exited with status {status}")
    if len(clock.step_ends) < profiled.stop:
        raise SystemExit(f"only {len(clock.step_ends)} optimizer steps: the data holds too few batches")
    seconds = clock.span(after_step=spec["warmup"], until_step=profiled.start)
    averages = profiled.profiler.key_averages()
    sort = "self_cuda_time_total" if spec["device"] == "cuda" else "self_cpu_time_total"
    tables = (f"sorted by {sort}\n{averages.table(sort_by=sort, row_limit=TOP)}\n"
              f"sorted by self_cpu_time_total\n{averages.table(sort_by='self_cpu_time_total', row_limit=TOP)}")
    return {"seconds_per_step": seconds / spec["timed"], "timed_steps": spec["timed"],
            "profiled_steps": spec["active"], **summarize_profile(profiled.profiler, spec["active"]),
            **clock.memory, "tables": tables}


# ---------------------------------------------------------------- orchestration


def run_precision(args: argparse.Namespace, precision: str) -> dict:
    run_dir = args.work_dir / precision
    run_dir.mkdir(parents=True, exist_ok=True)
    steps = args.warmup_steps + args.timed_steps + args.active_steps
    overrides = [
        f"data.train_data_path={common.data_file(args.data_dir, 'hh_harmless_train.jsonl')}",
        "data.val_data_paths={}",
        f"rm.max_num_steps={steps}", "rm.val_at_start=false", "rm.val_at_end=false", "rm.val_period=0",
        "checkpointing.enabled=false", f"checkpointing.checkpoint_dir={run_dir / 'out'}",
        "logger.tensorboard=false", "logger.plots=false", "logger.progress_bar=false",
        f"policy.precision={PRECISIONS[precision]}", f"policy.num_threads={args.threads}",
        *([f"policy.model_name={args.backbone}"] if args.backbone else []), *args.override]
    spec = {"device": args.device, "threads": args.threads, "warmup": args.warmup_steps, "timed": args.timed_steps,
            "active": args.active_steps, "overrides": overrides}
    return harness.launch(__file__, spec, run_dir, args.device, f"{precision} profile")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if harness.subcommand(argv, "rm_profile.py", worker):
        return 0
    args = parse_args(argv)
    results = {p: run_precision(args, p) for p in args.precision}
    tables = {p: r.pop("tables") for p, r in results.items()}
    payload = {"command": "python benchmarks/rm_profile.py " + " ".join(argv), "machine": common.machine_info(),
               "device": args.device, "config": "configs/rm.yaml", "backbone": args.backbone, "results": results}
    if {"fp32", "bf16"} <= set(results):
        payload["bf16_over_fp32"] = {k: results["bf16"][k] / results["fp32"][k] for k in
                                     ("seconds_per_step", "kernel_launches", "aten_ops", "gpu_busy_s")
                                     if results["fp32"][k]}
    common.write_json(args.output, payload)
    args.output.with_suffix(".txt").write_text("".join(
        f"== {p}: {r['seconds_per_step'] * 1e3:.1f} ms/step, {r['kernel_launches']:.0f} kernel launches/step, "
        f"{r['aten_ops']:.0f} aten ops/step, GPU busy {r['gpu_busy_s'] * 1e3:.1f} ms/step\n{tables[p]}\n"
        for p, r in results.items()))
    for p, r in results.items():
        print(f"{p}: {r['seconds_per_step'] * 1e3:.1f} ms/step, {r['kernel_launches']:.0f} launches/step, "
              f"{r['aten_ops']:.0f} aten ops/step, GPU busy {r['gpu_busy_s'] * 1e3:.1f} ms/step", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
