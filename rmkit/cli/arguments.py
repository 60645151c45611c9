"""Argument types for the commands' numeric options: a value out of range is argparse's usage error, naming the
option, before anything loads (`rmkit eval --threads -2` said nothing until the model had loaded, then died in
torch; `rmkit serve --port 70000` loaded the model, then died in the socket)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_at_least(minimum: int, what: str = "") -> Callable[[str], int]:
    """An `int` argument type that refuses values below `minimum`; `what` says what the number counts."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}{what}, got {value}")
        return value

    return parse


def float_at_least(minimum: float) -> Callable[[str], float]:
    """A `float` argument type that refuses values below `minimum` (and NaN)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text}")
        return value

    return parse


def port(text: str) -> int:
    """A TCP port, 0 to 65535 (0: any free port)."""
    value = int_at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 0 to 65535, got {value}")
    return value


positive_int = int_at_least(1)
sequence_length = int_at_least(2, " tokens")
