"""The last encoder layer computed at [CLS] only gives the full forward's rewards and gradients."""

import pytest
import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    LlamaConfig,
    LlamaForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
)

from rmkit.data.collate import pad_right
from rmkit.models.first_token import first_token_last_layer
from rmkit.models.reward import compute_rewards
from rmkit.models.setup import set_activation_checkpointing

SIZES = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, num_labels=2)


def tiny_bert(attn: str) -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(vocab_size=80, attn_implementation=attn, **SIZES))


def tiny_roberta() -> RobertaForSequenceClassification:
    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=80, pad_token_id=1, max_position_embeddings=40, **SIZES)
    return RobertaForSequenceClassification(config)


def padded_batch(lengths: list[int], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    rows = [torch.randint(5, 80, (n,), generator=generator).tolist() for n in lengths]
    return pad_right(rows, pad)


def full_logits(model, input_ids, attention_mask) -> torch.Tensor:
    return model(input_ids=input_ids, attention_mask=attention_mask).logits


def rewards_and_grads(fn, model, input_ids, attention_mask):
    model.zero_grad(set_to_none=True)
    rewards = fn(model, input_ids, attention_mask)
    weights = torch.linspace(-1.0, 2.0, rewards.numel()).view_as(rewards)  # every reward matters differently
    (rewards * weights).sum().backward()
    return rewards.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("make", [lambda: tiny_bert("sdpa"), lambda: tiny_bert("eager"), tiny_roberta],
                         ids=["bert-sdpa", "bert-eager", "roberta"])
@pytest.mark.parametrize("lengths", [[9, 3, 6, 1], [7, 7, 7]], ids=["padded", "unpadded"])
def test_rewards_and_gradients_equal_the_full_forward(make, lengths):
    model = make()
    model.train()
    for module in model.modules():  # dropout off (rmkit's default) so both passes compute one function
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    with first_token_last_layer(model) as applied:
        assert applied  # else the comparison below would compare the full forward with itself
    input_ids, attention_mask = padded_batch(lengths, model.config.pad_token_id)
    fast, fast_grads = rewards_and_grads(compute_rewards, model, input_ids, attention_mask)
    full, full_grads = rewards_and_grads(full_logits, model, input_ids, attention_mask)
    # Float32 rounding only: the same sums over keys, in another kernel shape. Tolerance ~100x eps.
    torch.testing.assert_close(fast, full, rtol=1e-5, atol=1e-5)
    assert fast_grads.keys() == full_grads.keys()
    for name in full_grads:
        torch.testing.assert_close(fast_grads[name], full_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_last_layers_dropped_rows_get_no_work_and_the_layer_is_restored_after():
    model = tiny_bert("sdpa").eval()
    input_ids, attention_mask = padded_batch([6, 4])
    with first_token_last_layer(model) as applied:
        inside = model.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    after = model.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    assert applied
    assert inside.shape == (2, 1, 32) and after.shape == (2, 6, 32)
    torch.testing.assert_close(inside[:, 0], after[:, 0], rtol=1e-5, atol=1e-6)


def test_precomputed_embeddings_take_the_same_path():
    model = tiny_bert("sdpa").eval()
    input_ids, attention_mask = padded_batch([5, 2, 8])
    embeds = model.get_input_embeddings()(input_ids)
    torch.testing.assert_close(compute_rewards(model, input_ids, attention_mask, inputs_embeds=embeds),
                               full_logits(model, input_ids, attention_mask), rtol=1e-5, atol=1e-5)


def test_other_models_run_unchanged():
    config = LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=0)
    model = LlamaForSequenceClassification(config).eval()
    with first_token_last_layer(model) as applied:
        assert not applied
    decoder_bert = BertForSequenceClassification(BertConfig(vocab_size=80, is_decoder=True, **SIZES))
    with first_token_last_layer(decoder_bert) as applied:
        assert not applied


def test_gradient_checkpointing_keeps_the_full_layer_and_trains():
    model = tiny_bert("sdpa")
    set_activation_checkpointing(model, True)
    model.train()
    with first_token_last_layer(model) as applied:
        assert not applied  # the recomputation in backward runs after the block, so it must see one forward
    input_ids, attention_mask = padded_batch([4, 7])
    compute_rewards(model, input_ids, attention_mask).sum().backward()
    assert model.classifier.weight.grad is not None
