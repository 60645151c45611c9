"""benchmarks/device_suite.py in its CPU mode (`--tiny`): every section really runs both sides on tiny backbones
built from the real configs, and the results file holds each section's comparable numbers."""

import json

import pytest

from benchmarks import device_suite


def test_matmul_params_count_a_tied_lm_head_once(tiny_policy):
    from transformers import AutoModelForCausalLM

    from benchmarks import common

    model = AutoModelForCausalLM.from_pretrained(tiny_policy)
    head = model.get_output_embeddings().weight
    assert head is model.get_input_embeddings().weight  # tied: not among the non-embedding parameters
    assert device_suite.matmul_params(tiny_policy) == common.non_embedding_params(model) + head.numel()


@pytest.mark.slow  # ~3 min on 2 cores: 16 training subprocesses, each importing transformers (and TRL)
def test_device_suite_runs_every_section_on_cpu(shared_data, tmp_path):
    out = tmp_path / "out" / "results.json"
    status = device_suite.main(["--device", "cpu", "--tiny", "--threads", "1", "--data-dir", str(shared_data),
                                "--variants", "rmkit_compiled_stack_cuda_graphs",  # one compiled run: each compiles ~40 s
                                "--work-dir", str(tmp_path / "work"), "--output", str(out)])
    results = json.loads(out.read_text())
    assert status == 0, {k: v.get("error") for k, v in results.items() if isinstance(v, dict)}
    assert results["sections_done"] == list(device_suite.SECTIONS)
    setup = results["setup"]
    assert setup["weights"] == "tiny random" and setup["accuracy_meaningful"] is False
    assert setup["matmul_peak_flops"]["bf16"] > 0 and setup["spec_bf16_peak_flops"] is None  # no card on a CPU

    profile = results["profile"]["summary"]
    assert set(profile) == {"fp32", "bf16"}
    assert all(p["seconds_per_step"] > 0 and p["aten_ops"] > 0 and p["kernel_launches"] == 0 for p in profile.values())
    assert results["profile"]["raw"]["results"]["bf16"]["top_by_cpu_time"]
    assert "sorted by self_cpu_time_total" in (out.parent / "rm_profile.txt").read_text()

    for name in ("rm_minilm", "rm_smollm2"):
        summary = results[name]["summary"]
        assert set(summary) == {"bf16"}
        variant = results[name]["variants"]["rmkit_compiled_stack_cuda_graphs"]  # on a CPU: compiled, no graphs
        assert variant["status"] == 0 and variant["pairs_per_s"] > 0 and variant["pairs_per_s_over_trl"] > 0
        assert set(results[name]["variants"]) == {"rmkit_compiled_stack_cuda_graphs"}
        for row in summary.values():
            for side in ("trl", "rmkit"):
                assert row[side]["pairs_per_s"] > 0 and row[side]["mfu"]["vs_measured_bf16_matmul"] > 0
                assert 0 <= row[side]["accuracy/hh_harmless_val.jsonl"] <= 1
            assert row["ratio_rmkit_over_trl"]["pairs_per_s"] > 0
        # one warmup epoch, then the timed one: both sides made every optimizer step
        assert len({r["optimizer_steps"] for r in results[name]["raw"]["runs"]}) == 1

    dpo = results["dpo"]
    assert dpo["checks"] == {"tokens_identical": True, "optimizer_steps_equal": True, "reference_pass_ran": True}
    for side in ("trl", "rmkit"):
        assert dpo["summary"][side]["steady_training_pairs_per_s"] > 0
        assert 0 <= dpo["summary"][side]["held_out_accuracy"] <= 1
    assert dpo["raw"]["settings"]["precision"] == "bfloat16"

    assert set(results["sft"]["summary"]) == {"trl-0", "rmkit-0", "rmkit-packed-0"}
    assert all(s["tokens_per_s"] > 0 and s["mfu"]["vs_measured_bf16_matmul"] > 0
               for s in results["sft"]["summary"].values())

    grpo = results["grpo"]
    assert set(grpo["summary"]) == {"trl", "rmkit"}
    assert all(s["seconds_per_step"]["total"] > 0 and s["held_out_reward"] is not None for s in grpo["summary"].values())
    assert grpo["raw"]["workload"]["warmup_steps"] == 1 and grpo["raw"]["workload"]["precision"] == "bf16"

    score = results["score"]
    assert {"rmkit", "pipeline_bs1", "pipeline_bs4"} <= set(score["summary"])
    assert score["ratio_rmkit_over_best_pipeline"] > 0 and score["raw"]["precision"] == "bf16"
