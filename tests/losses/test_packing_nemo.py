"""NeMo RL's sequence-packing gradient tests, re-created against rmkit's SequencePackingLossWrapper
(tests/unit/algorithms/sequence_packing_gradient_actor.py, test_sequence_packing_fusion.py).

NeMo RL runs them on GPUs under Ray / torch.distributed with context parallelism (CP) and a
vocab-parallel (TP) group; rmkit has no model parallelism, so the CP = TP = 1 cases are the ones that
apply: the packed row's loss and logit gradients equal the unpacked batch's. Inputs, configs, the
seed (42) and tolerances (atol = rtol = 1e-5) are NeMo RL's; the random values are drawn on the CPU
from a generator, so they differ from NeMo RL's CUDA draws. As in NeMo RL, the wrapper gets packed
logits and the data unpacked (`[B, S]` rows, row i = sequence i). NeMo RL's loss takes a `prepare_fn` that rmkit's losses
do themselves (they take logits), and its fused wrapper (one log-softmax over the packed row) has no
rmkit counterpart: rmkit's wrapper already takes one split of the row (see SequencePackingLossWrapper).
"""

import torch

from rmkit.losses import ClippedPGLossFn, NLLLoss, SequencePackingLossWrapper


def _nemo_batch(lengths, max_seq_len, vocab, scale, seed):
    """NeMo RL's test batch: random tokens up to each length (token_mask 1 there), sample_mask 1,
    random advantages / prev / generation log-probs (times `scale`), reference = generation."""
    g = torch.Generator().manual_seed(seed)
    batch = len(lengths)
    input_ids = torch.zeros(batch, max_seq_len, dtype=torch.long)
    token_mask = torch.zeros(batch, max_seq_len)
    for i, length in enumerate(lengths):
        input_ids[i, :length] = torch.randint(0, vocab, (length,), generator=g)
        token_mask[i, :length] = 1.0
    generation = scale * torch.randn(batch, max_seq_len, generator=g)
    data = {
        "input_ids": input_ids,
        "input_lengths": torch.tensor(lengths),
        "token_mask": token_mask,
        "sample_mask": torch.ones(batch),
        "advantages": scale * torch.randn(batch, max_seq_len, generator=g),
        "prev_logprobs": scale * torch.randn(batch, max_seq_len, generator=g),
        "generation_logprobs": generation,
        "reference_policy_logprobs": generation.clone(),
    }
    logits = torch.randn(batch, max_seq_len, vocab, generator=g).requires_grad_()
    return logits, data


