"""How every benchmark measures: one clock with named phases, one worker launcher, one memory probe, one
markdown table writer.

The clock. Both sides of a comparison are timed by one `PhaseClock` in their worker process, hooked into either
trainer the same way: a forward pre-hook on the input embeddings (`watch(model)`, or with no model every
word-embedding table of the process, for a trainer run through a CLI) and a post hook on every torch optimizer
step (wrappers that forward to one, accelerate's, are not counted twice). Each reading waits for the queued
CUDA work (`common.synchronized_time`). The clock is in at most one phase at a time:

- `training` is opened by a training forward (train mode, grad enabled) and counted up to the end of the last
  optimizer step before another phase opens. A run with no other phase is timed from its first training
  forward to the end of its last optimizer step: loading, tokenization, evaluation and saving fall outside,
  the data loading between steps inside;
- the `before_training` phase of `watch` (DPO's `reference`) is opened by the first forward while no phase is
  open and nothing has trained yet, and closed by the first training forward;
- `timed(fn, name)` makes every call of `fn` a phase `name`, from the call to its return (GRPO's generation,
  reward scoring and log-prob passes; DPO's weights hash).

`span(after_step=k)` is the training timeline from the end of optimizer step k (0: the first training forward)
to the end of the last one (or of `until_step`): untimed warmup steps are left out this way. `steps` holds, at the end of each
optimizer step, the cumulative seconds per phase, from which `per_step` gives each step's share.

The memory probe (`memory_peaks`) is read by the clock at the end of every optimizer step, so a worker reports
the peaks up to the end of its training, whatever it saves afterwards.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from benchmarks import common

WORD_TABLE_ROWS = 1024  # smaller embedding tables (positions, token types) are not a model's input


def resident_peak_mib() -> float:
    """This process's own peak resident set so far, Linux's VmHWM. Not `ru_maxrss`: a process started by another
    (fork, then exec) inherits the resident set its parent had at the fork as its floor, so a worker smaller than the
    script that launched it would report the script's memory."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("/proc/self/status has no VmHWM line: the peak memory needs Linux")


