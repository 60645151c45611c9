"""Every recipe's training and validation data, in one place: each file loaded, validated and tokenized once (with its
skipped records reported), then batched by length. The reward model's pairs or labelled examples
(`load_run_data`), demonstrations (`load_demonstration_set`), a policy's preference pairs (`load_policy_pairs`) and
RL prompts (`load_prompt_set`); `load_sets` gives a recipe its training set and validation sets by name."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rmkit import distributed as dist
from rmkit.config import Config, DataConfig
from rmkit.data import LoadResult, load_preference_data, load_regression_data, loaded_line, write_rejects
from rmkit.data.demonstrations import load_demonstrations, tokenize_demonstrations
from rmkit.data.policy_tokenize import PolicyPair, tokenize_policy_pairs
from rmkit.data.prompts import load_prompts
from rmkit.data.readers import check_data_path, first_record
from rmkit.data.sampler import LengthGroupedBatchSampler, PrefixGroupedBatchSampler
from rmkit.data.tokenize import render_prompt, tokenize_pairs, tokenize_regression
from rmkit.errors import ConfigError, DataError

RESOURCES = Path(__file__).resolve().parents[1] / "resources"
EMBEDDED = {"default": RESOURCES / "default_train.jsonl", "default-val": RESOURCES / "default_val.jsonl"}


def resolve_data_path(path: str) -> str:
    """`default` / `default-val` -> the preference set that ships with rmkit; other paths unchanged."""
    return str(EMBEDDED.get(path, path))


def check_data_paths(data) -> None:
    """`data.train_data_path` and every `data.val_data_paths` entry exist (or name a Hub dataset): a ConfigError
    naming the key otherwise, before any model loads. Then `check_val_keys`."""
    check_data_path(resolve_data_path(data.train_data_path), "data.train_data_path")
    for name, path in (data.val_data_paths or {}).items():
        check_data_path(resolve_data_path(path), f"data.val_data_paths.{name}")
    check_val_keys(data)


def check_val_keys(data) -> None:
    """With keys remapped for the training file (`data.prompt_key: question`, ...), a validation set read with
    them (no `data.val_keys` entry) whose first record has the standard field (`prompt`) in place of a
    remapped one: a DataError naming the file, the field and how to give the file its own keys."""
    standard = type(data)()
    remapped = {k: getattr(data, k) for k in data.key_names() if getattr(data, k) != getattr(standard, k)}
    for name, path in data.val_data_paths.items() if remapped else ():
        record = None if name in data.val_keys else first_record(resolve_data_path(path), data.split)
        if record is None:
            continue
        missing = [k for k, field in remapped.items() if field not in record.data and getattr(standard, k) in record.data]
        if missing:
            key = missing[0]
            given = ", ".join(f"data.{k}={remapped[k]}" for k in missing)
            raise DataError(record.path, record.line, remapped[key],
                            f"missing in validation set '{name}', which has the standard '{getattr(standard, key)}' "
                            f"instead ({given}: remapped for the training file); give this file its own keys: "
                            f"data.val_keys.{name}={{}} for the standard ones, or "
                            f"data.val_keys.{name}={{{key}: FIELD}}")


@dataclass
class RunData:
    """Tokenized training items (pairs or regression examples), validation sets by name, and lengths."""

    train: list
    val: dict[str, list]
    lengths: list[int]


@dataclass(frozen=True)
class DataSet:
    """One data file of a run as a recipe reads it: the options that read it (`data.for_set`: its own keys), its
    path, where its skipped records go and the label its report line and metrics carry."""

    data: DataConfig
    path: str
    rejects: Path
    label: str

    @classmethod
    def of(cls, data: DataConfig, name: str | None, out_dir: Path) -> DataSet:
        """Validation set `name` of `data`, or the training file (None); rejects go to `out_dir`."""
        if name is None:
            return cls(data, data.train_data_path, out_dir / "rejects-train.jsonl", "train")
        return cls(data.for_set(name), data.val_data_paths[name], out_dir / f"rejects-{name}.jsonl", f"validation-{name}")


def report_data(ds: DataSet, loaded: LoadResult, count: int, noun: str, dropped: Sequence[tuple[str, str]] = (),
                notes: Sequence[str] = ()) -> None:
    """Rank 0 (every rank loads the same data) writes a set's skipped records (`loaded.skipped`, then `dropped`)
    to its rejects file and prints what the set gave in `rmkit data check`'s words (`loaded_line`), then `notes`
    and the skipped count: `rmkit: train: data.jsonl: 360 pairs (binary format); 2 truncated to 512 tokens`."""
    skipped = list(loaded.skipped) + list(dropped)
    if not dist.is_main():
        return
    if skipped:
        write_rejects(ds.rejects, skipped)
    notes = [*notes, *([f"{len(skipped)} skipped -> {ds.rejects}"] if skipped else [])]
    print(f"rmkit: {ds.label}: {loaded_line(ds.path, count, noun, loaded.format)}"
          + (f"; {', '.join(notes)}" if notes else ""), file=sys.stderr)


def check_identical(ds: DataSet, pairs: Sequence) -> None:
    """Pairs whose chosen and rejected responses are the same text teach a preference nothing (their loss has no
    gradient): a warning naming the first (rank 0), and a DataError when every pair of a training file is one."""
    identical = [p for p in pairs if p.chosen == p.rejected]
    if not identical:
        return
    if len(identical) == len(pairs) and ds.label == "train":
        raise DataError(ds.path, None, None, f"every one of its {len(pairs)} pairs has identical chosen and rejected "
                        "responses: there is no preference to learn (check data.chosen_key and data.rejected_key)")
    if dist.is_main():
        print(f"rmkit: warning: {ds.label}: {len(identical)} of {len(pairs)} pairs have identical chosen and rejected "
              f"responses (first: {identical[0].source}); they carry no preference: fix or drop them "
              f"(`rmkit data check {ds.path} --identical error` lists them)", file=sys.stderr)


def _load_and_tokenize(cfg: Config, ds: DataSet, tokenizer, truncation: str) -> list:
    data, path = ds.data, ds.path
    max_length = cfg.policy.max_total_sequence_length
    if cfg.policy.reward_model_cfg.reward_model_type == "regression":
        loaded = load_regression_data(
            resolve_data_path(path), prompt_key=data.prompt_key, label_key=data.label_key,
            num_labels=cfg.policy.reward_model_cfg.num_labels, on_error=data.on_error, split=data.split,
        )
        tokenized = tokenize_regression(loaded.records, tokenizer, max_length, overlong=data.overlong)
        items = tokenized.examples
    else:
        loaded = load_preference_data(
            resolve_data_path(path), format=data.format, prompt_key=data.prompt_key,
            chosen_key=data.chosen_key, rejected_key=data.rejected_key, on_error=data.on_error,
            keep_ties=data.keep_ties, allow_empty_response=data.allow_empty_response, split=data.split,
        )
        check_identical(ds, loaded.records)
        tokenized = tokenize_pairs(loaded.records, tokenizer, max_length, overlong=data.overlong, truncation=truncation)
        items = tokenized.pairs
    noun = "example" if cfg.policy.reward_model_cfg.reward_model_type == "regression" else "pair"
    report_data(ds, loaded, len(items), noun, tokenized.dropped, [f"{tokenized.truncated} truncated to {max_length} tokens"])
    return items


def item_length(item) -> int:
    """Padded length an item costs: the longer side of a pair, or the example's length."""
    if hasattr(item, "chosen_ids"):
        return max(len(item.chosen_ids), len(item.rejected_ids))
    return len(item.input_ids)


