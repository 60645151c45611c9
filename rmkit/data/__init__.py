"""Preference and regression data: read every layout users bring, validate, tokenize, batch.

    result = load_preference_data("train.jsonl")            # format sniffed from the fields
    result.records   # list[PreferencePair]
    result.skipped   # [(source, reason)] with on_error="skip" (and tie pairs with keep_ties=True)
    write_rejects("rejects.jsonl", result.skipped)

Bad input raises `rmkit.errors.DataError` naming file, line (or record index) and field.
"""

from rmkit.data.formats import FORMATS
from rmkit.data.load import (
    LoadResult,
    load_preference_data,
    load_regression_data,
    load_validation_sets,
    loaded_line,
    write_rejects,
)
from rmkit.data.records import MISSING_LABEL, Message, PreferencePair, RegressionExample

__all__ = [
    "FORMATS", "MISSING_LABEL", "LoadResult", "Message", "PreferencePair", "RegressionExample",
    "load_preference_data", "load_regression_data", "load_validation_sets", "loaded_line", "write_rejects",
]
