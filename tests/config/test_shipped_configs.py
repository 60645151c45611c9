"""Every config that ships, and every YAML snippet the documentation shows (`docs/`), loads into its recipe's config
tree (the tree is the one whose loop section the YAML has; a snippet without one must load into the reward-model
tree, the default); each recipe's defaults are the default values of its tree; and a shipped config tells the truth
about them ("defaults shown unless noted": a value that is not the code's default says `not the default` on its
line)."""

from pathlib import Path

import pytest
import yaml

from rmkit.cli.recipes import RECIPES, _load
from rmkit.config import config_to_dict, load_config
from tests.docs.examples import blocks, pages

REPO = Path(__file__).resolve().parents[2]
LOOP_SECTIONS = {"rm": "train", "sft": "sft", "dpo": "dpo", "grpo": "grpo", "ppo": "ppo", "prm": "prm"}


def tree_for(values: dict) -> type:
    """The config tree of the recipe whose loop section `values` has (the reward model's when none)."""
    loops = [LOOP_SECTIONS[k] for k in values if k in LOOP_SECTIONS]
    assert len(loops) <= 1, f"one loop section per config, got {loops}"
    return _load(RECIPES[loops[0] if loops else "train"].tree)


def docs_snippets() -> list[tuple[str, str]]:
    """`(where, text)` of every `yaml` block of the documentation's pages."""
    return [(block.where, block.text) for page in pages() for block in blocks(page) if block.language == "yaml"]


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    values = yaml.safe_load(path.read_text(encoding="utf-8"))
    cfg = load_config(path, tree_type=tree_for(values))
    assert cfg.checkpointing.checkpoint_dir  # a whole tree came back


MISSING = "<not in the tree's defaults>"


def yaml_leaves(text: str) -> list[tuple[str, int]]:
    """`(dotted key, 0-based line of the key)` of every value of a YAML mapping that is not itself a section."""
    leaves = []

    def walk(node: yaml.MappingNode, prefix: str) -> None:
        for key, value in node.value:
            if isinstance(value, yaml.MappingNode) and value.value:
                walk(value, f"{prefix}{key.value}.")
            else:
                leaves.append((f"{prefix}{key.value}", key.start_mark.line))

    walk(yaml.compose(text), "")
    return leaves


def lookup(tree: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return MISSING
        tree = tree[part]
    return tree


def untruths(path: Path) -> list[str]:
    """Where a config file and its recipe's code defaults disagree unmarked, or a line says `not the default` of a
    value that is the default."""
    text = path.read_text(encoding="utf-8")
    tree = tree_for(yaml.safe_load(text))
    shown, default = (config_to_dict(load_config(p, tree_type=tree)) for p in (path, None))
    lines, wrong = text.splitlines(), []
    for key, line in yaml_leaves(text):
        differs, marked = lookup(shown, key) != lookup(default, key), "not the default" in lines[line]
        if differs != marked:
            wrong.append(f"{path.name}:{line + 1}: {key}: {lookup(shown, key)!r}, the default {lookup(default, key)!r}: "
                         + ("unmarked" if differs else "marked 'not the default' but it is"))
    return wrong


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_a_shipped_config_marks_every_value_that_is_not_the_default(path):
    """`rmkit R --config F` and `rmkit R` differ exactly where F's lines say `not the default`."""
    assert not untruths(path), "\n".join(untruths(path))


def test_an_unmarked_change_and_a_stale_mark_are_both_caught(tmp_path):
    path = tmp_path / "rm.yaml"
    path.write_text("rm:\n  max_num_epochs: 3\n  val_period: 50  # not the default\n  log_period: 10\n", encoding="utf-8")
    assert [line.split(": ")[0] for line in untruths(path)] == ["rm.yaml:2", "rm.yaml:3"]


@pytest.mark.parametrize("where, snippet", docs_snippets(), ids=[where for where, _ in docs_snippets()])
def test_every_docs_yaml_snippet_loads(tmp_path, where, snippet):
    path = tmp_path / "snippet.yaml"
    path.write_text(snippet, encoding="utf-8")
    load_config(path, tree_type=tree_for(yaml.safe_load(snippet)))


def test_the_docs_have_yaml_snippets():
    assert len(docs_snippets()) >= 3  # the test above is not vacuous


@pytest.mark.parametrize("name, key, value", [
    ("sft", "policy.train_micro_batch_size", 4), ("sft", "checkpointing.checkpoint_dir", "results/sft"),
    ("dpo", "dpo.max_num_steps", 150), ("dpo", "policy.optimizer.lr", 5e-6), ("dpo", "policy.scheduler.name", "constant"),
    ("grpo", "grpo.max_num_steps", 100), ("grpo", "checkpointing.metric_name", "validation/reward_mean"),
    ("train", "rm.max_num_steps", None), ("train", "policy.model_name", "minilm"),
])
def test_a_partial_section_keeps_the_recipe_defaults_of_its_other_keys(name, key, value):
    """`policy.num_threads=1` given alone must not reset the recipe's other policy defaults to the shared
    section's (the tree's defaults are default values, and YAML is laid over them)."""
    cfg = load_config(None, ["policy.num_threads=1", "checkpointing.keep_top_k=2", "logger.plots=false"],
                      tree_type=_load(RECIPES[name].tree))
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    assert node == value


@pytest.mark.parametrize("name", ["sft", "dpo", "grpo"])
def test_a_policy_recipe_rejects_the_reward_head_key(name):
    from rmkit.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(None, ["policy.reward_model_cfg.num_labels=2"], tree_type=_load(RECIPES[name].tree))
    assert err.value.key == "policy.reward_model_cfg"
