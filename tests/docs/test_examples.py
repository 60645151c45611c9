"""Every shell command and Python block of the documentation runs (tiny random models, a few steps, tiny files
under the names the pages use), or its page says why not; every `output` block is what its command prints.
How a page's blocks run: `tests/docs/examples.py`."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from rmkit.serve.process import free_port
from tests.docs.examples import DATA, REPO, RUNNABLE, Block, PageRun, blocks, pages, tiny_overrides
from tests.support.reward_models import write_pairs

SLOW_PAGES = {"reward-models/export.md", "recipes/grpo.md"}  # about 30 s each: processes and servers


def runnable_pages() -> list:
    return [pytest.param(page, marks=[pytest.mark.slow] if page in SLOW_PAGES else [])
            for page in pages() if any(b.language in RUNNABLE and not b.illustrative for b in blocks(page))]


def test_every_block_is_run_checked_or_marked():
    """A block is a command or program that runs, data (`text`, `json`, `yaml`), or marked illustrative with a
    reason; an `output` block follows a block that runs."""
    problems = []
    for page in pages():
        found = blocks(page)
        for previous, block in zip([None, *found], found):
            if block.language not in RUNNABLE + DATA:
                problems.append(f"{block.where}: a ```{block.language} block: use one of {RUNNABLE + DATA}")
            if block.illustrative == "":
                problems.append(f"{block.where}: illustrative, but the page does not say why")
            if block.output and (block.language != "text" or previous is None or previous.illustrative is not None
                                 or previous.language not in RUNNABLE):
                problems.append(f"{block.where}: an output block must be a text block after a block that runs")
    assert not problems, "\n".join(problems)


def test_the_pages_hold_examples_that_run():
    assert len(runnable_pages()) >= 10  # the page test below is not vacuous


def test_a_failing_example_fails_its_page(docs_repo, tmp_path):
    """The runner reports a command that fails, a wrong exit status and output the command did not print."""
    run = PageRun(_copy(docs_repo, tmp_path), dict(os.environ), free_port(), {})
    failing = Block("x.md", 1, "bash", "rmkit data check missing.jsonl\n")
    with pytest.raises(AssertionError, match="exited 2, expected 0"):
        run.run(failing)
    assert "missing.jsonl" in run.run(Block("x.md", 1, "bash", "rmkit data check missing.jsonl\n", exits=2))
    with pytest.raises(AssertionError, match="python exited"):
        run.run(Block("x.md", 1, "python", "raise SystemExit(3)\n"))


@pytest.fixture(scope="session")
def docs_repo(tmp_path_factory, tiny_decoder, tiny_policy) -> Path:
    """What a reader has after Getting started, at tiny scale: the repository's configs and embedded data, the
    `../shared/data` files the configs name, and `results/rm/final` trained by `rmkit train`."""
    root = tmp_path_factory.mktemp("docs")
    data = root / "shared" / "data"
    data.mkdir(parents=True)
    write_pairs(data / "hh_harmless_train.jsonl", 16)
    write_pairs(data / "hh_harmless_val.jsonl", 8, offset=100)
    write_pairs(data / "pandalm_val.jsonl", 8, offset=200)
    repo = root / "repo"
    shutil.copytree(REPO / "configs", repo / "configs")
    (repo / "rmkit").mkdir()
    (repo / "rmkit" / "resources").symlink_to(REPO / "rmkit" / "resources")
    run = PageRun(repo, _env(), free_port(), tiny_overrides(tiny_decoder, tiny_policy))
    run.run(Block("(setup)", 0, "bash", "rmkit train --config configs/rm.yaml\n"))
    return repo


@pytest.mark.parametrize("page", runnable_pages())
def test_the_examples_of_a_page_run(page, docs_repo, tiny_decoder, tiny_policy, tmp_path):
    run = PageRun(_copy(docs_repo, tmp_path), _env(), free_port(), tiny_overrides(tiny_decoder, tiny_policy))
    printed = ""
    try:
        for block in blocks(page):
            if block.illustrative is not None:
                continue
            if block.output:
                missing = [line for line in block.text.splitlines() if line.strip() and line.strip() not in printed]
                assert not missing, f"{block.where}: not printed by the block before: {missing}\n{printed[-3000:]}"
            elif block.language in RUNNABLE:
                printed = run.run(block)
    finally:
        run.close()


def _copy(docs_repo: Path, tmp_path: Path) -> Path:
    """A fresh copy of the reader's repository, with `../shared/data` beside it."""
    shutil.copytree(docs_repo.parent / "shared", tmp_path / "shared")
    return Path(shutil.copytree(docs_repo, tmp_path / "repo", symlinks=True))


def _env() -> dict[str, str]:
    """The environment of a page: this interpreter's `python` first on PATH, rmkit importable, one thread."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "RMKIT_NUM_THREADS": "1"}
