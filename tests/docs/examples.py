"""The documentation's examples: every fenced block of `docs/**/*.md`, what the page says about it, and how
`test_examples.py` runs a page's blocks in a copy of the repository.

What a page can say, in an HTML comment on the lines before a block (the site does not show it):
- `<!-- illustrative: REASON -->`: the block is not run (it needs GPUs, hours, the network, ...);
  `<!-- illustrative-page: REASON -->` anywhere on a page says it of every block of the page.
- `<!-- exits N -->`: the block's last command exits with status N (default 0; every other command with 0).
- `<!-- output -->` before a `text` block: each of its lines appears in what the block before printed.

`bash` blocks run one command per line (a trailing backslash continues it; `#` starts a comment); `export
NAME=VALUE` sets a variable for the rest of the page. `rmkit ...` runs in this process (`rmkit.cli.main`, the
console script's function: no torch start-up per command), with the tiny overrides of `tiny_overrides`
appended to the training commands (`shrunk`: a key the command sets itself keeps its value, except the model); `rmkit serve ...` starts a real server in the background and goes on when
`/health` answers; anything else runs in bash. `python` blocks run in this process, each on its own. Port 8000
on a page becomes a free port. `yaml` blocks are config snippets (`tests/config/test_shipped_configs.py`).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
RUNNABLE = ("bash", "python")
DATA = ("text", "json", "yaml")
MARK = re.compile(r"<!--\s*(illustrative-page|illustrative|exits|output)\b:?\s*(.*?)\s*-->")
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<language>[\w-]*)\s*$")
INCLUDE = re.compile(r'^--8<-- "(?P<path>[^"]+)"\s*$', re.M)
DOCS_PORT = re.compile(r"\b8000\b")


@dataclass
class Block:
    page: str
    """The page, relative to `docs/`."""
    line: int
    language: str
    text: str
    illustrative: str | None = None
    """Why the block is not run (None: it is run)."""
    exits: int = 0
    output: bool = False
    """A `text` block whose lines the block before must print."""

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def pages() -> list[str]:
    return sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))


def page_text(page: str) -> str:
    """The page as the site renders it: `--8<-- "FILE"` includes (pymdownx.snippets, from the repository root)
    replaced by the file."""
    return INCLUDE.sub(lambda m: (REPO / m.group("path")).read_text(encoding="utf-8"),
                       (DOCS / page).read_text(encoding="utf-8"))


def blocks(page: str) -> list[Block]:
    text = page_text(page)
    whole_page = next((m.group(2) for m in MARK.finditer(text) if m.group(1) == "illustrative-page"), None)
    found, marks, lines, i = [], {}, text.splitlines(), 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            for mark in MARK.finditer(lines[i]):
                marks[mark.group(1)] = mark.group(2)
            if lines[i].strip() and not MARK.fullmatch(lines[i].strip()):
                marks = {}
            i += 1
            continue
        indent, start = fence.group("indent"), i + 1
        i += 1
        while i < len(lines) and lines[i].rstrip() != f"{indent}```":
            i += 1
        body = "\n".join(line[len(indent):] for line in lines[start:i]) + "\n"
        found.append(Block(page, start, fence.group("language"), body,
                           illustrative=marks.get("illustrative", whole_page), exits=int(marks.get("exits", 0)),
                           output="output" in marks))
        marks, i = {}, i + 1
    return found


def commands(text: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and blank lines left out."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def tiny_overrides(reward_backbone: str, policy: str) -> dict[str, list[str]]:
    """What the tests append to each training command: tiny random models, 64 tokens, 2 steps, tiny
    validation and generation, no TensorBoard, bar or plots. The pages' numbers come from the full runs."""
    quiet = ["policy.max_total_sequence_length=64", "policy.num_threads=1", "logger.tensorboard=false",
             "logger.progress_bar=false", "logger.plots=false"]
    batch = ["policy.train_global_batch_size=4", "policy.train_micro_batch_size=2"]
    samples = ["num_sample_generations=1", "sample_max_new_tokens=4", "val_batches=1", "val_global_batch_size=2"]
    return {  # the reward model keeps its configs' batch of 16 pairs (the tiny training files hold 16)
        "train": [f"policy.model_name={reward_backbone}", "rm.max_num_steps=2", "rm.val_batches=1",
                  "rm.val_global_batch_size=8", *quiet],
        "sft": [f"policy.model_name={policy}", "sft.max_num_steps=2", *[f"sft.{s}" for s in samples], *batch, *quiet],
        "dpo": [f"policy.model_name={policy}", "dpo.max_num_steps=2", *[f"dpo.{s}" for s in samples], *batch,
                *quiet],
        "grpo": [f"policy.model_name={policy}", "grpo.max_num_steps=2", "grpo.num_prompts_per_step=2",
                 "grpo.num_generations_per_prompt=2", "grpo.max_val_samples=2", "grpo.val_batch_size=2",
                 "policy.generation.max_new_tokens=4", "policy.generation_batch_size=4", *batch, *quiet],
        "ppo": [f"policy.model_name={policy}", "ppo.max_num_steps=2", "ppo.num_prompts_per_step=2",
                "ppo.num_generations_per_prompt=2", "ppo.max_val_samples=2", "ppo.val_batch_size=2", "ppo.ppo_epochs=1",
                "policy.generation.max_new_tokens=4", "policy.generation_batch_size=4", *batch, *quiet],
    }


