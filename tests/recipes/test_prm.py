"""The process-reward-model recipe (`rmkit train` with a `prm` section) on a tiny random decoder with SmolLM2's
tokenizer (`tiny_reward_model`): the tokenized label positions, the loss against a slow per-step reference, exact
gradient accumulation, `train_on_last_step_only`, the CLI end to end (final/ with a step-scoring contract,
metrics.jsonl), a step holding the separator (exit 2, file:line:field) and `--print-config`."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from rmkit import cli
from rmkit.config import load_config
from rmkit.data.step_tokenize import prefix_rows, tokenize_solution, tokenize_steps
from rmkit.data.steps import StepSolution
from rmkit.inference import CONTRACT_FILE, STEP_FIELDS, load_scorer, read_contract, write_contract
from rmkit.models import load_reward_model
from rmkit.models.critic import TokenValues
from rmkit.models.step_values import step_values
from rmkit.recipes import prm
from rmkit.recipes.configs import PRMTree
from rmkit.recipes.prm import PrefixSharing, collate, evaluate, prm_step, step_losses

REPO_ROOT = Path(__file__).resolve().parents[2]

SOLUTIONS = [
    StepSolution("a:1", "What is 2 + 3 * 4?", ("3 * 4 = 12.", "2 + 12 = 14.", "The answer is 14."), (True, True, True)),
    StepSolution("a:2", "What is 2 + 3 * 4?", ("2 + 3 = 5.", "5 * 4 = 20."), (False, False)),
    StepSolution("a:3", "Half of 18?", ("18 / 2 = 9.", "So 9.", "Check: 9 + 9 = 18."), (True, None, True)),
    StepSolution("a:4", "Is 7 prime?", ("7 has no divisor but 1 and 7.", "Yes."), (True, True)),
]


def stepwise(i: int) -> dict:
    good = i % 2 == 0
    return {"prompt": f"What is {i} + {i}?", "completions": [f"Add {i} and {i}.", f"{i} + {i} = {2 * i if good else 2 * i + 1}.",
                                                             f"The answer is {2 * i if good else 2 * i + 1}."],
            "labels": [True, good, good]}


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def tiny(tiny_reward_model):
    torch.manual_seed(0)
    model, tokenizer = load_reward_model(tiny_reward_model, num_labels=1)
    return model, tokenizer


def test_labels_sit_at_each_separators_last_token(tiny):
    _, tokenizer = tiny
    item = tokenize_solution(SOLUTIONS[2], tokenizer, "\n")
    separator = tokenizer.encode("\n", add_special_tokens=False)
    expected, ids = [], list(tokenizer(SOLUTIONS[2].prompt)["input_ids"])
    for step, label in zip(SOLUTIONS[2].steps, SOLUTIONS[2].labels):
        ids += tokenizer.encode(step, add_special_tokens=False) + separator
        if label is not None:
            expected.append(len(ids) - 1)
    assert item.input_ids == ids and list(item.positions) == expected and item.labels == (True, True)
    assert all(item.input_ids[p] == separator[-1] for p in item.positions)


def test_cut_keeps_the_beginning_and_counts_the_lost_steps(tiny):
    _, tokenizer = tiny
    whole = tokenize_solution(SOLUTIONS[0], tokenizer, "\n")
    cut_at = whole.positions[1]  # the second step's label falls just past the cut
    out = tokenize_steps([SOLUTIONS[0]], tokenizer, cut_at, "\n")
    assert out.items[0].input_ids == whole.input_ids[:cut_at] and out.items[0].positions == whole.positions[:1]
    assert (out.truncated, out.steps_cut) == (1, 2)
    assert tokenize_steps([SOLUTIONS[0]], tokenizer, 3, "\n").dropped[0][0] == "a:1"


def test_loss_equals_a_per_step_reference(tiny):
    """Hand-made batch: the loss is the mean over the labelled steps of -log sigmoid(z) (correct) or
    -log(1 - sigmoid(z)) (wrong), z the head at the step's separator, each solution scored alone."""
    model, tokenizer = tiny
    items = tokenize_steps(SOLUTIONS, tokenizer, 512, "\n").items
    terms = []
    with torch.no_grad():
        for item in items:
            values = TokenValues(model)(torch.tensor([item.input_ids]))[0]
            for position, label in zip(item.positions, item.labels):
                p = torch.sigmoid(values[position]).item()
                terms.append(-math.log(p if label else 1 - p))
        batch = collate(items, tokenizer.pad_token_id)
        bce, _ = step_losses(TokenValues(model)(batch["input_ids"], batch["attention_mask"]), batch)
    assert len(terms) == 9  # 3 + 2 + 2 (one unlabelled) + 2
    torch.testing.assert_close(bce.item() / len(terms), sum(terms) / len(terms), rtol=1e-5, atol=1e-6)
    metrics = prm_step(TokenValues(model), items, 4, tokenizer.pad_token_id, "float32", torch.device("cpu"))
    model.zero_grad(set_to_none=True)
    torch.testing.assert_close(metrics["loss"].item(), sum(terms) / len(terms), rtol=1e-5, atol=1e-6)