def _cu_seqlens(lengths, multiple):
    """(cu_seqlens, cu_seqlens_padded) of sequences each padded to a multiple of `multiple`, as NeMo
    RL's Megatron packer makes them for CP = 1 (pad_individual_seqs_to_multiple_of = 2 * cp_size)."""
    padded = [-(-n // multiple) * multiple for n in lengths]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    cu_padded = torch.tensor([0, *torch.tensor(padded).cumsum(0).tolist()])
    return cu, cu_padded


def _packed_logits(logits, lengths, cu_padded):
    """`[1, T, V]`: sequence i's first lengths[i] logits at cu_padded[i], zeros in the padding."""
    packed = torch.zeros(1, int(cu_padded[-1]), logits.shape[-1])
    for i, length in enumerate(lengths):
        start = int(cu_padded[i])
        packed[:, start : start + length] = logits[i : i + 1, :length]
    return packed


def _packed_vs_unpacked(cfg, lengths, max_seq_len, vocab, scale, seed, global_valid_toks):
    logits, data = _nemo_batch(lengths, max_seq_len, vocab, scale, seed)
    loss_fn = ClippedPGLossFn(cfg)
    global_valid_seqs = torch.tensor(float(len(lengths)))

    baseline_loss, baseline_metrics = loss_fn(logits, data, global_valid_seqs, global_valid_toks)
    (baseline_grad,) = torch.autograd.grad(baseline_loss, logits)

    cu, cu_padded = _cu_seqlens(lengths, multiple=2)
    wrapper = SequencePackingLossWrapper(loss_fn, cu, cu_padded)
    packed_loss, packed_metrics = wrapper(
        _packed_logits(logits, lengths, cu_padded), data, global_valid_seqs, global_valid_toks
    )
    (packed_grad,) = torch.autograd.grad(packed_loss, logits)
    return (baseline_loss, baseline_metrics, baseline_grad), (packed_loss, packed_metrics, packed_grad)


def test_sequence_packing_gradients_cp1():
    # test_sequence_packing_gradients_with_cp[cp_size=1]: 4 sequences of lengths [128, 128, 128, 384]
    # in rows of 512, vocab 1000, ClippedPG with reference_policy_kl_penalty 0.1 and ratio_clip_c 3,
    # global_valid_toks = sum of the lengths (NeMo RL's count, kept), global_valid_seqs = 4.
    cfg = {"reference_policy_kl_penalty": 0.1, "ratio_clip_c": 3.0}
    lengths = [128, 128, 128, 384]
    baseline, packed = _packed_vs_unpacked(
        cfg, lengths, max_seq_len=512, vocab=1000, scale=1.0, seed=42,
        global_valid_toks=torch.tensor(float(sum(lengths))),
    )
    torch.testing.assert_close(packed[2], baseline[2], atol=1e-5, rtol=1e-5)


def test_sequence_packing_fusion_cp1_tp1():
    # test_sequence_packing_fusion_vs_baseline[cp1_tp1] (and the metric parity of its
    # _with_sampling_params twin, without the top-k / top-p sampling rmkit does not have): lengths
    # [128, 256, 170, 384] in rows of 512, vocab 512, NeMo RL's default ClippedPG config, data 0.1 *
    # randn, global_valid_toks = sum(length - 1). Loss, metrics and gradients agree (1e-5), and the
    # gradient is not all zeros.
    lengths = [512 // 4, 512 // 2, 512 // 3, 512 * 3 // 4]
    baseline, packed = _packed_vs_unpacked(
        {}, lengths, max_seq_len=512, vocab=512, scale=0.1, seed=42,
        global_valid_toks=torch.tensor(float(sum(n - 1 for n in lengths))),
    )
    assert baseline[2].abs().sum() > 0 and packed[2].abs().sum() > 0
    torch.testing.assert_close(packed[0], baseline[0], atol=1e-5, rtol=1e-5)
    assert packed[1].keys() == baseline[1].keys()
    for key in baseline[1]:
        torch.testing.assert_close(packed[1][key], baseline[1][key], atol=1e-5, rtol=1e-5, msg=key)
    torch.testing.assert_close(packed[2], baseline[2], atol=1e-5, rtol=1e-5)


def test_last_sequence_inflated_beyond_row_width():
    # test_pack_input_ids_last_seq_inflated_beyond_row_width / _inflated_last_seq_cp_sharded, at the
    # wrapper: NeMo RL's Megatron packer folds the bin's alignment fill into the last sequence, so
    # cu_seqlens says 96 where the unpacked row holds 64 tokens (row width 64, two rows, NeMo RL's
    # token ids 1..128). The fill positions are no tokens: the loss and gradients are the unpacked
    # batch's, and the fill's logits get no gradient.
    row_width, inflated = 64, 96
    input_ids = torch.arange(1, 2 * row_width + 1).reshape(2, row_width)
    data = {"input_ids": input_ids, "token_mask": torch.ones(2, row_width), "sample_mask": torch.ones(2)}
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, row_width, 2 * row_width + 1, generator=g).requires_grad_()
    loss_fn = NLLLoss()
    gvs, gvt = data["sample_mask"].sum(), data["token_mask"][:, 1:].sum()
    want = loss_fn(logits, data, gvs, gvt)[0]
    (want_grad,) = torch.autograd.grad(want, logits)

    fill = torch.randn(1, inflated - row_width, logits.shape[-1], generator=g).requires_grad_()
    packed_logits = torch.cat([logits[0:1], logits[1:2], fill], dim=1)  # [1, 64 + 96, V]
    cu = torch.tensor([0, row_width, row_width + inflated])
    loss = SequencePackingLossWrapper(loss_fn, cu, cu)(packed_logits, data, gvs, gvt)[0]
    grad, fill_grad = torch.autograd.grad(loss, (logits, fill), allow_unused=True)
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad, want_grad, atol=1e-5, rtol=1e-5)
    assert fill_grad is None or not fill_grad.any()
