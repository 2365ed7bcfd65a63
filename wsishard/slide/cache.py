"""Open slide readers kept per process: a worker reads many blocks of the same slides, and opens each once.

Slide handles are opened here, in the process that reads them, never in an object that gets pickled.
"""

from __future__ import annotations

from collections import OrderedDict

from wsishard.slide import SlideReader, open_slide


class ReaderCache:
    """Open slide readers of this process, least recently used closed first."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._readers: OrderedDict[str, SlideReader] = OrderedDict()

    def get(self, path: str, fast: bool) -> SlideReader:
        reader = self._readers.pop(path, None)
        if reader is None:
            reader = open_slide(path, fast=fast)
            while len(self._readers) >= self.capacity:
                self._readers.popitem(last=False)[1].close()
        self._readers[path] = reader
        return reader

    def clear(self) -> None:
        for path in list(self._readers):
            self.drop(path)

    def drop(self, path: str) -> None:
        reader = self._readers.pop(path, None)
        if reader is not None:
            reader.close()


READERS = ReaderCache()  # this process's open slides


def close_readers() -> None:
    """Close every slide handle this process holds."""
    READERS.clear()
