"""benchmarks/prm_vs_trl.py: which solutions both trainers get and in what form, the settings both configs carry,
the TRL-layout scorer against a hand-built layout and an unbatched forward, and, where the TRL 1.13.0 environment
exists (benchmarks/setup_trl_env.sh prm), the smoke run end to end."""

import json
import math
import random
import sys

import pytest
import torch
import yaml
from transformers import LlamaConfig, LlamaForTokenClassification

from benchmarks import prm_vs_trl
from rmkit.config import load_config
from rmkit.data.step_tokenize import solution_ids
from rmkit.data.steps import StepSolution, load_step_data
from rmkit.models.reward import load_tokenizer
from rmkit.models.setup import resolve_model_name
from rmkit.recipes.configs import PRMTree

SEPARATOR = "\n\n"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model_name("smollm2"))


def solution(name: str, labels: tuple, steps: tuple | None = None) -> StepSolution:
    steps = steps or tuple(f"step {i} of {name}" for i in range(len(labels)))
    return StepSolution(name, f"Problem {name}?", steps, labels)


def test_solutions_are_cut_after_their_last_label_and_kept_only_when_labelled_up_to_it(tokenizer, tmp_path):
    solutions = [
        solution("whole", (True, False)),
        solution("tail", (True, True, None, None)),  # a labeller's unrated candidates at the end: cut off
        solution("hole", (True, None, False)),  # an ambiguous step between labelled ones: TRL cannot say so
        solution("none", (None,)),
        solution("long", (True,), ("word " * 300,)),
        solution("late", (False,)),
        solution("beyond", (True,)),  # the count is reached before it
    ]
    selected = prm_vs_trl.select_solutions(solutions, tokenizer, 3, 64, SEPARATOR)
    assert [(s.source, s.steps, s.labels) for s in selected["solutions"]] == [
        ("whole", solutions[0].steps, (True, False)),
        ("tail", solutions[1].steps[:2], (True, True)),
        ("late", solutions[5].steps, (False,)),
    ]
    assert list(selected["left_out"].values()) == [2, 1]  # hole and none; long
    with pytest.raises(SystemExit, match="only 4 solutions qualify"):
        prm_vs_trl.select_solutions(solutions, tokenizer, 5, 64, SEPARATOR)
    # the stepwise file both trainers read: rmkit's own loader gets the same solutions back
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(prm_vs_trl.stepwise_record(s)) + "\n" for s in selected["solutions"]))
    read = load_step_data(path, "stepwise", step_separator=SEPARATOR).records
    assert [(r.prompt, r.steps, r.labels) for r in read] == [(s.prompt, s.steps, s.labels)
                                                             for s in selected["solutions"]]


def test_trl_layout_is_bos_prompt_then_each_step_and_separator(tokenizer):
    """TRL's `tokenize_row`, built here by hand: BOS, the prompt without special tokens, each step + separator; a
    step's label at its separator's last token. rmkit's layout is the same without the BOS (SmolLM2's tokenizer
    adds none), every position one earlier."""
    prompt, steps = "What is 1+1?", ["1+1=2", "So the answer is 2."]
    ids, positions = prm_vs_trl.trl_layout(tokenizer, prompt, steps, SEPARATOR)

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    first = [tokenizer.bos_token_id] + encode(prompt) + encode(steps[0]) + encode(SEPARATOR)
    assert ids == first + encode(steps[1]) + encode(SEPARATOR)
    assert positions == [len(first) - 1, len(ids) - 1]
    assert [ids[p] for p in positions] == [encode(SEPARATOR)[-1]] * 2
    assert tokenizer.convert_ids_to_tokens(ids[0]) == "<|im_start|>"
    rmkit_ids, rmkit_ends = solution_ids(tokenizer, prompt, steps, SEPARATOR)
    assert (rmkit_ids, rmkit_ends) == (ids[1:], [p - 1 for p in positions])


