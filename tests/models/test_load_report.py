"""What a load says: rmkit's one line for a new score head (transformers' load report table is not printed, a
newcomer read it as an error), a warning for backbone weights a checkpoint lacks, and no GGUF conversion bar."""

import torch
from transformers import AutoTokenizer, LlamaForSequenceClassification
from transformers import modeling_gguf_pytorch_utils as gguf_reader

from rmkit.models.reward import load_reward_model, transformers_progress_bars_off


def test_a_backbone_gets_one_line_for_its_new_head(tiny_policy, capfd):
    load_reward_model(tiny_policy, num_labels=1)
    err = capfd.readouterr().err
    assert f"rmkit: {tiny_policy}: a new score head (score.weight) starts from random weights" in err
    assert "LOAD REPORT" not in err and "MISSING" not in err


def test_a_saved_reward_model_loads_silently(tiny_decoder, capfd):
    load_reward_model(tiny_decoder)
    assert capfd.readouterr().err == ""


def test_missing_backbone_weights_are_a_warning(tiny_decoder, tmp_path, capfd):
    model = LlamaForSequenceClassification.from_pretrained(tiny_decoder)
    state = {k: v for k, v in model.state_dict().items() if "layers.1." not in k}
    broken = tmp_path / "broken"
    model.save_pretrained(broken, state_dict=state)
    AutoTokenizer.from_pretrained(tiny_decoder).save_pretrained(broken)
    load_reward_model(broken)
    err = capfd.readouterr().err
    assert f"rmkit: warning: {broken}: 9 backbone weights are not in the checkpoint and start from random values" in err


def test_the_gguf_conversion_bar_is_off_in_the_block_only():
    bar = gguf_reader.tqdm
    with transformers_progress_bars_off():
        items = [torch.zeros(1)]
        assert gguf_reader.tqdm(items, desc="Converting") is items  # a pass-through, no bar
    assert gguf_reader.tqdm is bar
