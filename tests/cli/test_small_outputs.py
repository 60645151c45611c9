"""Small things a user reads: `rmkit --version`, every subcommand's `--help` description, and what a resumed run
that had nothing left to do says."""

import importlib

import pytest

from rmkit import __version__, cli
from tests.recipes.dpo_helpers import write_pairs


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"rmkit {__version__}\n"
    assert cli.main(["-V"]) == 0 and capsys.readouterr().out.strip() == f"rmkit {__version__}"


@pytest.mark.parametrize("command", ["eval", "score", "parity"])
def test_help_gives_the_whole_first_paragraph(command, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main([command, "--help"])
    assert stopped.value.code == 0
    shown = "".join(capsys.readouterr().out.split())  # argparse rewraps the text (and breaks lines at hyphens)
    first = importlib.import_module(cli.SUBCOMMANDS[command][0]).__doc__.split("\n\n")[0]
    assert "".join(first.split()) in shown and first.rstrip().endswith(".")  # parity's stopped mid-sentence


def test_a_resume_with_no_step_left_says_so_instead_of_a_zero_rate(tiny_policy, tmp_path, capsys):
    train = write_pairs(tmp_path / "train.jsonl", 8)
    args = ["sft", f"policy.model_name={tiny_policy}", f"data.train_data_path={train}", "data.val_data_paths={}",
            f"checkpointing.checkpoint_dir={tmp_path / 'run'}", "sft.max_num_steps=1", "sft.val_period=0",
            "policy.train_global_batch_size=2", "policy.train_micro_batch_size=2", "policy.max_total_sequence_length=64",
            "policy.num_threads=1", "logger.tensorboard=false", "logger.progress_bar=false", "logger.plots=false",
            "sft.val_at_start=false", "sft.val_at_end=false"]
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    assert "rmkit: trained 1 step at" in err and "with 1 thread," in err
    assert cli.main([*args, "--resume"]) == 0
    err = capsys.readouterr().err
    assert "rmkit: no step left to train: the run was complete at step 1" in err and "0.00 sequences/s" not in err


def test_overrides_may_come_before_and_after_resume(capsys):
    """`rmkit ppo --config C a=1 --resume b=2`: both overrides reach the config (argparse's plain parsing stopped
    at --resume and called the rest unrecognized)."""
    from rmkit import cli

    assert cli.main(["ppo", "ppo.max_num_steps=3", "--resume", "ppo.no_such_key=1"]) == 2
    err = capsys.readouterr().err
    assert "ppo.no_such_key" in err and "unrecognized arguments" not in err
