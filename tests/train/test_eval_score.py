"""`rmkit eval` / `rmkit score` default length: the training run's, capped at the model's position limit."""

from types import SimpleNamespace

import yaml

from rmkit.cli.eval import DEFAULT_MAX_LENGTH, default_max_length


def _model(max_positions):
    return SimpleNamespace(config=SimpleNamespace(max_position_embeddings=max_positions))


def test_default_length_is_capped_at_the_position_limit(tmp_path):
    assert default_max_length(str(tmp_path), _model(512)) == 512  # BERT: 2048 would overflow positions
    assert default_max_length(str(tmp_path), _model(None)) == DEFAULT_MAX_LENGTH


def test_default_length_follows_the_training_run(tmp_path):
    config = {"policy": {"max_total_sequence_length": 256}}
    (tmp_path / "rmkit_config.yaml").write_text(yaml.safe_dump(config))
    assert default_max_length(str(tmp_path), _model(512)) == 256
    assert default_max_length(str(tmp_path), _model(128)) == 128