def test_trl_scorer_reads_softmax_label_1_at_each_separator(tokenizer, tmp_path):
    """Batched and padded, the scorer gives each step softmax(logits)[1] of an unbatched forward at its position
    (float32: 1e-5); a step whose separator falls past max_length is unscored (None)."""
    torch.manual_seed(0)
    model = LlamaForTokenClassification(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                                    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                                    num_labels=2, pad_token_id=tokenizer.pad_token_id)).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    solutions = [("Short?", ["a", "b"]), ("A longer problem, with more words in it?", ["x = 3", "y = 4", "so 7"])]
    max_length = len(prm_vs_trl.trl_layout(tokenizer, *solutions[1], SEPARATOR)[0]) - 2  # cuts its last step
    scored = prm_vs_trl.trl_step_rewards(tmp_path, solutions, SEPARATOR, max_length, batch_size=2)
    for (prompt, steps), rewards in zip(solutions, scored):
        ids, positions = prm_vs_trl.trl_layout(tokenizer, prompt, steps, SEPARATOR)
        with torch.no_grad():
            probabilities = model(torch.tensor([ids])).logits[0].softmax(-1)[:, 1]
        expected = [probabilities[p].item() if p < max_length else None for p in positions]
        assert [r is None for r in rewards] == [e is None for e in expected]
        assert [r for r in rewards if r is not None] == pytest.approx([e for e in expected if e is not None], abs=1e-5)
    assert scored[0][-1] is not None and scored[1][-1] is None


def test_processbench_rows_take_erroneous_and_correct_halves(shared_data):
    rows = prm_vs_trl.processbench_rows(shared_data / "prm", 5)
    for split in prm_vs_trl.SPLITS:
        labels = [row.label for row in rows if row.split == split]
        assert len(labels) == 5 and sum(label == -1 for label in labels) == 2  # ceil(5/2) erroneous, 2 correct


def _auc(right: list, wrong: list) -> float:
    """The step AUC by its definition, pair by pair (the slow reference)."""
    return sum(1.0 if r > w else 0.5 if r == w else 0.0 for r in right for w in wrong) / (len(right) * len(wrong))


def test_paired_difference_is_the_difference_of_the_report_figures_with_a_paired_bootstrap_se():
    from rmkit.report.processbench import ProcessRow

    rows = [ProcessRow("p", ("a", "b", "c"), label, split, None, None)
            for split in ("gsm8k", "math") for label in (1, 2, -1, -1, 0)]
    rng = random.Random(3)
    rmkit = [[rng.random() for _ in range(3)] for _ in rows]
    trl = [[rng.random() for _ in range(3)] for _ in rows]
    result = prm_vs_trl.paired_difference(rows, {"rmkit": rmkit, "trl": trl}, draws=200, seed=1)
    def mean_auc(rewards: list) -> float:  # each split's AUC by hand, then their mean
        aucs = []
        for split in ("gsm8k", "math"):
            members = [(row, r) for row, r in zip(rows, rewards) if row.split == split]
            right = [p for row, r in members for p in r[:row.label if row.label != -1 else 3]]
            wrong = [r[row.label] for row, r in members if row.label != -1]
            aucs.append(_auc(right, wrong))
        return sum(aucs) / len(aucs)

    assert result["average_step_auc"]["difference"] == pytest.approx(mean_auc(rmkit) - mean_auc(trl), abs=1e-12)
    assert result["average_step_auc"]["se"] > 0
    same = prm_vs_trl.paired_difference(rows, {"rmkit": rmkit, "trl": rmkit}, draws=50)
    assert same["average_step_auc"] == {"difference": 0.0, "se": 0.0}  # paired: one draw for both sides
    assert same["average_f1"] == {"difference": 0.0, "se": 0.0}
    perfect = [[0.9 if row.label == -1 or i < row.label else 0.1 for i in range(3)] for row in rows]
    inverted = [[1 - p for p in r] for r in perfect]
    flipped = prm_vs_trl.paired_difference(rows, {"rmkit": perfect, "trl": inverted}, draws=50)
    assert flipped["average_step_auc"] == {"difference": 1.0, "se": 0.0}  # every draw ranks perfectly, and inverted
    assert flipped["average_f1"]["difference"] == 1.0  # every first error found and no correct solution flagged


