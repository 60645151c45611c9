"""benchmarks/ppo_replay.py: TRL's rows laid out as rmkit's batch, rmkit's per-token tensors read back at TRL's
columns, the weights distance, and, where the TRL 1.12.0 environment exists (benchmarks/setup_trl_env.sh ppo),
the replay end to end: rmkit's update on TRL's recorded steps lands on TRL's weights."""

import json
import sys

import pytest
import torch
from transformers import AutoTokenizer

from benchmarks import ppo_replay, ppo_vs_trl
from rmkit.rl.rollout import training_batch
from rmkit.trainer.datasets import PromptItem

EOS, PAD = 2, 0  # SmolLM2's <|im_end|>; TRL's side pads with its own pad id, not EOS


def recorded_step() -> dict:
    """Two rows as TRL holds them: left-padded queries, a completion that ended (EOS, then TRL's padding) and
    one that ran to the limit."""
    return {"queries": torch.tensor([[PAD, 5, 6], [7, 8, 9]]),
            "postprocessed_responses": torch.tensor([[1011, EOS, PAD, PAD], [1012, 1013, 1014, 1015]]),
            "logprobs": torch.tensor([[-0.5, -0.25, 1.0, 1.0], [-1.0, -2.0, -3.0, -4.0]]),  # 1.0: TRL's INVALID_LOGPROB
            "sequence_lengths": torch.tensor([1, 3])}


def test_trl_rows_become_rmkits_rollout_and_read_back_at_trls_columns(tiny_policy):
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)  # SmolLM2's
    assert tokenizer.eos_token_id == EOS
    prompts = {(5, 6): PromptItem("p.jsonl:1", "first", [5, 6]), (7, 8, 9): PromptItem("p.jsonl:2", "second", [7, 8, 9])}
    rollout = ppo_replay.trl_rows_as_rollout(recorded_step(), prompts, PAD, tokenizer)
    assert [p.source for p in rollout.prompts] == ["p.jsonl:1", "p.jsonl:2"]
    assert rollout.completion_ids == [[1011, EOS], [1012, 1013, 1014, 1015]]  # through the EOS; all of a row without one
    assert rollout.truncated.tolist() == [False, True]
    assert rollout.text[1] and rollout.text == [tokenizer.decode([1011]), tokenizer.decode([1012, 1013, 1014, 1015])]  # no EOS
    assert [lp.tolist() for lp in rollout.logprobs] == [[-0.5, -0.25], [-1.0, -2.0, -3.0, -4.0]]
    batch = training_batch(rollout, EOS)
    assert batch["input_ids"].tolist() == [[5, 6, 1011, EOS, EOS, EOS, EOS], [7, 8, 9, 1012, 1013, 1014, 1015]]
    # rmkit's tensors aligned with input_ids, read at TRL's response columns: the sampler's log-probs come back
    back = ppo_replay.at_trl_positions(batch["generation_logprobs"], batch, 4)
    assert back.tolist() == [[-0.5, -0.25, 0.0, 0.0], [-1.0, -2.0, -3.0, -4.0]]
    columns = ppo_replay.at_trl_positions(torch.arange(14.0).view(2, 7), batch, 4)
    assert columns.tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]


def test_weights_distance_is_relative_to_trls_update():
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 1.0]]))
    before, after = {"weight": torch.tensor([[0.0, 0.0]])}, {"weight": torch.tensor([[0.0, 2.0]])}
    d = ppo_replay.weights_distance(model, after, before)
    assert d["distance"] == pytest.approx(2 ** 0.5) and d["update"] == pytest.approx(2.0)
    assert d["distance_over_update"] == pytest.approx(2 ** 0.5 / 2)
    with pytest.raises(SystemExit, match="lacks TRL's"):
        ppo_replay.weights_distance(model, {"bias": torch.zeros(1)}, {"bias": torch.zeros(1)})


def test_command_line():
    args = ppo_replay.parse_args(["--smoke", "--trl-python", sys.executable])
    assert (args.steps, args.prompts, args.eval_prompts) == (ppo_vs_trl.SMOKE["steps"], ppo_vs_trl.SMOKE["prompts"], 0)
    assert args.output == args.work_dir / "ppo_replay.json"
    with pytest.raises(SystemExit):
        ppo_replay.parse_args(["--trl-python", sys.executable])  # no reward model


def test_from_record_needs_a_recording_of_every_step(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ppo_replay.parse_args(["--smoke", "--work-dir", str(tmp_path), "--from-record", "--trl-python", "/nonexistent"])
    assert "holds no recording of 2 steps" in capsys.readouterr().err
    (tmp_path / "trl" / "record").mkdir(parents=True)
    (tmp_path / "trl" / "record" / "step2.pt").touch()  # no TRL environment needed to replay a recording
    assert ppo_replay.parse_args(["--smoke", "--work-dir", str(tmp_path), "--from-record",
                                  "--trl-python", "/nonexistent"]).from_record


@pytest.mark.slow  # ~60 s: TRL's run in its environment, then rmkit's update on each step
@pytest.mark.skipif(not ppo_vs_trl.TRL_PYTHON.exists(),
                    reason="no .venv-trl112: run benchmarks/setup_trl_env.sh ppo for the end-to-end run")
def test_rmkits_update_on_trls_steps_lands_on_trls_weights(shared_data, tmp_path):
    out = tmp_path / "replay.json"
    assert ppo_replay.main(["--smoke", "--steps", "3", "--threads", "1", "--data-dir", str(shared_data),
                            "--work-dir", str(tmp_path / "work"), "--output", str(out)]) == 0
    payload = json.loads(out.read_text())
    steps = payload["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert steps[0]["policy"]["distance"] == steps[0]["critic"]["distance"] == 0.0  # the same start
    for step in steps[1:]:
        assert set(step["largest_difference"]) == {"scores", "values", "reference_logprobs", "advantages", "returns"}
        assert all(d < 1e-4 for d in step["largest_difference"].values()), step
        for model in ("policy", "critic"):  # a real update each step, and rmkit's lands on TRL's
            assert step[model]["update"] > 0 and step[model]["distance_over_update"] < 1e-3, (model, step)
    # rmkit's half again on the same recording: the same comparison
    again = tmp_path / "again.json"
    assert ppo_replay.main(["--smoke", "--steps", "3", "--threads", "1", "--data-dir", str(shared_data),
                            "--work-dir", str(tmp_path / "work"), "--output", str(again), "--from-record"]) == 0
    assert json.loads(again.read_text())["steps"] == steps
