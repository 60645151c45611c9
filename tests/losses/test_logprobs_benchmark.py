"""The log-probs benchmark's measurement runs and its table renders (tiny shapes; no timing claims)."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "logprobs_memory.py"


def _load():
    spec = importlib.util.spec_from_file_location("logprobs_memory", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_child_measures_every_variant_and_renders_a_table():
    bench = _load()
    rows = []
    for variant in bench.VARIANTS:
        row = bench._child_mode(variant, 500, "bf16", "fwd+bwd", 1, 8, 1)
        assert row["peak_extra_mib"] >= 0 and row["time_s"] > 0 and row["variant"] == variant
        rows.append(row)
    table = bench.markdown_table(rows)
    assert table.count("\n") == 2 and "| 500 | bf16 [1, 8, 500] | fwd+bwd |" in table
