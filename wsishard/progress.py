"""Progress of long work as one injected callback type, with a no-op default (fsspec's ``callbacks.py`` model).

Library functions take ``progress: ProgressCallback[E] = ignore_progress`` and call it with an event ``E`` (a
frozen dataclass of counts) after every unit of work; they never test whether a callback was given. Only the
CLI turns events into progress bars.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

E = TypeVar("E")

ProgressCallback = Callable[[E], None]


def ignore_progress(event: Any) -> None:
    """The default callback: does nothing."""
