"""Run bookkeeping every recipe shares (`rmkit.trainer.lifecycle`), through `rmkit train` on a tiny decoder: a fresh
run over an old output folder moves the old run aside instead of mixing with it, and a run killed while
exporting leaves no half-written `final/`; `--resume` then finishes the export and leaves nothing behind."""

import json

import pytest

from rmkit.cli import main as rmkit_main
from rmkit.trainer.checkpointing.files import verify_checkpoint


def _args(model, pair_files, out, steps):
    train, val = pair_files
    return ["train", f"policy.model_name={model}", f"data.train_data_path={train}", f"data.val_data_paths.val={val}",
            f"checkpointing.checkpoint_dir={out}", "checkpointing.save_period=1", "checkpointing.keep_top_k=null",
            f"rm.max_num_steps={steps}", "rm.log_period=1", "rm.val_period=1", "policy.train_global_batch_size=8",
            "policy.train_micro_batch_size=4", "policy.max_total_sequence_length=64", "policy.num_threads=1",
            "logger.progress_bar=false", "logger.tensorboard=false", "logger.plots=false"]


def _steps(metrics_file):
    return [json.loads(line)["step"] for line in metrics_file.read_text().splitlines()]


def test_a_fresh_run_over_an_old_folder_moves_the_old_run_aside(tiny_decoder, pair_files, tmp_path, capsys):
    out = tmp_path / "run"
    assert rmkit_main(_args(tiny_decoder, pair_files, out, 3)) == 0
    first_log = _steps(out / "logs" / "metrics.jsonl")
    capsys.readouterr()
    assert rmkit_main(_args(tiny_decoder, pair_files, out, 1)) == 0
    err = capsys.readouterr().err
    assert "held an earlier run (3 checkpoint(s), its final/ model, 1 log file(s))" in err and "starting fresh" in err
    assert _steps(out / "logs" / "metrics.jsonl") == [0, 1, 1]  # validation, train, validation: this run's only
    (aside,) = out.glob("replaced-*")
    assert sorted(p.name for p in aside.iterdir()) == ["final", "logs", "step_1", "step_2", "step_3"]
    assert (aside / "final" / "model.safetensors").is_file()  # the earlier run's trained model is kept
    assert _steps(aside / "logs" / "metrics.jsonl") == first_log
    assert sorted(p.name for p in out.glob("step_*")) == ["step_1"]  # --resume can only pick this run's


def test_runs_replaced_within_one_second_go_to_two_folders(tmp_path, monkeypatch):
    import time

    from rmkit.trainer.lifecycle import set_aside_earlier_run

    monkeypatch.setattr(time, "gmtime", lambda *_: time.struct_time((2026, 1, 2, 3, 4, 5, 4, 2, 0)))
    out = tmp_path / "run"
    asides = []
    for step in (1, 2):
        (out / f"step_{step}").mkdir(parents=True)
        asides.append(set_aside_earlier_run(out, out / "logs"))
    assert [a.name for a in asides] == ["replaced-20260102-030405", "replaced-20260102-030405-2"]
    assert [p.name for a in asides for p in a.glob("step_*")] == ["step_1", "step_2"]


@pytest.mark.parametrize("earlier_final", [False, True])
def test_a_kill_during_export_leaves_no_half_final_and_resume_finishes_it(tiny_decoder, pair_files, tmp_path,
                                                                          monkeypatch, earlier_final):
    import rmkit.recipes.rm as rm

    out = tmp_path / "run"
    if earlier_final:  # a finished run's final/ stays whole until the new one is complete
        assert rmkit_main(_args(tiny_decoder, pair_files, out, 1)) == 0
    real_export = rm.export_model

    def killed_while_writing(model, tokenizer, folder, *args, **kwargs):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")  # the config is written, the weights never are
        raise KeyboardInterrupt  # what a kill does to the process here: nothing after this line runs

    monkeypatch.setattr(rm, "export_model", killed_while_writing)
    assert rmkit_main(_args(tiny_decoder, pair_files, out, 2)) == 130
    assert not (out / "final").exists()  # never a final/ without weights
    if earlier_final:  # the earlier run's whole final/ was set aside, not overwritten
        (aside,) = out.glob("replaced-*")
        assert (aside / "final" / "model.safetensors").is_file()
    assert verify_checkpoint(out / "step_2") is None  # the last good checkpoint is whole
    monkeypatch.setattr(rm, "export_model", real_export)
    assert rmkit_main([*_args(tiny_decoder, pair_files, out, 2), "--resume"]) == 0
    assert (out / "final" / "model.safetensors").is_file()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("final")) == ["final"]


def test_a_second_run_into_a_folder_in_use_is_refused_naming_the_holder(tiny_decoder, pair_files, tmp_path, capsys):
    """Two runs into one folder at once would move each other's live logs away: the second is refused at once."""
    import subprocess
    import sys

    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
        "f.write('pid 4242 on elsewhere, since then'); f.flush(); print('held', flush=True); time.sleep(120)"),
        str(out / ".rmkit-run.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert rmkit_main(_args(tiny_decoder, pair_files, out, 1)) == 2
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert f"config key 'checkpointing.checkpoint_dir': {out} is in use by another run (pid 4242 on elsewhere" in err
    assert "Traceback" not in err and not list(out.glob("step_*"))
    assert rmkit_main(_args(tiny_decoder, pair_files, out, 1)) == 0  # once it is gone, the folder is free
    assert not (out / ".rmkit-run.lock").exists()  # a finished run lets the folder go


def test_a_checkpoint_folder_that_cannot_be_written_is_one_line(tiny_decoder, pair_files, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert rmkit_main(_args(tiny_decoder, pair_files, blocker / "run", 1)) == 2
    err = capsys.readouterr().err
    assert (f"config key 'checkpointing.checkpoint_dir': cannot write to {blocker / 'run'}: {blocker} is a file, not "
            "a folder") in err
    assert "Traceback" not in err
    assert rmkit_main(_args(tiny_decoder, pair_files, blocker, 1)) == 2  # the folder itself a file
    assert f"cannot write to {blocker}: {blocker} is a file, not a folder" in capsys.readouterr().err