def test_micro_batches_accumulate_exactly(tiny_reward_model):
    """Micro-batch 1 x 4 and one micro-batch of 4 give the same gradients (float32; tolerance for summation order)."""
    grads = []
    for micro in (1, 4):
        torch.manual_seed(0)
        model, tokenizer = load_reward_model(tiny_reward_model, num_labels=1)
        items = tokenize_steps(SOLUTIONS, tokenizer, 512, "\n").items
        metrics = prm_step(TokenValues(model), items, micro, tokenizer.pad_token_id, "float32", torch.device("cpu"))
        grads.append(([p.grad.clone() for p in model.parameters() if p.grad is not None], metrics["loss"].item()))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-5, atol=1e-7)
    assert grads[0][1] == pytest.approx(grads[1][1], rel=1e-6)


def _branching():
    """SOLUTIONS with two more that part from the first after its first and second steps (PRM800K's layout)."""
    base = SOLUTIONS[0]
    return [base, replace(base, source="b:1", steps=base.steps[:1] + ("2 + 12 = 15.",), labels=(True, False)),
            replace(base, source="b:2", steps=base.steps[:2], labels=(True, True)), *SOLUTIONS[1:]]


def test_shared_prefixes_give_the_same_loss_and_gradients(tiny_reward_model):
    """`prm.share_prefixes`: solutions that branch after a common beginning (PRM800K's layout), each beginning computed
    once, give the unshared step's loss, accuracy and gradients (float32 rounding), micro-batch 2 and 4 alike."""
    branching = _branching()
    for micro in (2, 4):
        results = []
        for shared in (False, True):
            torch.manual_seed(0)
            model, tokenizer = load_reward_model(tiny_reward_model, num_labels=1)
            items = tokenize_steps(branching, tokenizer, 512, "\n").items
            metrics = prm_step(TokenValues(model), items, micro, tokenizer.pad_token_id, "float32",
                               torch.device("cpu"), sharing=PrefixSharing(model, always=True) if shared else None)
            results.append(([p.grad.clone() for p in model.parameters() if p.grad is not None],
                            metrics["loss"].item(), metrics["step_acc"].item()))
        torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-4, atol=1e-6)
        assert results[1][1] == pytest.approx(results[0][1], rel=1e-5)
        assert results[1][2] == results[0][2]


def test_shared_prefixes_validate_as_the_plain_forward(tiny_reward_model):
    """Validation with `prm.share_prefixes` (the trie of each validation micro-batch) gives the plain forward's loss,
    step accuracy and step count, micro-batch 2 and 8 alike."""
    model, tokenizer = load_reward_model(tiny_reward_model, num_labels=1)
    items = tokenize_steps(_branching(), tokenizer, 512, "\n").items
    for micro in (2, 8):
        plain, shared = (evaluate(TokenValues(model), items, micro, tokenizer.pad_token_id, "float32",
                                  torch.device("cpu"), sharing=sharing)
                         for sharing in (None, PrefixSharing(model, always=True)))
        assert shared["num_steps"] == plain["num_steps"] == sum(len(i.labels) for i in items)
        assert shared["step_acc"] == plain["step_acc"] and shared["loss"] == pytest.approx(plain["loss"], rel=1e-5)


def test_auto_sharing_takes_the_tree_only_where_it_pays(tiny_reward_model, monkeypatch):
    """`prm.share_prefixes: auto`: the branching solutions (one problem, its steps shared) go through their prefix
    tree; four solutions of as many problems, of about one length, through the padded rows (their trees would be
    the same rows, with hardly any padding saved); the loss and accuracy are the plain forward's either way."""
    apart = [StepSolution(f"c:{i}", problem, tuple(f"Step {k}: " + " ".join([word] * 12) + "." for k in range(3)),
                          (True, True, i % 2 == 0))
             for i, (problem, word) in enumerate([("Is 9 odd?", "nine"), ("Name a prime.", "seven"),
                                                  ("Sum 1 to 4?", "ten"), ("What is 0!?", "one")])]
    calls = []

    def counted(*args):
        calls.append(args[2])
        return prefix_tree_values(*args)

    prefix_tree_values = prm.tree_values
    monkeypatch.setattr(prm, "tree_values", counted)
    for solutions, through_trees in ((_branching(), True), (apart, False)):
        torch.manual_seed(0)
        model, tokenizer = load_reward_model(tiny_reward_model, num_labels=1)
        items = tokenize_steps(solutions, tokenizer, 512, "\n").items
        calls.clear()
        auto, plain = (prm_step(TokenValues(model), items, len(items), tokenizer.pad_token_id, "float32",
                                torch.device("cpu"), sharing=sharing)
                       for sharing in (PrefixSharing(model, always=False), None))
        assert bool(calls) == through_trees and all(layout.shared_tokens > 0 for layout in calls)
        assert auto["loss"].item() == pytest.approx(plain["loss"].item(), rel=1e-5)
        assert auto["step_acc"].item() == plain["step_acc"].item()