def test_command_line_and_both_configs_carry_the_same_settings(tmp_path, capsys):
    with pytest.raises(SystemExit):
        prm_vs_trl.parse_args(["--solutions", "40", "--trl-python", sys.executable])  # not whole batches of 32
    assert "must divide" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        prm_vs_trl.parse_args(["--trl-python", "/nonexistent/python"])
    assert "setup_trl_env.sh prm" in capsys.readouterr().err
    smoke = prm_vs_trl.parse_args(["--smoke", "--trl-python", sys.executable])
    assert smoke.output == smoke.work_dir / "prm_vs_trl_smoke.json"  # a smoke run never overwrites the results
    assert smoke.solutions // smoke.batch_size == 2
    args = prm_vs_trl.parse_args(["--trl-python", sys.executable, "--lr", "2e-5", "--warmup-steps", "3"])
    assert args.output.parts[-3:] == ("benchmarks", "results", "prm_vs_trl.json")
    spec = {**prm_vs_trl.settings(args), "base_dir": "base", "train_file": "train.jsonl", "out_dir": str(tmp_path)}
    trl, rm = prm_vs_trl.trl_config(spec), prm_vs_trl.rmkit_config(spec)
    policy, prm = rm["policy"], rm["prm"]
    assert trl["per_device_train_batch_size"] * trl["gradient_accumulation_steps"] == policy["train_global_batch_size"]
    assert trl["per_device_train_batch_size"] == policy["train_micro_batch_size"] == 4
    assert trl["learning_rate"] == policy["optimizer"]["lr"] == 2e-5
    assert trl["weight_decay"] == policy["optimizer"]["weight_decay"] == 0.01
    assert trl["warmup_steps"] == policy["scheduler"]["warmup_steps"] == 3
    assert trl["lr_scheduler_kwargs"]["min_lr_rate"] == policy["scheduler"]["min_lr_ratio"] == 0.1
    assert trl["max_grad_norm"] == policy["max_grad_norm"] == 1.0
    assert trl["max_length"] == policy["max_total_sequence_length"] == 1024
    assert trl["step_separator"] == prm["step_separator"] == SEPARATOR
    assert not trl["train_on_last_step_only"] and not prm["train_on_last_step_only"]
    assert trl["seed"] == prm["seed"] and trl["num_train_epochs"] == prm["max_num_epochs"] == 1
    assert not trl["bf16"] and policy["precision"] == "float32"
    assert not trl["gradient_checkpointing"] and not policy["gradient_checkpointing"]
    path = tmp_path / "bench.yaml"  # rmkit's own loader takes the config as it is written for the run
    path.write_text(yaml.safe_dump(rm))
    cfg = load_config(path, tree_type=PRMTree)
    assert cfg.prm.step_separator == SEPARATOR and cfg.data.format == "stepwise"


@pytest.mark.slow  # ~60 s: three training subprocesses, each importing transformers (and TRL 1.13.0)
@pytest.mark.skipif(not prm_vs_trl.TRL_PYTHON.exists(),
                    reason="no .venv-trl113: run benchmarks/setup_trl_env.sh prm for the end-to-end run")
def test_smoke_run_end_to_end(shared_data, tmp_path):
    out = tmp_path / "prm_vs_trl.json"
    assert prm_vs_trl.main(["--smoke", "--threads", "1", "--data-dir", str(shared_data / "prm"),
                            "--work-dir", str(tmp_path / "work"), "--output", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert [r["side"] for r in payload["runs"]] == ["trl", "rmkit"]
    assert payload["versions"]["trl"]["trl"] == "1.13.0"
    assert payload["versions"]["trl"]["transformers"] == payload["versions"]["rmkit"]["transformers"]
    for run in payload["runs"]:
        assert run["optimizer_steps"] == 2 and 0 < run["train_s"] < run["wall_s"]
        assert 0 < run["peak_rss_mib"] <= run["process_peak_rss_mib"]
        assert run["solutions_per_s"] > run["solutions_per_s_wall"] > 0
    for side in prm_vs_trl.SIDES:
        scores = payload["processbench"][side]
        assert set(scores["splits"]) == set(prm_vs_trl.SPLITS)
        for split in scores["splits"].values():
            assert (split["n_error"], split["n_correct"]) == (2, 2)
            assert all(0 <= split[k] <= 1 for k in ("error_acc", "correct_acc", "f1"))
        assert math.isfinite(scores["average_f1"])
    assert all(v > 0 for v in payload["rmkit_over_trl"].values())
    assert "| **rmkit / TRL** |" in prm_vs_trl.markdown_table(payload)
    # one side again, the other reused: its training figures as they were, its saved model scored again (the same)
    again = tmp_path / "again.json"
    common = ["--smoke", "--threads", "1", "--data-dir", str(shared_data / "prm"), "--work-dir", str(tmp_path / "work2")]
    with pytest.raises(SystemExit, match="other settings"):
        prm_vs_trl.main([*common, "--sides", "rmkit", "--reuse", str(out), "--lr", "0.5", "--output", str(again)])
    assert prm_vs_trl.main([*common, "--sides", "rmkit", "--reuse", str(out), "--output", str(again)]) == 0
    second = json.loads(again.read_text())
    assert [r["side"] for r in second["runs"]] == ["trl", "rmkit"] and second["runs"][0] == payload["runs"][0]
    assert second["processbench"]["trl"]["splits"] == payload["processbench"]["trl"]["splits"]
