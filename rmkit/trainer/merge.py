"""Weight averaging of reward models (WARM: Ramé et al. 2024, "WARM: On the Benefits of Weight Averaged
Reward Models"): reward models fine-tuned from one base, averaged parameter by parameter, make one model
scored at the cost of one that, by WARM's account, approaches their ensemble (rmkit's measurement on its own
seeds: BENCHMARKS.md, "Weight averaging").

Averaging only means something for models that share everything but their fine-tuning: one architecture
(`config.json`), one tokenizer, one scoring contract and one base (the pretrained weights they started
from). Each is checked before anything is written, and a mismatch is refused with one line naming the two
models and what differs. The base is checked by distance: the backbone (every parameter outside the
reward head, norm weights and biases) of each model is compared with the first model's,
`||theta_i - theta_0|| / ||theta_0||`: three MiniLM seeds fine-tuned on 2,000 pairs differ by 0.9%, two
random initializations of one architecture by about 141% (sqrt 2). Above `MAX_BASE_DISTANCE` the merge is
refused. Reward heads may differ freely (each seed of a study draws its own head).

The merged folder is an rmkit export like `rmkit train`'s `final/`: float32 safetensors, config, the
tokenizer and the shared `scoring_contract.json`, without reward statistics (an average of models has
none of its own yet: `serve --normalize` refuses it until they are measured), and `merge.json`, which
says what was averaged.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import torch

from rmkit.errors import UserError
from rmkit.inference import check_reward_model_dir, read_contract, write_contract
from rmkit.models import load_reward_model
from rmkit.trainer.export import save_hf_model

MERGE_FILE = "merge.json"
# Backbones further apart than this (relative L2 distance) are not fine-tunes of one base.
MAX_BASE_DISTANCE = 0.5
# config.json keys that say how a file was written, not what the model is.
CONFIG_NOISE = {"_name_or_path", "transformers_version", "torch_dtype", "dtype"}


def merge_reward_models(paths: list[str], output: str | Path) -> dict:
    """Average the reward models in `paths` (uniform weights) into the new folder `output`; returns what
    `merge.json` records: the models, the method and each model's backbone distance from the first."""
    if len(paths) < 2:
        raise UserError(f"rmkit merge averages two or more reward models, got {len(paths)} "
                                   "(give every model folder to average, e.g. the final/ of each seed's run)")
    paths = [check_reward_model_dir(p, "MODEL") for p in paths]
    for path in paths:
        if not (Path(path) / "config.json").is_file():
            raise UserError(f"{path} is not a model folder on disk (a LoRA adapter or a Hub id); merge "
                                       "exported models: rmkit's final/ merges adapters into the weights")
    _check_output(Path(output), paths)
    first = paths[0]
    for other in paths[1:]:
        _check_same_config(first, other)
    model, tokenizer = load_reward_model(first)
    contract = read_contract(first, model, tokenizer)
    state = model.state_dict()
    total = {key: value.double() if value.is_floating_point() else value for key, value in state.items()}
    head = _head_keys(model)
    distances = [0.0]
    for other in paths[1:]:
        other_model, other_tokenizer = load_reward_model(other)
        _check_same_tokenizer(first, tokenizer, other, other_tokenizer)
        other_contract = read_contract(other, other_model, other_tokenizer)
        _check_same_contract(first, contract, other, other_contract)
        other_state = other_model.state_dict()
        distances.append(_backbone_distance(state, other_state, head))
        if distances[-1] > MAX_BASE_DISTANCE:
            raise UserError(f"{other} and {first} do not share a base: their backbones differ by "
                                       f"{distances[-1]:.0%} of the first one's norm (fine-tunes of one base differ "
                                       "by a few percent); average only models trained from the same starting model")
        for key, value in other_state.items():
            if value.is_floating_point():
                total[key] += value.double()
            elif not torch.equal(value, total[key]):
                raise UserError(f"{other} and {first} differ in the integer buffer '{key}'")
        del other_model, other_state  # one extra model in memory at a time
    model.load_state_dict({key: (value / len(paths)).to(state[key].dtype) if value.is_floating_point() else value
                           for key, value in total.items()})
    save_hf_model(model, tokenizer, output)
    write_contract(replace(contract, reward_mean=None, reward_std=None), output)
    record = {"method": "uniform weight average (WARM)", "models": paths,
              "backbone_distance_from_first": distances, "reward_statistics": None}
    (Path(output) / MERGE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def _check_output(output: Path, paths: list[str]) -> None:
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise UserError(f"--output: {output} already exists and is not an empty folder; give a new folder "
                                      "for the merged model")
    if any(output.resolve() == Path(p).resolve() for p in paths):
        raise UserError(f"--output: {output} is one of the models to merge; give a new folder")


def _config(path: str) -> dict:
    values = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    return {key: value for key, value in values.items() if key not in CONFIG_NOISE}


def _check_same_config(first: str, other: str) -> None:
    a, b = _config(first), _config(other)
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            raise UserError(f"{other} and {first} are different architectures: config.json's '{key}' is "
                                       f"{_short(b.get(key))} against {_short(a.get(key))}; average only models "
                                       "fine-tuned from the same base")


def _check_same_tokenizer(first: str, tokenizer, other: str, other_tokenizer) -> None:
    checks = (("vocabulary", lambda t: t.get_vocab()), ("special tokens", lambda t: t.special_tokens_map),
              ("chat template", lambda t: getattr(t, "chat_template", None)))
    for what, read in checks:
        if read(tokenizer) != read(other_tokenizer):
            raise UserError(f"{other} and {first} have different tokenizers (the {what} differs); "
                                       "average only models that read text the same way")


def _check_same_contract(first: str, contract, other: str, other_contract) -> None:
    a, b = asdict(contract), asdict(other_contract)
    for key in a:
        if key not in ("reward_mean", "reward_std") and a[key] != b[key]:
            raise UserError(f"{other} and {first} score differently: scoring_contract.json's '{key}' is "
                                       f"{_short(b[key])} against {_short(a[key])}; average only models with one "
                                       "scoring contract")


def _head_keys(model: torch.nn.Module) -> set[str]:
    """State-dict keys of the reward head: those outside the backbone (`base_model_prefix`)."""
    prefix = getattr(model, "base_model_prefix", "") + "."
    return {key for key in model.state_dict() if not key.startswith(prefix)}


def _backbone_distance(state: dict, other: dict, head: set[str]) -> float:
    """`||other - state|| / ||state||` over the backbone's weight matrices (float64). Norm weights and biases
    are left out: they start at the same constants (ones, zeros) in every model, whatever its base, and in a
    small model they would hide two unrelated bases."""
    diff = norm = 0.0
    for key, value in state.items():
        if key in head or not value.is_floating_point() or value.dim() < 2:
            continue
        diff += float((other[key].double() - value.double()).pow(2).sum())
        norm += float(value.double().pow(2).sum())
    return (diff / norm) ** 0.5 if norm else 0.0


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