def test_last_step_only_trains_one_step_per_solution(tiny):
    _, tokenizer = tiny
    items = tokenize_steps(SOLUTIONS, tokenizer, 512, "\n", train_on_last_step_only=True).items
    assert [len(i.positions) for i in items] == [1, 1, 1, 1]
    assert [i.labels for i in items] == [(True,), (False,), (True,), (True,)]
    assert all(i.positions[0] == i.length - 1 for i in items)


def base_args(model: str, tmp_path: Path, train: Path, **overrides) -> list[str]:
    val = write_jsonl(tmp_path / "val.jsonl", [stepwise(i) for i in range(20, 24)])
    values = {"policy.model_name": model, "data.train_data_path": train, "data.val_data_paths": f"{{held_out: {val}}}",
              "checkpointing.checkpoint_dir": tmp_path / "out", "checkpointing.metric_name": "val:validation-held_out_loss",
              "policy.train_global_batch_size": 4, "policy.train_micro_batch_size": 2,
              "policy.max_total_sequence_length": 64, "policy.num_threads": 1, "prm.log_period": 1,
              "logger.progress_bar": False, "logger.tensorboard": False, "logger.plots": False, **overrides}
    return [f"{k}={v}" for k, v in values.items()]


def run_train(capsys, *args) -> tuple[int, str]:
    threads = torch.get_num_threads()
    try:
        code = cli.main(["train", *map(str, args)])
    finally:
        torch.set_num_threads(threads)
    captured = capsys.readouterr()
    return code, captured.err + captured.out


