"""The exceptions users see. The CLI turns them into one clear message and exit status 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (data, config, arguments): reported without a traceback, exit status 2."""


class DataError(UserError):
    """A problem in a data file, located by file, line (or record index) and field.

    Args:
        path: the file (or dataset name) the record came from.
        line: 1-based line number for line-oriented files, else the 0-based record index.
        field: the offending field, or None when the whole record is at fault.
        message: what is wrong, in words a user can act on.
    """

    def __init__(self, path: str, line: int | None, field: str | None, message: str):
        self.path, self.line, self.field, self.message = str(path), line, field, message
        where = self.path if line is None else f"{self.path}:{line}"
        what = f" field '{field}':" if field else ""
        super().__init__(f"{where}:{what} {message}")


class ConfigError(UserError):
    """A bad configuration key or value; `key` is the dotted path (e.g. `policy.optimizer.lr`)."""

    def __init__(self, key: str, message: str):
        self.key, self.message = key, message
        super().__init__(f"config key '{key}': {message}")


class RunStopped(RuntimeError):
    """A training run stopped before its end with nothing applied from the step that met the fault; the CLI
    reports `<outcome>: <message>` without a traceback, exit status 1, and the last checkpoint stays good."""

    outcome = "stopped"


class TrainingDiverged(RunStopped):
    """The training loss, or the policy's logits while it samples, became NaN or infinite (every recipe)."""

    outcome = "training failed"


class RolloutFailed(RunStopped):
    """A rollout could not be scored: the reward server failed, or a reward was NaN (GRPO)."""
