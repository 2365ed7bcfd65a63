"""Decoded tiles kept per process, so that a tile several reads need is decoded once (:data:`TILES`)."""

from __future__ import annotations

import itertools
from collections import Counter, OrderedDict

import numpy as np


class TileCache:
    """Recently decoded tiles of this process, least recently used dropped first, up to ``max_bytes``.

    Neighbouring blocks of a slide share the tiles along their common edge; with a non-integer scale the grid does
    not line up with the tiles, and a tile on such an edge would be decoded twice. A build worker tells its reader
    every block's read before the first (:meth:`~wsishard.slide.tiff.TiffTileReader.plan_read`): a tile that
    planned reads share is kept until its last one, which takes it out (``get(key, last=True)``). Reads nobody
    planned keep the tiles on the edge of their region, which a neighbouring region may read too. Keyed by the
    reader (a number of its own, dropped when it closes), the page, the tile and the scale.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.hits_at: Counter[int] = Counter()  # by scale factor
        self.misses_at: Counter[int] = Counter()  # decodes, by scale factor
        self._tiles: OrderedDict[tuple[int, int, int, int], np.ndarray] = OrderedDict()
        self._bytes = 0
        self._readers = itertools.count()

    @property
    def hits(self) -> int:
        return self.hits_at.total()

    @property
    def misses(self) -> int:
        return self.misses_at.total()

    def new_reader(self) -> int:
        """A number for a reader's tiles (never reused: a file replaced at the same path gets a new one)."""
        return next(self._readers)

    def get(self, key: tuple[int, int, int, int], last: bool = False) -> np.ndarray | None:
        """The tile, or None (a miss); ``last``: its last planned use, so it leaves the cache."""
        tile = self._tiles.pop(key, None) if last else self._tiles.get(key)
        if tile is None:
            self.misses_at[key[3]] += 1
            return None
        self.hits_at[key[3]] += 1
        if last:
            self._bytes -= tile.nbytes
        else:
            self._tiles.move_to_end(key)
        return tile

    def put(self, key: tuple[int, int, int, int], tile: np.ndarray) -> None:
        if tile.nbytes > self.max_bytes:
            return
        self._tiles[key] = tile
        self._bytes += tile.nbytes
        while self._bytes > self.max_bytes:
            self._bytes -= self._tiles.popitem(last=False)[1].nbytes

    def drop_reader(self, reader: int) -> None:
        for key in [k for k in self._tiles if k[0] == reader]:
            self._bytes -= self._tiles.pop(key).nbytes


TILES = TileCache(16 << 20)  # 16 MB, 340 tiles of 256 px at 1/2: 12.5% of decodes saved at 0.2265 (32 MB: 13%)
