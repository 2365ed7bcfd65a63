"""Resume state of a build, kept under ``OUT/.wsishard/`` next to the shards (local or object storage).

    build.json            the build's fingerprint (inputs + every option): a re-run with other options is refused
    scan.json, scan.npz   every slide's scan result (records as JSON, patch grids as arrays; never pickled)
    failed.json           slides that failed during extraction, with their reasons (one file per part)
    done/<shard>.json     one record per finished shard: its manifest record, patches per slide, excluded slides

A shard is skipped on resume when its done record exists and was written with the same excluded slides; the
plan is deterministic, so a resumed build writes exactly what an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from wsishard.builder.extract import ShardOutcome
from wsishard.builder.grid import Candidates, blocks
from wsishard.builder.scan import ScanResult
from wsishard.errors import OptionError
from wsishard.format import FORMAT_VERSION, MANIFEST_NAME, SHARD_PREFIX, ShardRecord, SlideRecord, part_label
from wsishard.storage.output import Destination

STATE_DIR = ".wsishard"
_BUILD, _SCAN, _SCAN_ARRAYS, _FAILED, _DONE = "build.json", "scan.json", "scan.npz", "failed.json", "done"


def fingerprint(slides: Sequence[str], options: dict[str, Any]) -> str:
    """A digest of what determines the output: the slide list, every option, the format version."""
    text = json.dumps({"slides": list(slides), "options": options, "format": FORMAT_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class BuildState:
    """The resume state of one output. All methods read or write through the :class:`Destination`."""

    def __init__(self, dest: Destination, digest: str, part: tuple[int, int] | None = None) -> None:
        self.dest = dest
        self.digest = digest
        # parts of a cluster build share the output: each keeps its own list of failed slides (its groups only)
        self._failed = _FAILED if part is None else f"failed.{part_label(part)}.json"

    def _name(self, *parts: str) -> str:
        return "/".join((STATE_DIR, *parts))

    def _json(self, *parts: str) -> Any:
        data = self.dest.read_bytes(self._name(*parts))
        return None if data is None else json.loads(data)

    def _put_json(self, value: Any, *parts: str) -> None:
        self.dest.write_bytes(self._name(*parts), json.dumps(value, sort_keys=True).encode())

    def claim(self, *, overwrite: bool) -> None:
        """Check the output is empty, a resumable build of the same inputs and options, or overwritable.

        Raises:
            OptionError: the output holds a build with other inputs or options and ``overwrite`` is False.
        """
        previous = self._json(_BUILD)
        if previous is None:
            manifest = self.dest.read_bytes(MANIFEST_NAME)
            previous = json.loads(manifest).get("extra", {}) if manifest else None
        other = previous is not None and previous.get("fingerprint") != self.digest
        if other and not overwrite:
            raise OptionError(
                f"{self.dest.location} holds a build with other slides or options; "
                "re-run with the same ones to resume it, or pass --overwrite to replace it"
            )
        if overwrite:
            self.clear()
        self._put_json({"fingerprint": self.digest}, _BUILD)

    def clear(self) -> None:
        """Remove a previous build: its shards, manifests, QC pictures and state."""
        for name in self.dest.listdir():
            if name.startswith(SHARD_PREFIX) or name.startswith("manifest") or name in ("qc", STATE_DIR):
                self.dest.remove(name)

    def save_scans(self, scans: Sequence[ScanResult]) -> None:
        entries, arrays = [], {}
        for i, scan in enumerate(scans):
            cands = scan.cands
            geometry = None
            if cands is not None:
                geometry = {
                    "l0_per_o": cands.l0_per_o,
                    "stride": cands.stride,
                    "patch": cands.patch,
                    "total": cands.total,
                }
                arrays.update({f"col{i}": cands.col, f"row{i}": cands.row, f"tissue{i}": cands.tissue})
            entries.append(
                {"record": dataclasses.asdict(scan.record), "cands": geometry, "bytes": scan.bytes_per_patch}
            )
        buf = io.BytesIO()
        np.savez(buf, **arrays)  # type: ignore[arg-type]
        self.dest.write_bytes(self._name(_SCAN_ARRAYS), buf.getvalue())
        self._put_json(entries, _SCAN)  # written last: its presence means both files are complete

    def load_scans(self, block_patches: int) -> list[ScanResult] | None:
        entries = self._json(_SCAN)
        data = self.dest.read_bytes(self._name(_SCAN_ARRAYS))
        if entries is None or data is None:
            return None
        arrays = np.load(io.BytesIO(data), allow_pickle=False)
        scans = []
        for i, entry in enumerate(entries):
            record = SlideRecord(**entry["record"])
            geometry = entry["cands"]
            if geometry is None:
                scans.append(ScanResult(record))
                continue
            cands = Candidates(col=arrays[f"col{i}"], row=arrays[f"row{i}"], tissue=arrays[f"tissue{i}"], **geometry)
            scans.append(ScanResult(record, cands, blocks(cands, block_patches), entry["bytes"]))
        return scans

    def load_failed(self) -> dict[int, str]:
        return {int(k): v for k, v in (self._json(self._failed) or {}).items()}

    def save_failed(self, failed: dict[int, str]) -> None:
        self._put_json({str(k): v for k, v in failed.items()}, self._failed)

    def save_done(self, outcome: ShardOutcome, name: str, excluded: frozenset[int]) -> None:
        record = dataclasses.asdict(outcome.record) if outcome.record else None
        by_slide = {str(k): v for k, v in (outcome.patches_by_slide or {}).items()}
        entry = {"index": outcome.index, "record": record, "patches_by_slide": by_slide, "excluded": sorted(excluded)}
        self._put_json(entry, _DONE, f"{name}.json")

    def load_done(self) -> dict[int, tuple[ShardOutcome, frozenset[int]]]:
        """Finished shards: index -> (outcome, slides that were excluded when it was written)."""
        done = {}
        for name in self.dest.listdir(self._name(_DONE)):
            entry = self._json(_DONE, name)
            if entry is None:
                continue
            record = ShardRecord(**entry["record"]) if entry["record"] else None
            by_slide = {int(k): v for k, v in entry["patches_by_slide"].items()}
            done[entry["index"]] = (ShardOutcome(entry["index"], record, by_slide), frozenset(entry["excluded"]))
        return done
