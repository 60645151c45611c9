"""Preference and regression data: read every layout users bring, validate, tokenize, batch.

    result = load_preference_data("train.jsonl")            # format sniffed from the fields
    result.records   # list[PreferencePair]
    result.skipped   # [(source, reason)] with on_error="skip" (and tie pairs with keep_ties=True)
    write_rejects("rejects.jsonl", result.skipped)

Bad input raises `rmkit.errors.DataError` naming file, line (or record index) and field.

Step-labelled solutions for process reward models (`rmkit.data.steps`): `load_step_data(path)` reads TRL's
stepwise supervision, PRM800K, ProcessBench and PRMBench into `StepSolution`s the same way.
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
from rmkit.data.steps import (
    AMBIGUOUS,
    STEP_FORMATS,
    StepLoadResult,
    StepSolution,
    detect_step_format,
    load_step_data,
    step_summary,
)

__all__ = [
    "FORMATS", "MISSING_LABEL", "LoadResult", "Message", "PreferencePair", "RegressionExample",
    "load_preference_data", "load_regression_data", "load_validation_sets", "loaded_line", "write_rejects",
    "AMBIGUOUS", "STEP_FORMATS", "StepLoadResult", "StepSolution", "detect_step_format", "load_step_data",
    "step_summary",
]
