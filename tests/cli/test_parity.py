"""`rmkit parity`: one reward per text on every scoring path, for a model trained with a short max length
and scored on pairs (text and chat) longer than it."""

import json

from tests.support.reward_models import run_cli, write_pairs

CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def _chat_pairs(path, n):
    with open(path, "w", encoding="utf-8") as out:
        for i in range(n):
            history = [{"role": "user", "content": f"Hello number {i}." + " Tell me more." * (i % 5)},
                       {"role": "assistant", "content": "Gladly, here is more."}]
            prompt = history * (1 + i % 3) + [{"role": "user", "content": f"What is {i} plus {i}?"}]
            chosen = [{"role": "assistant", "content": f"It is {2 * i}."}]
            rejected = [{"role": "assistant", "content": f"Work it out yourself: {2 * i + 1}." * (1 + i % 4)}]
            out.write(json.dumps({"prompt": prompt, "chosen": chosen, "rejected": rejected}) + "\n")
    return path


def test_parity_holds_on_every_path(tiny_decoder, tmp_path):
    train, val = write_pairs(tmp_path / "train.jsonl", 16), write_pairs(tmp_path / "val.jsonl", 8, offset=50)
    out = tmp_path / "run"
    trained = run_cli("train", f"policy.model_name={tiny_decoder}", f"data.train_data_path={train}",
                      f"data.val_data_paths.val={val}", f"checkpointing.checkpoint_dir={out}",
                      "policy.train_global_batch_size=8", "policy.train_micro_batch_size=4",
                      "policy.max_total_sequence_length=20", f"policy.tokenizer.chat_template={json.dumps(CHAT_TEMPLATE)}",
                      "rm.max_num_steps=2", "logger.progress_bar=false", "logger.plots=false",
                      "logger.tensorboard=false", "checkpointing.enabled=false")
    assert trained.returncode == 0, trained.stderr
    data = tmp_path / "mixed.jsonl"
    data.write_text(write_pairs(tmp_path / "text.jsonl", 12, offset=200).read_text()
                    + _chat_pairs(tmp_path / "chat.jsonl", 10).read_text())
    result = run_cli("parity", "--model", str(out / "final"), "--data", str(data), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["max_length"] == 20 and report["inputs"] == 44
    assert report["truncated"] >= 10  # the contract's short max length cuts many inputs
    paths = report["paths"]
    assert {f"serve (requests of {n})" for n in (1, 2, 3, 32)} <= set(paths)
    for name, path in paths.items():
        expected = 20 if "environment" in name else 44  # the environment scores the 10 chat pairs
        if name.startswith("transformers"):
            expected = 44 - report["truncated"]
        assert path["compared"] == expected, (name, path)
        assert path["max_abs_diff"] <= 1e-5, (name, path)
