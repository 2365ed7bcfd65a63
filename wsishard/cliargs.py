"""The argparse value types of the CLI's flags: each reads a flag's text, or refuses it with one line."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from typing import Any

from wsishard.builder.options.keywords import format_size as format_size  # beside size_bytes, which it spells back
from wsishard.builder.options.keywords import size_bytes
from wsishard.errors import OptionError


def parse_size(text: str) -> int:
    """``512MB`` -> 512000000, ``1GiB`` -> 1073741824, ``100k`` -> 100000, ``4096`` -> 4096."""
    try:
        return size_bytes(text)
    except OptionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def number(kind: type, ok: Callable[[Any], bool], rule: str) -> Callable[[str], Any]:
    """An argparse ``type``: ``kind(text)``, refused with ``rule`` unless ``ok(value)``."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}: {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{rule}: {text!r}")
        return value

    return parse


def positive(kind: type) -> Callable[[str], Any]:
    return number(kind, lambda v: v > 0, "must be > 0")


non_negative = number(float, lambda v: v >= 0, "must be >= 0")
non_negative_int = number(int, lambda v: v >= 0, "must be >= 0")
int_ = number(int, lambda v: True, "")
fraction = number(float, lambda v: 0.0 <= v <= 1.0, "must be between 0 and 1")
degrees = number(float, lambda v: 0.0 <= v < 360.0, "must be >= 0 and < 360")


def part(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise argparse.ArgumentTypeError(f"not a part I/N with 1 <= I <= N: {text!r}")
    return int(match.group(1)), int(match.group(2))


def storage_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError("expected key=value (the value is not shown here)")
    try:
        parsed: Any = json.loads(value)  # numbers, true/false, JSON objects
    except json.JSONDecodeError:
        parsed = value
    return key.strip(), parsed
