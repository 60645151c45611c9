"""Loading a causal LM as a policy, LoRA on it, and the export that `AutoModelForCausalLM` loads back."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rmkit.config import Config
from rmkit.models.policy import load_policy_model
from rmkit.models.setup import head_module_names, is_causal_lm, prepare_model
from rmkit.trainer.export import export_policy


def test_loads_with_a_pad_token_and_no_new_embedding_row(tiny_policy):
    model, tokenizer = load_policy_model(tiny_policy)
    assert is_causal_lm(model) and head_module_names(model) == []
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == model.config.pad_token_id
    assert model.get_input_embeddings().num_embeddings == len(tokenizer)
    assert tokenizer.chat_template and tokenizer.padding_side == "right"


def test_lora_policy_exports_merged_and_reloads_with_the_same_logits(tiny_policy, tmp_path):
    model, tokenizer = load_policy_model(tiny_policy)
    cfg = Config()
    cfg.policy.lora.enabled = True
    peft_model = prepare_model(model, cfg.policy)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)  # adapters only: no head copied
    with torch.no_grad():  # move the adapters off zero so merging changes the weights
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    ids = torch.tensor([[1, 5, 9, 200, 3000]])
    with torch.no_grad():
        expected = peft_model(input_ids=ids).logits
        with peft_model.disable_adapter():  # the reference policy of DPO/GRPO under LoRA
            base = peft_model(input_ids=ids).logits
    assert not torch.allclose(expected, base)

    out = export_policy(peft_model, tokenizer, tmp_path / "final", cfg)
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert AutoTokenizer.from_pretrained(out).chat_template == tokenizer.chat_template
    assert (out / "rmkit_config.yaml").is_file() and not (out / "scoring_contract.json").exists()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-5)


def test_bf16_autocast_on_a_gpu_keeps_attention_off_cudnn():
    """cuDNN's fused attention plans a graph per new shape (756 ms a step on an H200, BENCHMARKS.md); a bf16
    forward on a GPU allows every other kernel, and the flags come back as they were."""
    import warnings

    from rmkit.models.setup import autocast

    before = torch.backends.cuda.cudnn_sdp_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # autocast on a machine without CUDA warns and does nothing
        with autocast("bfloat16", torch.device("cuda")):
            assert not torch.backends.cuda.cudnn_sdp_enabled()
            assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with autocast("bfloat16", torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before
