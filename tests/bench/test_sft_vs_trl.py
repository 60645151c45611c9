"""benchmarks/sft_vs_trl.py end to end on a tiny random policy: TRL's SFTTrainer and `rmkit sft` (padded and
packed) each really train in their own subprocess on the same demonstrations, and the results file holds them."""

import json

import pytest

from benchmarks import sft_vs_trl


@pytest.mark.slow  # ~1 min: three training subprocesses, each importing transformers (and TRL)
def test_sft_vs_trl_end_to_end(tiny_policy, shared_data, tmp_path, capsys):
    out = tmp_path / "sft_vs_trl.json"
    assert sft_vs_trl.main(["--policy", tiny_policy, "--sequences", "8", "--data-dir", str(shared_data),
                            "--work-dir", str(tmp_path / "work"), "--output", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert [r["run"] for r in payload["runs"]] == ["trl-0", "rmkit-0", "rmkit-packed-0"]
    assert payload["data"]["sequences"] == 8 and payload["data"]["trained_tokens"] > 0
    for run in payload["runs"]:
        assert run["train_s"] > 0 and run["tokens_per_s"] > 0 and run["peak_rss_mib"] > 100
    capsys.readouterr()