def item_tokens(item) -> int:
    """Real (non-padding) tokens an item feeds the model."""
    if hasattr(item, "chosen_ids"):
        return len(item.chosen_ids) + len(item.rejected_ids)
    return len(item.input_ids)


def load_run_data(cfg: Config, tokenizer, out_dir: Path) -> RunData:
    """Load and tokenize `data.train_data_path` and every `data.val_data_paths` entry."""
    train = _load_and_tokenize(cfg, DataSet.of(cfg.data, None, out_dir), tokenizer, cfg.data.pair_truncation)
    if not train:
        raise DataError(cfg.data.train_data_path, None, None, "no usable training records")
    val = {
        # Validation is a scoring path: each side is cut on its own, as eval, score and serve cut it.
        name: _load_and_tokenize(cfg, DataSet.of(cfg.data, name, out_dir), tokenizer, "per_text")
        for name in cfg.data.val_data_paths
    }
    return RunData(train=train, val=val, lengths=[item_length(i) for i in train])


def make_sampler(cfg, lengths: list[int], seed: int, sequences: list[list[int]] | None = None):
    """Global batches of indices (of `policy.train_global_batch_size`, shuffled from `seed`). `length_grouped` puts similar lengths together (little padding);
    `random` is a plain shuffle (each length its own bucket is not needed: all lengths equal); `prefix_grouped` (a
    process reward model's: `sequences` are its items' token ids) puts items that begin alike together."""
    if cfg.data.batching == "random":
        lengths = [0] * len(lengths)  # one length: grouping degenerates into a plain shuffle
    # Every data-parallel rank builds the same global batches and takes its own slice of each.
    world = dist.world_size()
    if cfg.policy.train_global_batch_size % world:
        raise ConfigError("policy.train_global_batch_size",
                          f"{cfg.policy.train_global_batch_size} does not divide among {world} processes")
    if cfg.data.batching == "prefix_grouped":
        return PrefixGroupedBatchSampler(sequences, batch_size=cfg.policy.train_global_batch_size // world,
                                         seed=seed, num_replicas=world, rank=dist.rank())
    return LengthGroupedBatchSampler(lengths, batch_size=cfg.policy.train_global_batch_size // world,
                                     seed=seed, mega_batch_mult=cfg.data.length_group_window,
                                     num_replicas=world, rank=dist.rank())


