"""argparse types for whole numbers in a range, shared by the CLI and the gpu-* check
commands (which sit below the CLI and cannot import it): a bad value is argparse's one-line
error naming the flag, never a traceback or a run that checks nothing (``--steps -1``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_in(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number in [minimum, maximum]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {value}")
        return value

    return parse


positive_int = int_in(1)
non_negative_int = int_in(0)