def memory_peaks() -> dict:
    """`peak_rss_mib`: this process's peak resident set so far (`resident_peak_mib`); `peak_gpu_mib`:
    `torch.cuda.max_memory_allocated()`, only where this process used CUDA."""
    peaks = {"peak_rss_mib": resident_peak_mib()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        peaks["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return peaks


class PhaseClock:
    """Named phases on one synchronized clock, hooked into a trainer from outside (the module docstring says
    how each phase opens and closes). `on_step(n)` is called after the reading at the end of optimizer step n."""

    def __init__(self, on_step: Callable[[int], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}  # closed time per phase
        self.forwards: dict[str, int] = {}  # training forwards, and the others per (non-training) open phase
        self.training_tokens = 0  # ids embedded by training forwards, padding included
        self.step_ends: list[float] = []
        self.steps: list[dict[str, float]] = []  # cumulative seconds per phase at each step's end
        self.memory: dict = {}  # memory_peaks() at the last optimizer step
        self.first_start: float | None = None
        self.training_start: float | None = None
        self._phase: str | None = None
        self._since = 0.0
        self._before_training: str | None = None
        self._on_step_callback = on_step
        self._handles = [register_optimizer_step_post_hook(lambda opt, args, kwargs: self._on_step(opt))]

    def watch(self, model: torch.nn.Module | None = None, before_training: str | None = None) -> None:
        """Hook the input embeddings of `model` (None: every word-embedding table in this process). A plain
        function is registered, not a bound method, so a deep copy of `model` (a reference) reports here too."""
        self._before_training = before_training
        if model is None:
            def hook(module, inputs):
                if isinstance(module, torch.nn.Embedding) and module.num_embeddings >= WORD_TABLE_ROWS:
                    self._on_forward(module, inputs)
            self._handles.append(torch.nn.modules.module.register_module_forward_pre_hook(hook))
        else:
            self._handles.append(model.get_input_embeddings().register_forward_pre_hook(
                lambda module, inputs: self._on_forward(module, inputs)))

    def watch_loaded(self, recipe, before_training: str | None = None) -> None:
        """`watch` every model an rmkit recipe module's `load_training_policy` loads from now on (the module
        attribute is replaced: the recipe looks it up when it runs)."""
        load = recipe.load_training_policy

        def load_watched(*args, **kwargs):
            model, tokenizer = load(*args, **kwargs)
            self.watch(model, before_training)
            return model, tokenizer

        recipe.load_training_policy = load_watched

    def watch_rl_phases(self, recipe) -> None:
        """Time an RL recipe's phases (`rmkit.recipes.grpo` or `ppo`): generation and reward calculation (in
        `rmkit.rl.rollout`), the log-prob passes (the recipe's own and the reference's in `rmkit.rl.logprobs`);
        module attributes replaced, as the recipe looks them up when it runs."""
        from rmkit.rl import logprobs, rollout

        rollout.generate_rollout = self.timed(rollout.generate_rollout, "generation")
        rollout.score_rollout = self.timed(rollout.score_rollout, "reward_calculation")
        timed_logprobs = self.timed(logprobs.batch_logprobs, "logprobs")
        logprobs.batch_logprobs = recipe.batch_logprobs = timed_logprobs

    def timed(self, fn: Callable, name: str) -> Callable:
        """`fn`, each call of it a phase `name` (no phase is open after it returns)."""
        @functools.wraps(fn)
        def phase(*args, **kwargs):
            self.switch(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.switch(None)
        return phase

    def switch(self, name: str | None) -> None:
        """Close the open phase (training: at its last optimizer step) and open `name` (None: no phase)."""
        now = common.synchronized_time()
        self._close(now)
        self._phase, self._since = name, now
        if name is not None and self.first_start is None:
            self.first_start = now
        if name == "training" and self.training_start is None:
            self.training_start = now

    def span(self, after_step: int = 0, until_step: int | None = None) -> float:
        """Seconds from the end of optimizer step `after_step` (0: the first training forward) to the end of step
        `until_step` (None: the last one)."""
        until = len(self.step_ends) if until_step is None else until_step
        if self.training_start is None or not after_step < until <= len(self.step_ends):
            raise SystemExit(f"{len(self.step_ends)} optimizer steps, a training forward "
                             f"{'seen' if self.training_start else 'never seen'}: no span from step {after_step} "
                             f"to {until}")
        return self.step_ends[until - 1] - (self.step_ends[after_step - 1] if after_step else self.training_start)

    def per_step(self) -> list[dict[str, float]]:
        """Each optimizer step's seconds per phase, and `total`: from the end of the step before (the first
        step: the first phase's start) to the end of this one, time in no phase included."""
        out, before, start = [], {}, self.first_start
        for cumulative, end in zip(self.steps, self.step_ends):
            out.append({**{k: v - before.get(k, 0.0) for k, v in cumulative.items()}, "total": end - start})
            before, start = cumulative, end
        return out

    def close(self) -> dict[str, float]:
        """Remove the hooks, close the open phase; returns the seconds per phase."""
        for handle in self._handles:
            handle.remove()
        self.switch(None)
        return dict(self.seconds)

    def _close(self, now: float) -> None:
        if self._phase is None:
            return
        end = now
        if self._phase == "training":  # counted to its last optimizer step, if one ended in it
            end = self.step_ends[-1] if self.step_ends and self.step_ends[-1] > self._since else self._since
        self.seconds[self._phase] = self.seconds.get(self._phase, 0.0) + end - self._since

    def _on_forward(self, module: torch.nn.Module, inputs: tuple) -> None:
        training = module.training and torch.is_grad_enabled()
        if training and self._phase != "training":
            self.switch("training")
        elif not training and self._phase is None and self._before_training and self.training_start is None:
            self.switch(self._before_training)
        if training or self._phase not in (None, "training"):  # a no-grad forward while training is not one
            self.forwards[self._phase] = self.forwards.get(self._phase, 0) + 1
        if training and inputs and isinstance(inputs[0], torch.Tensor):
            self.training_tokens += inputs[0].numel()

    def _on_step(self, optimizer) -> None:
        if not type(optimizer).__module__.startswith("torch."):  # a wrapper forwarding to a torch optimizer
            return
        now = common.synchronized_time()
        self.step_ends.append(now)
        self.memory = memory_peaks()
        cumulative = dict(self.seconds)
        if self._phase is not None:
            cumulative[self._phase] = cumulative.get(self._phase, 0.0) + now - self._since
        self.steps.append(cumulative)
        if self._on_step_callback is not None:
            self._on_step_callback(len(self.step_ends))


# ---------------------------------------------------------------- workers


def launch(script: str | Path, spec: dict, run_dir: Path, device: str, label: str,
           python: str | Path = sys.executable) -> dict:
    """Run `PYTHON SCRIPT worker RUN_DIR/spec.json` in a fresh process (`python`: this interpreter, or another
    environment's, e.g. an older TRL's) and return the result it wrote, with `wall_s` (the whole process).
    `spec["threads"]` sets the torch and OpenMP threads; `device` cpu hides the
    GPUs (rmkit takes CUDA whenever it sees it, `rmkit.distributed.init_distributed`), cuda leaves them
    visible. Output streams to RUN_DIR/log.txt, so a slow run can be watched; a failed run stops the
    benchmark with the log's tail."""
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_path, log_path = run_dir / "spec.json", run_dir / "log.txt"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(common.REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": str(spec["threads"]), "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1",
           **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {})}
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.run([str(python), str(script), "worker", str(spec_path)], env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{label} failed (log: {log_path}):\n{log_path.read_text()[-3000:]}")
    return {**json.loads((run_dir / "result.json").read_text()), "wall_s": wall}


def subcommand(argv: list[str], script: str, worker: Callable[[dict], dict],
               table: Callable[[dict], str] | None = None) -> bool:
    """The subcommands a benchmark script takes instead of its options: `worker SPEC.json` (one run, in the
    fresh process `launch` started: `worker(spec)`'s result goes to result.json beside the spec) and
    `table RESULTS.json` (print the results' markdown table again). True when `argv` was one of them."""
    if argv[:1] == ["worker"]:
        spec_path = Path(argv[1])
        spec = json.loads(spec_path.read_text())
        torch.set_num_threads(spec["threads"])
        common.write_json(spec_path.with_name("result.json"), worker(spec))
        return True
    if argv[:1] == ["table"] and table is not None:
        if len(argv) != 2:
            raise SystemExit(f"usage: python benchmarks/{script} table RESULTS.json")
        print(table(json.loads(Path(argv[1]).read_text())))
        return True
    return False


# ---------------------------------------------------------------- tables


def markdown(head: list[str], rows: list[list]) -> str:
    """A markdown table: the `head` line, then one line per row of formatted cells (short rows padded with
    empty cells)."""
    def line(cells: list) -> str:
        return "|" + "".join(f" {c} |" if c != "" else " |" for c in cells)

    rows = [list(row) + [""] * (len(head) - len(row)) for row in rows]
    return "\n".join([line(head), "|" + "---|" * len(head), *map(line, rows)])
