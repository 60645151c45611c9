"""The "Use it" lines every training command prints after its run are run here, as printed, against what
the run exported into a folder whose path has a space: the policy's `python -c` (a policy with a chat template and
one without) and the reward model's `python -c`, `rmkit eval` and `rmkit score` on the run's own validation file
(slow: each is a fresh Python process)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rmkit import cli
from tests.recipes.dpo_helpers import write_pairs
from tests.support.launch import CHILD_ENV
from tests.support.tiny import make_tiny_decoder

COMMON = ["policy.max_total_sequence_length=64", "policy.num_threads=1", "logger.tensorboard=false",
          "logger.progress_bar=false", "logger.plots=false"]


def _snippets(stdout: str) -> list[str]:
    """Each command of the "Use it:" block, with its backslash-newline continuations kept for the shell."""
    block = re.split(r"\nUse it[^\n]*:\n", stdout, maxsplit=1)[1]
    return [c.strip() for c in re.split(r"\n(?=  \S)", block) if c.strip()]


def _run(command: str, cwd: Path) -> str:
    """`command` in bash with this interpreter's `python` and `rmkit` first on PATH, as an installed rmkit has them."""
    env = {**CHILD_ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "template"), [("sft", True), ("sft", False), ("dpo", True)])
def test_the_policy_snippet_runs(recipe, template, tiny_policy, tiny_plain_policy, tmp_path, capsys):
    policy = tiny_policy if template else tiny_plain_policy
    train = write_pairs(tmp_path / "train.jsonl", 4)
    args = [recipe, f"policy.model_name={policy}", f"data.train_data_path={train}", "data.val_data_paths={}",
            f"checkpointing.checkpoint_dir={tmp_path / 'my run'}", f"{recipe}.max_num_steps=1", f"{recipe}.val_period=0",
            f"{recipe}.val_at_start=false", f"{recipe}.val_at_end=false", "policy.train_global_batch_size=2",
            "policy.train_micro_batch_size=2", *COMMON]
    assert cli.main(args) == 0, capsys.readouterr().err[-3000:]
    (snippet,) = _snippets(capsys.readouterr().out)
    assert snippet.startswith("python -c") and str(tmp_path / "my run" / "final") in snippet
    _run(snippet, tmp_path)


@pytest.mark.slow
def test_the_reward_model_snippets_run(tmp_path, capsys):
    model = make_tiny_decoder(tmp_path / "backbone")
    train = write_pairs(tmp_path / "train.jsonl", 8)
    args = ["train", f"policy.model_name={model}", f"data.train_data_path={train}", f"data.val_data_paths={{val: {train}}}",
            f"checkpointing.checkpoint_dir={tmp_path / 'my run'}", "rm.max_num_steps=1", "rm.val_period=0",
            "rm.val_at_start=false", "policy.train_global_batch_size=4", "policy.train_micro_batch_size=4", *COMMON]
    assert cli.main(args) == 0, capsys.readouterr().err[-3000:]
    snippets = _snippets(capsys.readouterr().out)
    assert [s.split()[:2] for s in snippets] == [["rmkit", "eval"], ["rmkit", "score"], ["rmkit", "serve"],
                                                 ["python", "-c"]]
    eval_, score, _, python = snippets  # serve does not end by itself: its start-up is tested in tests/serve
    assert "FILE.jsonl" not in eval_ + score  # the run's own validation file, ready to run
    _run(eval_, tmp_path)
    _run(score, tmp_path)
    assert len((tmp_path / "scored.jsonl").read_text().splitlines()) == 8
    assert "tensor(" in _run(python, tmp_path)
