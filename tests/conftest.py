"""Shared test setup: slow tests run only with RMKIT_SLOW=1 (CI sets it) or when selected with -m slow."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.support.reward_models import pair_files, tiny_decoder, tiny_encoder, tiny_prm  # noqa: F401 (fixtures for every directory)

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# Under pytest-xdist (`-n auto`: one worker per core) each worker's torch keeps to one thread, so that the
# workers share the cores instead of oversubscribing them; the processes tests start set their own threads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("RMKIT_SLOW") == "1" or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: set RMKIT_SLOW=1 or pass -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture
def shared_data() -> Path:
    """../shared/data beside the repository; tests that need it skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory) -> str:
    """A random Llama causal LM (hidden 32, 2 layers) with SmolLM2's real tokenizer and chat template (pad =
    eos = <|im_end|>), saved to a folder: what the policy recipes (SFT, DPO, GRPO) load in tests."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rmkit.models.reward import load_tokenizer
    from rmkit.models.setup import resolve_model_name

    tokenizer = load_tokenizer(resolve_model_name("smollm2"))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("tiny_policy")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_plain_policy(tiny_policy, tmp_path_factory) -> str:
    """`tiny_policy` with no chat template (a base model's tokenizer): rmkit renders its prompts plainly."""
    path = tmp_path_factory.mktemp("tiny_plain_policy") / "policy"
    shutil.copytree(tiny_policy, path)
    (path / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return str(path)