def sampled_items(sampler: LengthGroupedBatchSampler, steps: int) -> list[int]:
    """The indices of every item the first `steps` global batches of `sampler` take, sorted: every rank's share (a
    copy at one replica and the global batch size draws the same global batches; `sampler` is not moved)."""
    whole = LengthGroupedBatchSampler(sampler.lengths, sampler.batch_size * sampler.num_replicas, seed=sampler.seed,
                                      shuffle=sampler.shuffle, drop_last=sampler.drop_last,
                                      mega_batch_mult=sampler.mega_batch_mult)
    taken, epoch = set(), 0
    while steps > 0:
        whole.set_epoch(epoch)
        batches = whole.batches()[:steps]
        taken.update(i for batch in batches for i in batch)
        steps, epoch = steps - len(batches), epoch + 1
    return sorted(taken)


def load_sets(data: DataConfig, out_dir: Path, load: Callable[[DataSet], list], noun: str) -> tuple[list, dict[str, list]]:
    """`(training items, {validation set name: items})`, each file through `load`; a training file that leaves no
    usable item is a DataError naming it."""
    train = load(DataSet.of(data, None, out_dir))
    if not train:
        raise DataError(data.train_data_path, None, None, f"no usable training {noun}")
    return train, {name: load(DataSet.of(data, name, out_dir)) for name in data.val_data_paths}


def load_demonstration_set(cfg, ds: DataSet, tokenizer) -> list:
    """Demonstrations of a data set (`cfg`: the SFT tree), validated and tokenized; skipped records go to its
    rejects file (rank 0 reports)."""
    data, sft = ds.data, cfg.sft
    max_length = cfg.policy.max_total_sequence_length
    loaded = load_demonstrations(resolve_data_path(ds.path), data.format, messages_key=data.messages_key,
                                 prompt_key=data.prompt_key, response_key=data.response_key, chosen_key=data.chosen_key,
                                 rejected_key=data.rejected_key, allow_empty_response=data.allow_empty_response,
                                 keep_ties=data.keep_ties, on_error=data.on_error, split=data.split)
    tokenized = tokenize_demonstrations(loaded.records, tokenizer, max_length, data.overlong, sft.assistant_only_loss,
                                        sft.only_unmask_final, data.on_error)
    report_data(ds, loaded, len(tokenized.items), "demonstration", tokenized.dropped,
                [f"{tokenized.truncated} truncated to {max_length} tokens"])
    return tokenized.items


