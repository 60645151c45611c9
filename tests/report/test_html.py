"""report.html is one self-contained page that renders in headless Chromium (Debian's `chromium`, which
.ci/run installs): every figure decodes, no script error, the tables are there and nothing is fetched."""

import base64
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from rmkit.report import ModelScores, load_eval_set, write_report
from tests.report.rb_data import EXTRA, ROWS, write_rb_files
from tests.support.browser import chromium

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def page(tmp_path) -> Path:
    evalset = load_eval_set([str(p) for p in write_rb_files(tmp_path)])
    rewards = np.array([r[-2:] for r in ROWS] + [r[-2:] for r in EXTRA])
    noisy = rewards[:, 0] + np.random.default_rng(0).normal(0, 1, len(rewards))
    models = [ModelScores("alpha", "runs/alpha", rewards[:, 0], rewards[:, 1]),
              ModelScores("b<eta>", "runs/beta", noisy, rewards[:, 1])]  # a name HTML must escape
    write_report(tmp_path / "out", evalset, models)
    return tmp_path / "out" / "report.html"


def test_page_is_self_contained(page):
    text = page.read_text(encoding="utf-8")
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert len(images) == 4 and all(base64.b64decode(i).startswith(PNG_MAGIC) for i in images)
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", text)  # nothing to fetch: works offline
    assert "b&lt;eta&gt;" in text and "b<eta>" not in text
    # an incomplete section shows its partial score beside the word; the truncation column says what it counts
    # Reasoning (alpha): (984 * 0.5 + 164 * 1) / 1148 = 4/7 of its present subsets
    assert 'incomplete (5 missing)<span class="partial">; present subsets: 57.1%</span>' in text
    assert "<th>pairs truncated</th>" in text and "Pairs truncated: pairs whose chosen or rejected input" in text


def test_page_renders_in_headless_chromium(page, tmp_path):
    browser = chromium()
    result = subprocess.run(
        [browser, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={tmp_path / 'profile'}",
         "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    dom = result.stdout
    assert result.returncode == 0, result.stderr[-2000:]
    check = re.search(r'id="render-check"[^>]*>([^<]*)<', dom)
    assert check is not None, dom[-2000:]
    assert 'data-figures-ok="4"' in check.group(0) and 'data-figures="4"' in check.group(0)
    assert 'data-errors="0"' in check.group(0) and check.group(1) == "4 of 4 figures rendered"
    for heading in ("Headline", "Subsets", "Comparison", "Figures", "Reliability diagram", "Length bias"):
        assert f">{heading}<" in dom
    for subset in ("alpacaeval-easy", "math-prm", "extra"):
        assert f"<td>{subset}</td>" in dom
    assert "incomplete" in dom and "alpha vs b&lt;eta&gt;" in dom
