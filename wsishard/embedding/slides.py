"""Reading an embeddings output's slide samples back: each member parsed and checked, npy arrays with
``np.load(allow_pickle=False)`` only (a member that would need unpickling is an error, never run)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from wsishard.errors import ShardError
from wsishard.manifest import Manifest
from wsishard.shards.reader import group_members, tar_members
from wsishard.storage.opener import StreamOpener
from wsishard.storage.urls import join

__all__ = ["SlideBag", "parse_slide", "read_slides"]

_MEMBERS = ("features.npy", "coords.npy", "keys.json", "json", "cls")


@dataclass(frozen=True)
class SlideBag:
    """One slide's sample of an embeddings output."""

    slide_id: str
    features: np.ndarray  # (N, D) float16
    coords: np.ndarray  # (N, 2) int32: level-0 x, y of each patch's top-left corner
    keys: list[str]  # the source samples' keys, in the same order
    meta: dict[str, Any]  # the sample's .json (slide id, label, patch mpp and size, model, D, source id)
    label: int  # -1 when unlabelled


def _array(members: dict[str, bytes], name: str, where: str) -> np.ndarray:
    try:
        return np.load(io.BytesIO(members[name]), allow_pickle=False)
    except KeyError as exc:
        raise ShardError(where, f"no {name} member") from exc
    except ValueError as exc:  # a pickled object array, or not an npy file
        raise ShardError(where, f"{name} is not a plain npy array ({exc})") from exc


def parse_slide(key: str, members: dict[str, bytes], where: str) -> SlideBag:
    """A slide sample from its members (extension -> bytes).

    Raises:
        ShardError: a member missing or unreadable, or shapes that do not agree (naming ``where`` and the key).
    """
    at = f"{where}: {key}"
    features, coords = _array(members, "features.npy", at), _array(members, "coords.npy", at)
    try:
        keys = json.loads(members["keys.json"])
        meta = json.loads(members["json"])
        label = int(members["cls"]) if "cls" in members else -1
    except (KeyError, ValueError) as exc:
        raise ShardError(at, f"keys.json, .json or .cls missing or unreadable ({exc})") from exc
    n = len(keys) if isinstance(keys, list) else -1
    if features.ndim != 2 or coords.shape != (n, 2) or features.shape[0] != n or not isinstance(meta, dict):
        raise ShardError(at, f"features {features.shape}, coords {coords.shape} and {n} keys do not agree")
    return SlideBag(key, features, coords.astype(np.int32), keys, meta, label)


def read_slides(root: str, manifest: Manifest, opener: StreamOpener | None = None) -> Iterator[SlideBag]:
    """Every slide sample of the output at ``root``, in shard order."""
    opener = opener or StreamOpener()
    for record in manifest.shards:
        url = join(root, record.name)
        with opener(url) as fh:
            members = tar_members(fh, lambda name: name.split(".", 1)[-1] in _MEMBERS)
            for key, group in group_members(members):
                yield parse_slide(key, group, record.name)
