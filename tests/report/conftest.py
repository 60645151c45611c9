"""Tiny random models for the report tests: tests/train's fixtures (no downloads)."""

from tests.train.conftest import tiny_decoder, tiny_encoder  # noqa: F401 (fixtures)
