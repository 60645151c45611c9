"""The reference pages under docs/reference/ are what `scripts/gen_reference.py` writes from the code today."""

import pytest

from scripts.gen_reference import REGENERATE, REPO, field_docs, pages


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return pages()


@pytest.mark.parametrize("path", ["docs/reference/cli.md", "docs/reference/config.md",
                                  "docs/reference/api/losses.md", "docs/reference/api/inference.md",
                                  "docs/reference/api/env.md"])
def test_a_reference_page_is_current(path, generated):
    committed = (REPO / path).read_text(encoding="utf-8") if (REPO / path).is_file() else ""
    assert committed == generated[path], f"{path} is stale: run `{REGENERATE}` and commit the result"


def test_every_generated_page_is_checked(generated):
    assert sorted(generated) == sorted(str(p.relative_to(REPO)) for p in (REPO / "docs" / "reference").rglob("*.md"))


def test_the_pages_hold_the_code(generated):
    """Every command, every config key and every public loss is on its page."""
    from rmkit.cli import SUBCOMMANDS
    from rmkit.config import LoopConfig
    from rmkit.losses import __all__ as losses

    assert all(f"## rmkit {name}" in generated["docs/reference/cli.md"] for name in SUBCOMMANDS)
    assert "## rmkit data check" in generated["docs/reference/cli.md"]
    config = generated["docs/reference/config.md"]
    for loop in ("rm", "sft", "dpo", "grpo", "ppo"):
        assert all(f"| `{loop}.{key}` |" in config for key in field_docs(LoopConfig))
    assert "| `loss_fn.ratio_clip_max` | float | `0.2` |" in config and "| `env.reward_model.url` |" in config
    assert "| `policy.optimizer.lr` | float | `5.0e-06` |" in config  # DPO's default, not the reward model's
    assert all(f"## `{name}`" in generated["docs/reference/api/losses.md"] for name in losses)


def test_a_field_without_a_docstring_stops_the_generator():
    from dataclasses import dataclass

    from scripts.gen_reference import _rows

    @dataclass
    class Undocumented:
        documented: int = 1
        """It has one."""
        bare: int = 2

    with pytest.raises(SystemExit, match="Undocumented.bare .*has no docstring"):
        list(_rows(Undocumented(), "section"))
