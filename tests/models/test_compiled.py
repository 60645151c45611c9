"""`policy.compile` (`rmkit.models.compiled`): compiled blocks give the eager step's loss and gradients, the rows
CUDA graphs get (padded to a multiple of 32 positions) give the same rewards, and `rmkit train` with compiled
blocks trains and validates through the CLI."""

import copy
import json

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from rmkit.config import load_config
from rmkit.errors import ConfigError
from rmkit.models import compiled
from rmkit.models.reward_forward import ChunkedRewards, SharedPromptRewards, pair_groups
from rmkit.models.setup import RewardForward, transformer_layers
from rmkit.recipes.rm import bradley_terry_step
from tests.models.test_shared_prompt_rewards import PAD, _classifier, _pairs
from tests.support.reward_models import run_cli

CPU = torch.device("cpu")


def _encoder():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        max_position_embeddings=128, pad_token_id=PAD, num_labels=1, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config).float().train()


def _step(model, decoder: bool, cuda_graphs: bool = False):
    model.zero_grad(set_to_none=True)
    forward = RewardForward(model)
    forward = SharedPromptRewards(forward, PAD, cuda_graphs) if decoder else ChunkedRewards(forward, cuda_graphs)
    metrics = bradley_terry_step(forward, _pairs(), 4, PAD, "float32", CPU)
    return float(metrics["loss"]), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same_step(got, want):
    (loss, grads), (want_loss, want_grads) = got, want
    assert abs(loss - want_loss) < 1e-5
    assert grads.keys() == want_grads.keys() and len(grads) > 0
    for name in grads:
        torch.testing.assert_close(grads[name], want_grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("scope", ["blocks", "stack"])
@pytest.mark.parametrize("decoder", [False, True], ids=["encoder", "decoder"])
def test_compiled_blocks_give_the_eager_loss_and_gradients(decoder, scope):
    torch._dynamo.reset()
    model = _classifier("llama", "sdpa") if decoder else _encoder()
    want = _step(copy.deepcopy(model), decoder)
    compiled.compile_blocks(model, "default", scope)
    stack = model.model if decoder else model.bert.encoder  # the module that runs the blocks
    regions = transformer_layers(model) if scope == "blocks" else [stack]
    assert all(region._compiled_call_impl is not None for region in regions)
    assert compiled.has_compiled_blocks(model)
    _assert_same_step(_step(model, decoder), want)
    _assert_same_step(_step(model, decoder), want)  # the next step: compiled already
    with compiled.eager():  # validation's stance: the blocks' own code
        _assert_same_step(_step(model, decoder), want)


@pytest.mark.parametrize("decoder", [False, True], ids=["encoder", "decoder"])
def test_rows_padded_for_cuda_graphs_give_the_same_loss_and_gradients(decoder):
    model = _classifier("llama", "sdpa") if decoder else _encoder()
    seen = []
    model.get_input_embeddings().register_forward_hook(lambda module, args, out: seen.append(args[0].numel()))
    want = _step(copy.deepcopy(model), decoder)
    seen.clear()
    _assert_same_step(_step(model, decoder, cuda_graphs=True), want)
    # 8 pairs in micro-batches of 4: each forward's rows padded to 32 positions (every row here is shorter), a
    # pair's row each for a decoder (never packed: the row count stays that of the micro-batch)
    rows = 4 if decoder else 8
    assert seen and all(n == rows * 32 for n in seen)
    groups = pair_groups(_pairs())
    assert max(len(p) + sum(map(len, c)) for p, c in groups) <= 32  # so one multiple of 32 each


def test_cuda_graphs_only_with_reduce_overhead_on_a_gpu():
    assert compiled.uses_cuda_graphs(True, "reduce-overhead", torch.device("cuda"))
    assert not compiled.uses_cuda_graphs(True, "reduce-overhead", CPU)
    assert not compiled.uses_cuda_graphs(True, "default", torch.device("cuda"))
    assert not compiled.uses_cuda_graphs(False, "reduce-overhead", torch.device("cuda"))
    assert compiled.padded_length(33, 32) == 64 and compiled.padded_length(32, 32) == 32
    assert compiled.padded_length(33, None) == 33


def test_a_mode_torch_compile_does_not_know_is_an_error_naming_the_key():
    with pytest.raises(ConfigError, match="policy.compile_mode"):
        load_config(None, ["policy.compile=true", "policy.compile_mode=fast"])
    with pytest.raises(ConfigError, match="policy.compile_mode"):
        compiled.compile_blocks(_encoder(), "fast")


def test_rmkit_train_with_compiled_blocks_trains_and_validates(tiny_encoder, pair_files, tmp_path):
    train, val = pair_files
    out = tmp_path / "out"
    result = run_cli("train", f"policy.model_name={tiny_encoder}", f"data.train_data_path={train}",
                     f"data.val_data_paths={{v: {val}}}", "policy.train_global_batch_size=8",
                     "policy.train_micro_batch_size=4", "rm.max_num_epochs=1", "rm.val_period=2",
                     f"checkpointing.checkpoint_dir={out}", "logger.tensorboard=false", "logger.plots=false",
                     "logger.progress_bar=false", "policy.compile=true", "policy.compile_mode=reduce-overhead",
                     timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "validation-v/acc" in line] == [0, 2, 3]
    assert (out / "final" / "model.safetensors").is_file()