def test_cli_end_to_end(tiny_reward_model, tmp_path, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", [stepwise(i) for i in range(8)])
    code, err = run_train(capsys, "prm.max_num_steps=2", *base_args(tiny_reward_model, tmp_path, train))
    assert code == 0, err[-3000:]
    final = tmp_path / "out" / "final"
    contract = json.loads((final / "scoring_contract.json").read_text())
    assert contract["step_separator"] == "\n" and contract["step_aggregation"] == "min"
    assert "probability the step is correct" in contract["step_label"]
    lines = [json.loads(line) for line in (tmp_path / "out" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert any("train/loss" in line for line in lines)
    assert any("validation-held_out/step_acc" in line for line in lines)
    assert "8 solutions (stepwise format); 24 labelled steps" in err and "Process reward model saved to" in err
    model, tokenizer = load_reward_model(final)
    assert read_contract(final, model, tokenizer).step_aggregation == "min"  # the scoring paths read it
    write_contract(replace(read_contract(final, model, tokenizer), step_separator=None, step_label=None,
                           step_aggregation=None), tmp_path)
    assert not set(STEP_FIELDS) & set(json.loads((tmp_path / CONTRACT_FILE).read_text()))  # others' files unchanged


def test_prefix_grouped_batches_with_shared_prefixes_train_as_the_plain_forward(tiny_reward_model, tmp_path, capsys):
    """`data.batching: prefix_grouped` + `prm.share_prefixes`: the run's training and validation losses equal those
    of the same batches through the plain forward (the sharing changes no value beyond rounding)."""
    # Each problem with three solutions that part after their first step, as PRM800K's do.
    records = [{"prompt": f"What is {i} + {i}?", "completions": [f"Add {i} and {i}.", f"{i} + {i} = {2 * i + k}."],
                "labels": [True, k == 0]} for i in range(4) for k in range(3)]
    train = write_jsonl(tmp_path / "train.jsonl", records)
    losses = []
    for shared in ("false", "true"):
        out = tmp_path / f"shared-{shared}"
        out.mkdir()
        code, err = run_train(capsys, "prm.max_num_steps=3", "data.batching=prefix_grouped",
                              f"prm.share_prefixes={shared}",
                              *base_args(tiny_reward_model, out, train, **{"checkpointing.checkpoint_dir": out / "run"}))
        assert code == 0, err[-3000:]
        lines = [json.loads(line) for line in (out / "run" / "logs" / "metrics.jsonl").read_text().splitlines()]
        losses.append([line[key] for line in lines for key in ("train/loss", "validation-held_out/loss") if key in line])
    assert len(losses[0]) >= 5 and losses[1] == pytest.approx(losses[0], rel=1e-5)  # 3 steps, validation at start and end


def test_an_encoder_cannot_share_prefixes(tiny_encoder, tmp_path, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", [stepwise(i) for i in range(4)])
    code, err = run_train(capsys, "prm.share_prefixes=true", *base_args(tiny_encoder, tmp_path, train))
    assert code == 2 and "prm.share_prefixes" in err and "encoder" in err and "Traceback" not in err
    assert "auto or false" in err


def test_an_encoder_trains_on_one_row_per_step(tiny_encoder):
    """An encoder's loss: each labelled step is the classifier of the solution cut after the step's separator (the
    model's own forward, [CLS] pooled, on that prefix alone), the mean BCE over the steps; `prefix_rows` and
    `PrefixValues` give it, micro-batched."""
    model, tokenizer = load_reward_model(tiny_encoder, num_labels=1)
    items = tokenize_steps(SOLUTIONS, tokenizer, 512, " ;").items
    terms = []
    with torch.no_grad():
        for item in items:
            for position, label in zip(item.positions, item.labels):
                logit = model(input_ids=torch.tensor([item.input_ids[: position + 1]])).logits[0, 0].item()
                p = 1 / (1 + math.exp(-logit))
                terms.append(-math.log(p if label else 1 - p))
    rows = prefix_rows(items)
    assert len(rows) == len(terms) == 9 and all(row.positions == (row.length - 1,) for row in rows)
    metrics = prm_step(step_values(model), rows, 4, tokenizer.pad_token_id, "float32", torch.device("cpu"))
    torch.testing.assert_close(metrics["loss"].item(), sum(terms) / len(terms), rtol=1e-5, atol=1e-6)


def test_an_encoder_cli_end_to_end_and_its_scores(tiny_encoder, tmp_path, capsys):
    """MiniLM-style encoder through `rmkit train` (a separator its tokenizer keeps: " ;"), then the export scored by
    the inference core equals the model's own forward on each step's prefix."""
    train = write_jsonl(tmp_path / "train.jsonl", [stepwise(i) for i in range(8)])
    code, err = run_train(capsys, "prm.max_num_steps=2", *base_args(tiny_encoder, tmp_path, train,
                                                                  **{"prm.step_separator": "' ;'"}))
    assert code == 0, err[-3000:]
    final = tmp_path / "out" / "final"
    scorer = load_scorer(final)
    assert scorer.contract.reward_position == "first_token" and scorer.contract.step_separator == " ;"
    prompt, steps = "What is 2 + 2?", ["2 + 2 = 4.", "The answer is 4."]
    scored = scorer.score_steps([(prompt, steps)])[0]
    ids, positions, _ = scorer.encode_solution(prompt, steps)
    with torch.no_grad():
        expected = [torch.sigmoid(scorer.model(input_ids=torch.tensor([ids[: p + 1]])).logits[0, 0]).item()
                    for p in positions]
    assert scored.step_rewards == pytest.approx(expected, abs=1e-5) and scored.reward == min(scored.step_rewards)


def test_a_step_holding_the_separator_is_a_data_error(tiny_reward_model, tmp_path, capsys):
    """Through configs/prm.yaml (its separator is a blank line), with data.on_error back at raise."""
    bad = stepwise(1) | {"completions": ["Add 1\n\nand 1.", "1 + 1 = 2.", "The answer is 2."]}
    train = write_jsonl(tmp_path / "train.jsonl", [stepwise(0), bad])
    code, err = run_train(capsys, "--config", REPO_ROOT / "configs/prm.yaml", "prm.max_num_steps=1",
                          *base_args(tiny_reward_model, tmp_path, train, **{"data.on_error": "raise"}))
    assert code == 2
    assert f"{train}:2" in err and "completions" in err and "step separator" in err


def test_print_config(tmp_path, capsys):
    assert cli.main(["train", "--config", str(REPO_ROOT / "configs/prm.yaml"), "--print-config",
                     "prm.aggregation=prod"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["prm"]["aggregation"] == "prod" and printed["prm"]["step_separator"] == "\n\n"
    assert printed["checkpointing"]["checkpoint_dir"] == "results/prm"
    cfg = load_config(REPO_ROOT / "configs/prm.yaml", tree_type=PRMTree)
    assert cfg.policy.optimizer.lr == 1e-5 and "rm" not in printed
    assert cli.main(["train", "--print-config", "rm.max_num_steps=3"]) == 0  # no prm section: the reward model's tree
    assert "rm" in yaml.safe_load(capsys.readouterr().out)
