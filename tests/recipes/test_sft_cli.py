"""`rmkit sft` end to end on the tiny policy: final/ loads with AutoModelForCausalLM, metrics.jsonl and the
samples JSONL are written; bad input is one message naming file:line and field (or the config key), exit 2."""

import json
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from rmkit import cli
from rmkit.config import load_config
from rmkit.recipes.configs import SFTTree

REPO_ROOT = Path(__file__).resolve().parents[2]


def conversation(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"What is {i} plus {i}?"},
                         {"role": "assistant", "content": f"It is {2 * i}."},
                         {"role": "user", "content": "Thanks!"},
                         {"role": "assistant", "content": "You are welcome."}]}


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def run_sft(capsys, *args) -> tuple[int, str]:
    threads = torch.get_num_threads()
    try:
        code = cli.main(["sft", *map(str, args)])
    finally:
        torch.set_num_threads(threads)
    return code, capsys.readouterr().err


def base_args(tiny_policy, tmp_path, train: Path, **overrides) -> list[str]:
    values = {"policy.model_name": tiny_policy, "data.train_data_path": train,
              "data.val_data_paths": "{held_out: %s}" % (tmp_path / "val.jsonl"),
              "checkpointing.checkpoint_dir": tmp_path / "out", "policy.train_global_batch_size": 4,
              "policy.train_micro_batch_size": 2, "policy.max_total_sequence_length": 96, "policy.num_threads": 1,
              "policy.optimizer.lr": 3e-3, "sft.val_period": 2, "sft.log_period": 1, "sft.num_sample_generations": 2,
              "sft.sample_max_new_tokens": 8, "checkpointing.save_period": 2, "logger.progress_bar": False,
              "logger.tensorboard": False, "logger.plots": False, **overrides}
    write_jsonl(tmp_path / "val.jsonl", [conversation(i) for i in range(20, 23)])
    return [f"{k}={v}" for k, v in values.items()]


