"""Former spellings of command-line flags: still accepted, with a one-line warning that names the new flag."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


class OldFlag(argparse.Action):
    """A former spelling of a flag: does what ``new_flag`` does, after a one-line deprecation warning on stderr."""

    def __init__(self, option_strings: Sequence[str], dest: str, new_flag: str, **kw: Any) -> None:
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kw)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog}: warning: {option_string} is deprecated, use {self.new_flag}", file=sys.stderr)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def add_old_flag(group: Any, old: str, new: str, kw: dict[str, Any], *, flips: bool) -> None:
    """Add ``old`` to ``group`` (an argparse parser or group) as a hidden spelling of ``new``, whose
    ``add_argument`` keywords are ``kw``; ``flips``: ``new`` is an on/off flag that stores ``not kw["default"]``
    of its field (given here as the store action's constant)."""
    hidden = {**kw, "help": argparse.SUPPRESS, "action": OldFlag, "new_flag": new}
    if flips:
        hidden.update(nargs=0, const=kw["action"] == "store_true")
    group.add_argument(old, **hidden)