def load_policy_pairs(cfg, ds: DataSet, tokenizer) -> list[PolicyPair]:
    """A preference file through rmkit's data layer (formats, validation, `on_error`), as a policy's pairs (DPO):
    the prompt rendered as at generation."""
    data, max_length = ds.data, cfg.policy.max_total_sequence_length
    loaded = load_preference_data(
        resolve_data_path(ds.path), format=data.format, prompt_key=data.prompt_key, chosen_key=data.chosen_key,
        rejected_key=data.rejected_key, on_error=data.on_error, keep_ties=data.keep_ties,
        allow_empty_response=data.allow_empty_response, split=data.split)
    check_identical(ds, loaded.records)
    tokenized = tokenize_policy_pairs(loaded.records, tokenizer, max_length, overlong=data.overlong)
    report_data(ds, loaded, len(tokenized.pairs), "pair", tokenized.dropped,
                [f"{tokenized.truncated} truncated to {max_length} tokens"])
    if tokenized.emptied and dist.is_main():
        print(f"rmkit: warning: {ds.label}: {tokenized.emptied} of {len(tokenized.pairs)} prompts were cut to nothing "
              f"(what is left is what every prompt is rendered with: policy.max_total_sequence_length={max_length} "
              "leaves the responses all the room); raise policy.max_total_sequence_length, or set data.overlong=drop to "
              "leave out every pair that does not fit", file=sys.stderr)
    return tokenized.pairs


@dataclass
class PromptItem:
    """A prompt, where it came from, and its token ids rendered with the policy's chat template."""

    source: str
    prompt: str | list[dict]
    ids: list[int]


def load_prompt_set(cfg, ds: DataSet, tokenizer) -> list[PromptItem]:
    """The prompts of a data set rendered for the policy; prompts that leave no room for `max_new_tokens` within
    `policy.max_total_sequence_length` are skipped (listed in its rejects file), as are bad records under
    `data.on_error: skip`."""
    data, budget = ds.data, cfg.policy.max_total_sequence_length - cfg.policy.generation.max_new_tokens
    loaded = load_prompts(resolve_data_path(ds.path), data.format if data.format != "regression" else "prompts",
                          prompt_key=data.prompt_key, chosen_key=data.chosen_key, rejected_key=data.rejected_key,
                          on_error=data.on_error, split=data.split)
    items, too_long = [], []
    for prompt in loaded.records:
        ids = render_prompt(tokenizer, prompt.prompt)
        if len(ids) > budget:
            too_long.append((prompt.source, f"the prompt has {len(ids)} tokens; with policy.generation.max_new_tokens "
                                            f"it exceeds policy.max_total_sequence_length"))
        else:
            items.append(PromptItem(prompt.source, prompt.prompt, ids))
    report_data(ds, loaded, len(items), "prompt", too_long)
    skipped = loaded.skipped + too_long
    if not items:
        raise DataError(ds.path, None, None, f"no usable prompts ({len(skipped)} skipped, see {ds.rejects})"
                        if skipped else "no prompts")
    return items


def load_step_set(cfg, ds: DataSet, tokenizer) -> list:
    """Step-labelled solutions of a data set (`cfg`: the PRM tree) for a process reward model: read and checked
    (`load_step_data`, a step holding `prm.step_separator` is a DataError), tokenized (`tokenize_steps`: each
    labelled step's label at its separator's last token); dropped solutions go to its rejects file."""
    from rmkit.data.step_tokenize import tokenize_steps
    from rmkit.data.steps import load_step_data

    data, prm, max_length = ds.data, cfg.prm, cfg.policy.max_total_sequence_length
    if not tokenizer.encode(prm.step_separator, add_special_tokens=False):
        raise ConfigError("prm.step_separator", f"{prm.step_separator!r} is no token at all for this tokenizer (it "
                          "drops it), so a step's label would have no separator to sit on; choose one it keeps")
    loaded = load_step_data(resolve_data_path(ds.path), data.format, ambiguous=prm.ambiguous,
                            step_separator=prm.step_separator, on_error=data.on_error, split=data.split)
    tokenized = tokenize_steps(loaded.records, tokenizer, max_length, prm.step_separator, prm.train_on_last_step_only,
                               data.overlong)
    steps = sum(len(item.positions) for item in tokenized.items)
    report_data(ds, loaded, len(tokenized.items), "solution", tokenized.dropped,
                [f"{steps} labelled steps", f"{tokenized.truncated} truncated to {max_length} tokens "
                 f"({tokenized.steps_cut} labelled steps past the cut dropped)"])
    return tokenized.items
