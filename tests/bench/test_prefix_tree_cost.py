"""benchmarks/prefix_tree_cost.py on a tiny random decoder: both forwards timed on each set, the sets share what
they say, and the estimate that decides `prm.share_prefixes: auto` is recorded beside the measured ratio."""

import json

from benchmarks import prefix_tree_cost
from tests.support.tiny import make_tiny_decoder


def test_prefix_tree_cost_smoke(tmp_path):
    model = make_tiny_decoder(tmp_path / "decoder")
    out = tmp_path / "cost.json"
    assert prefix_tree_cost.main(["--model", str(model), "--sequences", "3", "--length", "60", "--repeats", "1",
                                  "--threads", "1", "--output", str(out)]) == 0
    sets = json.loads(out.read_text())["sets"]
    assert set(sets) == {"branches", "template", "nothing"}
    assert sets["branches"]["trie_tokens"] == 30 + 3 * 30 and sets["template"]["trie_tokens"] == 20 + 3 * 40
    assert sets["nothing"]["trees"] == 3 and sets["nothing"]["trie_tokens"] == 3 * 60
    assert sets["branches"]["tree_pays"] and not sets["nothing"]["tree_pays"]
    for row in sets.values():
        assert len(row["seconds"]["padded"]) == len(row["seconds"]["tree"]) == 1 and row["tree_over_padded"] > 0