def shrunk(argv: list[str], overrides: list[str]) -> list[str]:
    """The tiny overrides a command gets: the model always, every other key unless the command sets it (so an
    example about a key keeps its meaning)."""
    given = {arg.partition("=")[0] for arg in argv if "=" in arg}
    return [o for o in overrides if o.startswith("policy.model_name=") or o.partition("=")[0] not in given]


class PageRun:
    """A page's blocks run in order in `cwd` (a copy of the repository), sharing its files, variables and
    servers."""

    def __init__(self, cwd: Path, env: dict[str, str], port: int, overrides: dict[str, list[str]]):
        self.cwd, self.env, self.port, self.overrides = cwd, dict(env), port, overrides
        self.servers: list[tuple[subprocess.Popen, Path]] = []

    def run(self, block: Block) -> str:
        """Run `block`; returns what it printed. AssertionError names the block and the command that failed."""
        text = DOCS_PORT.sub(str(self.port), block.text)
        if block.language == "python":
            code, output = self._python(text, block.where)
            assert code == block.exits, f"{block.where}: python exited {code}, expected {block.exits}:\n{output}"
            return output
        printed = []
        lines = commands(text)
        for k, command in enumerate(lines):
            code, output = self._command(command)
            printed.append(output)
            expected = block.exits if k == len(lines) - 1 else 0
            assert code == expected, f"{block.where}: `{command}` exited {code}, expected {expected}:\n{output[-4000:]}"
        return "".join(printed)

    def close(self) -> None:
        for process, _ in self.servers:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _command(self, command: str) -> tuple[int, str]:
        if command.startswith("export "):
            for assignment in shlex.split(command)[1:]:
                name, _, value = assignment.partition("=")
                self.env[name] = value
            return 0, ""
        if command.startswith("rmkit serve "):
            return self._serve(command)
        if command.startswith("rmkit "):
            argv = shlex.split(self._expand(command), comments=True)[1:]
            return self._in_process(lambda: _cli(argv + shrunk(argv, self.overrides.get(argv[0], []))))
        done = subprocess.run(["bash", "-c", command], cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=600)
        return done.returncode, done.stdout + done.stderr

    def _python(self, text: str, where: str) -> tuple[int, str]:
        def run():
            try:
                exec(compile(text, where, "exec"), {"__name__": "__main__"})
            except SystemExit as stop:
                return stop.code if isinstance(stop.code, int) else 1
            except Exception:
                traceback.print_exc()  # into the captured output
                return 1
            return 0

        return self._in_process(run)

    def _in_process(self, run) -> tuple[int, str]:
        """`run()` in `cwd` with the page's variables, its output captured."""
        out, saved_env, saved_cwd = io.StringIO(), dict(os.environ), Path.cwd()
        os.environ.update(self.env)
        os.chdir(self.cwd)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                return run(), out.getvalue()
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)

    def _serve(self, command: str) -> tuple[int, str]:
        argv = shlex.split(self._expand(command), comments=True)[1:]
        assert "--port" in argv, f"`{command}`: a served example names its --port (8000), which the test replaces"
        log = self.cwd / f"serve-{len(self.servers)}.log"
        process = subprocess.Popen([sys.executable, "-m", "rmkit", *argv], cwd=self.cwd, env=self.env,
                                   stdout=log.open("w"), stderr=subprocess.STDOUT)
        self.servers.append((process, log))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return process.returncode, log.read_text()
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1.0).status_code == 200:
                    return 0, log.read_text()
            time.sleep(0.2)
        return 124, f"rmkit serve was not ready after 120 s:\n{log.read_text()}"

    def _expand(self, command: str) -> str:
        """`$NAME` and `${NAME}` replaced by the page's variables, as the shell would."""
        return re.sub(r"\$\{?(\w+)\}?", lambda m: self.env.get(m.group(1), ""), command)


def _cli(argv: list[str]) -> int:
    from rmkit import cli

    try:
        return cli.main(argv)
    except SystemExit as stop:  # argparse's usage errors
        return stop.code if isinstance(stop.code, int) else 1