def test_cli_end_to_end(tiny_policy, tmp_path, capsys):
    prompt_response = [{"prompt": f"Name the number {i}.", "response": f"{i}"} for i in range(4)]
    train = write_jsonl(tmp_path / "train.jsonl", [conversation(i) for i in range(8)])
    code, err = run_sft(capsys, "--config", REPO_ROOT / "configs/sft.yaml",
                        *base_args(tiny_policy, tmp_path, train, **{"sft.max_num_steps": 3, "sft.max_num_epochs": 2}))
    assert code == 0, err[-3000:]
    out = tmp_path / "out"
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    tokenizer = AutoTokenizer.from_pretrained(out / "final")
    assert tokenizer.chat_template and model.config.model_type == "llama"
    records = [json.loads(line) for line in (out / "logs/metrics.jsonl").read_text().splitlines()]
    names = set().union(*records)
    for name in ("train/loss", "train/token_acc", "train/tokens_per_s", "train/sequences_per_s", "train/lr",
                 "validation-held_out/loss", "validation-held_out/token_acc", "validation-held_out/tokens_per_s"):
        assert name in names, name
    assert [r["step"] for r in records if "validation-held_out/loss" in r] == [0, 2, 3]
    samples = [json.loads(line) for line in (out / "logs/samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * 2 and {s["step"] for s in samples} == {0, 2, 3}
    assert samples[0]["prompt"].endswith("<|im_start|>assistant\n") and "completion" in samples[0]
    assert sorted(p.name for p in out.glob("step_*")) == ["step_2", "step_3"]

    # prompt/response records train too (the same machinery, another layout)
    train = write_jsonl(tmp_path / "pr.jsonl", prompt_response)
    code, err = run_sft(capsys, *base_args(tiny_policy, tmp_path, train, **{
        "checkpointing.checkpoint_dir": tmp_path / "out2", "sft.max_num_steps": 1, "sft.num_sample_generations": 0}))
    assert code == 0 and "4 demonstrations" in err, err[-3000:]


def test_chosen_side_of_preference_data_with_lora_and_packing(tiny_policy, tmp_path, capsys):
    pairs = [{"prompt": f"Q{i}?", "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(4)]
    train = write_jsonl(tmp_path / "pairs.jsonl", pairs)
    from rmkit.data.demonstrations import load_demonstrations

    loaded = load_demonstrations(train)
    assert [d.response for d in loaded.records] == [f"good {i}" for i in range(4)]
    code, err = run_sft(capsys, *base_args(tiny_policy, tmp_path, train, **{
        "sft.max_num_steps": 1, "sft.num_sample_generations": 0, "checkpointing.enabled": False,
        "policy.lora.enabled": True, "sft.sequence_packing": True}))
    assert code == 0, err[-3000:]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out/final")  # LoRA merged: a plain Llama
    assert not any("lora" in name for name, _ in merged.named_parameters())


def test_plain_text_trains_on_every_line(tiny_policy, tmp_path, capsys):
    """TRL's plain-text layout: 5 documents (an odd count) are 5 demonstrations, trained on every token."""
    from rmkit.data.demonstrations import load_demonstrations, tokenize_demonstrations
    from rmkit.models.reward import load_tokenizer

    documents = [{"text": f"Document {i} says the river is {i} miles long."} for i in range(5)]
    train = write_jsonl(tmp_path / "text.jsonl", documents)
    loaded = load_demonstrations(train)
    assert loaded.format == "text" and [d.prompt for d in loaded.records] == [d["text"] for d in documents]
    tokenizer = load_tokenizer(tiny_policy)
    ids = tokenize_demonstrations(loaded.records, tokenizer, 96).items[0]
    assert ids.input_ids == tokenizer(documents[0]["text"])["input_ids"] + [tokenizer.eos_token_id]
    assert ids.token_mask == [0] + [1] * (ids.length - 1)  # every token but the first (it has no log-prob)
    code, err = run_sft(capsys, *base_args(tiny_policy, tmp_path, train, **{
        "data.val_data_paths": f"{{held_out: {train}}}", "sft.max_num_steps": 1, "checkpointing.enabled": False}))
    assert code == 0, err[-3000:]
    assert f"rmkit: train: {train}: 5 demonstrations (text format); 0 truncated to 96 tokens" in err
    samples = [json.loads(line) for line in (tmp_path / "out/logs/samples.jsonl").read_text().splitlines()]
    assert samples[0]["prompt"] + samples[0]["reference"] == documents[0]["text"]  # the sample continues its first half


def test_malformed_record_is_file_line_field_or_skipped(tiny_policy, tmp_path, capsys):
    bad = {"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}]}
    train = write_jsonl(tmp_path / "train.jsonl", [conversation(0), bad, conversation(1), conversation(2)])
    code, err = run_sft(capsys, *base_args(tiny_policy, tmp_path, train))
    assert code == 2 and f"{train}:2" in err and "messages[1].role" in err, err
    assert "Traceback" not in err

    code, err = run_sft(capsys, *base_args(tiny_policy, tmp_path, train, **{
        "data.on_error": "skip", "sft.max_num_steps": 1, "sft.num_sample_generations": 0}))
    assert code == 0 and "1 skipped" in err, err[-3000:]
    rejects = [json.loads(line) for line in (tmp_path / "out/rejects-train.jsonl").read_text().splitlines()]
    assert rejects[0]["source"] == f"{train}:2" and "messages[1].role" in rejects[0]["reason"]


def test_record_with_no_assistant_token_is_an_error_naming_it(tiny_policy, tmp_path, capsys):
    no_reply = {"messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}]}
    train = write_jsonl(tmp_path / "train.jsonl", [conversation(0), conversation(1), no_reply])
    code, err = run_sft(capsys, *base_args(tiny_policy, tmp_path, train))
    assert code == 2 and f"{train}:3" in err and "messages" in err and "no assistant" in err, err


def test_unknown_key_and_bad_values_are_config_errors(tiny_policy, tmp_path, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", [conversation(0)])
    for override, key in [("sft.bogus=1", "sft.bogus"), ("sft.val_period=-1", "sft.val_period"),
                          ("data.format=csv", "data.format"), ("rm.seed=1", "rm")]:
        code, err = run_sft(capsys, *base_args(tiny_policy, tmp_path, train), override)
        assert code == 2 and key in err and "Traceback" not in err, (override, err)


def test_shipped_config_parses():
    cfg = load_config(REPO_ROOT / "configs/sft.yaml", tree_type=SFTTree)
    assert cfg.policy.model_name == "smollm2" and cfg.checkpointing.checkpoint_dir == "results/sft"
    assert cfg.sft.assistant_only_loss and not cfg.sft.only_unmask_final
    # a partial policy section keeps SFT's defaults
    cfg = load_config(None, ["policy.optimizer.lr=1e-4"], tree_type=SFTTree)
    assert cfg.policy.model_name == "smollm2" and cfg.policy.train_micro_batch_size == 4
    yaml.safe_dump({"ok": True})


@pytest.mark.parametrize("fmt", ["messages", "prompt_response"])
def test_format_forced_on_the_other_layout_names_the_missing_field(tmp_path, fmt):
    from rmkit.data.demonstrations import load_demonstrations
    from rmkit.errors import DataError

    record = {"prompt": "hi", "response": "yo"} if fmt == "messages" else conversation(0)
    path = write_jsonl(tmp_path / "x.jsonl", [record])
    with pytest.raises(DataError) as err:
        load_demonstrations(path, fmt)
    assert err.value.line == 1 and err.value.field in ("messages", "prompt")
