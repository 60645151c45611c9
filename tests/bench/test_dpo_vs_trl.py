"""benchmarks/dpo_vs_trl.py end to end on a tiny random policy: both trainers really train in their own
subprocess, on the same token ids, and the results file holds both sides' speed, memory and accuracy."""

import json
import math

import pytest
import torch

from benchmarks import dpo_vs_trl


@pytest.mark.slow  # ~1 min: two training subprocesses, each importing transformers (and TRL)
def test_dpo_vs_trl_end_to_end(tiny_policy, shared_data, tmp_path, capsys):
    out = tmp_path / "dpo_vs_trl.json"
    # One optimizer step of 4 micro-batches: both sides see the same 8 pairs in that step, whatever their order.
    assert dpo_vs_trl.main(["--policy", tiny_policy, "--pairs", "8", "--eval-pairs", "4", "--max-length", "128",
                            "--batch", "8", "--micro", "2", "--lr", "1e-3", "--threads", "1", "--repeats", "1",
                            "--data-dir", str(shared_data), "--work-dir", str(tmp_path / "work"),
                            "--output", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["checks"] == {"tokens_identical": True, "optimizer_steps_equal": True, "reference_pass_ran": True}
    assert [r["side"] for r in payload["runs"]] == ["trl", "rmkit"]
    for run in payload["runs"]:
        assert run["token_digest"] == payload["data"]["token_digest"]
        assert run["optimizer_steps"] == 1 and run["reference_forwards"] == 4 and run["training_forwards"] == 4
        assert run["pairs_per_s"] > 0 and run["reference_s"] > 0 and run["training_s"] > 0
        assert math.isclose(run["reference_s"] + run["training_s"], run["total_s"])
        assert run["weights_hash_s"] > 0 and run["peak_rss_mib"] > 100
    for side in dpo_vs_trl.SIDES:
        held = payload["held_out"][side]
        assert 0 <= held["accuracy"] <= 1 and len(held["correct"]) == 4
        assert held["margin_mean"] != 0  # lr 1e-3 moved the policy away from the reference
    assert 0 <= payload["held_out"]["agreement"] <= 1
    # The same pairs in the one step, the same loss and AdamW update: the two trained policies agree up to float32
    # rounding (rmkit's shared-prefix rows vs TRL's padded ones, different micro-batch partitions); 1e-3 relative
    # leaves room for that and none for a different loss, normalization, lr, beta or clipping.
    assert math.isclose(payload["held_out"]["rmkit"]["margin_mean"], payload["held_out"]["trl"]["margin_mean"],
                        rel_tol=1e-3)
    assert payload["speedup_pairs_per_s"] > 0
    capsys.readouterr()
    assert dpo_vs_trl.main(["table", str(out)]) == 0
    assert "| **rmkit / TRL pairs/s** |" in capsys.readouterr().out


def test_bad_batch_sizes_say_what_to_do(capsys):
    with pytest.raises(SystemExit):
        dpo_vs_trl.parse_args(["--pairs", "10", "--batch", "8", "--micro", "4"])
    assert "--pairs 10 must be a multiple of --batch 8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        dpo_vs_trl.parse_args(["--batch", "8", "--micro", "3"])
    assert "--batch 8 must be a multiple of --micro 3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        dpo_vs_trl.parse_args(["--policy", "/nonexistent/policy"])
    assert "no such directory; pass a causal LM directory (GGUF too) or smollm2" in capsys.readouterr().err


def test_response_logprob_sums_equal_each_sequence_run_alone(tiny_policy):
    from transformers import AutoModelForCausalLM

    pairs = [{"prompt_ids": [5, 9, 13, 2], "chosen_ids": [7, 8, 9], "rejected_ids": [11]},
             {"prompt_ids": [3], "chosen_ids": [4, 4], "rejected_ids": [6, 1, 2, 8]}]
    sums = dpo_vs_trl.response_logprob_sums(tiny_policy, pairs)
    model = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32).eval()
    for i, pair in enumerate(pairs):
        for j, response in enumerate((pair["chosen_ids"], pair["rejected_ids"])):
            ids = torch.tensor([pair["prompt_ids"] + response])
            with torch.no_grad():
                logprobs = torch.log_softmax(model(input_ids=ids).logits[0, :-1], dim=-1)
            start = len(pair["prompt_ids"]) - 1  # logits at t predict token t + 1
            expected = logprobs[start:].gather(1, ids[0, start + 1:, None]).sum()
            torch.testing.assert_close(sums[i, j], expected, rtol=1e-5, atol=1e-5)
