"""Resume state of a build under ``OUT/.wsishard/`` next to the shards (local or object storage).

    build.json            the build's fingerprint (inputs + every option) and each slide's stamp (size and
                          modification time, or ETag): other options, or a slide replaced since, are refused
    scan/<slide>.npz      each slide's scan result, saved as it arrives (:mod:`wsishard.builder.scan.scanstate`)
    failed.json           slides that failed during extraction, with their reasons (one file per part)
    done/<shard>.json     one record per finished shard: its manifest record, patches per slide, excluded slides
    lock.json             who writes the output (``lock.part-0002-of-0008.json`` for a part): :class:`OutputLock`

A shard is skipped on resume when its done record exists and was written with the same excluded slides (the plan is
deterministic). A build owns its state folder, manifests, the shards they or its done records list and its slides' QC
pictures: ``--overwrite`` removes only those.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from wsishard import format as fmt
from wsishard import manifest as manifest_records
from wsishard.builder.extract.extract import ShardDone
from wsishard.builder.run.lock import OutputLock, who
from wsishard.builder.run.stamps import Stamp, identity_change
from wsishard.builder.scan.scanstate import ScanStore
from wsishard.errors import OptionError
from wsishard.format import STATE_DIR
from wsishard.shards.index import index_shard
from wsishard.shards.summary import is_summary_name
from wsishard.shards.verify import recorded_shard_damage
from wsishard.storage.output import Destination

logger = logging.getLogger(__name__)

_BUILD, _FAILED, _DONE = "build.json", "failed.json", "done"


@dataclasses.dataclass(frozen=True)
class _Survey:
    """What an output holds: a build (``found``) with its fingerprint and stamps, the files it wrote, all else."""

    found: bool
    digest: str | None
    stamps: dict[str, Stamp] | None
    owned: list[str]  # "/"-separated names relative to the output (inside qc/: "qc/<name>")
    foreign: list[str]


class BuildState:
    """The resume state of one output; all I/O goes through the :class:`Destination`. Every refusal is a one-line
    :class:`OptionError` saying what is there and what to do. ``lock`` is the output's :class:`OutputLock` for this
    build (or part): hold it (``with state.lock:``) around :meth:`claim` and the build."""

    def __init__(
        self,
        dest: Destination,
        digest: str,
        part: tuple[int, int] | None = None,
        identity: dict[str, Any] | None = None,
        names: Mapping[str, str] | None = None,
    ) -> None:
        # identity: what ``digest`` is the fingerprint of (stamps.build_identity), recorded to say what changed;
        # names: the slides not named by their file (a DICOM series), by location, which name their QC pictures
        self.dest, self.digest, self.part, self.identity = dest, digest, part, identity
        self.names = dict(names or {})
        # parts of a cluster build share the output: each keeps its own list of failed slides (its groups only)
        self._failed = _FAILED if part is None else f"failed.{fmt.part_label(part)}.json"
        self.lock = OutputLock(dest, digest, part)

    def _name(self, *parts: str) -> str:
        return "/".join((STATE_DIR, *parts))

    def _json(self, *parts: str) -> Any:
        data = self.dest.read_bytes(self._name(*parts))
        return None if data is None else json.loads(data)

    def _put_json(self, value: Any, *parts: str) -> None:
        self.dest.write_bytes(self._name(*parts), json.dumps(value, sort_keys=True).encode())

    def claim(self, *, overwrite: bool, stamps: Mapping[str, Stamp] | None = None) -> None:
        """Check the output is empty, a resumable build of the same inputs and options, or overwritable.

        ``overwrite`` replaces a build of other inputs or options, or whose slides changed (``stamps`` from
        :func:`input_stamps` differ from the recorded ones); a whole build replaces the same build too, a part resumes
        it (its other parts may be writing). A folder of files but no build is refused, or with ``overwrite`` built
        beside them unless one bears a name the build writes.

        Raises:
            OptionError: another build, changed slides or other files there, and ``overwrite`` does not apply.
        """
        survey, where = self._survey(), self.dest.location
        same = survey.found and survey.digest == self.digest
        changed = _changed(survey.stamps, stamps) if same else []
        if not survey.found:
            self._beside(survey.foreign, overwrite, stamps)
        elif not same and not overwrite:
            raise OptionError(self._other_build(where))
        elif changed and (not overwrite or self.lock.siblings):
            running = f" wait for {who(self.lock.siblings[0], self.digest)} to end, then" if self.lock.siblings else ""
            raise OptionError(
                f"{where}: slides changed since this build began ({_names(changed)}): "
                f"their scans and shards are stale;{running} pass --overwrite to build anew"
            )
        if survey.found and (not same or changed or (overwrite and self.part is None)):
            self._clear(survey)
        inputs = stamps if stamps is not None else survey.stamps if same else None
        record = {"fingerprint": self.digest, **({"inputs": dict(inputs)} if inputs is not None else {})}
        if self.identity is not None:
            record["identity"] = self.identity
        self._put_json(record, _BUILD)

    def _other_build(self, where: str) -> str:
        """The refusal of an output holding another build: what changed, where the build recorded it."""
        with contextlib.suppress(ValueError, OSError):
            recorded = self._json(_BUILD)
            old = recorded.get("identity") if isinstance(recorded, dict) else None
            change = identity_change(old, self.identity) if isinstance(old, dict) and self.identity else ""
            if change:
                return (
                    f"{where} holds a build of other slides or options ({change}); re-run with the same ones to "
                    "resume it, or pass --overwrite to replace it"
                )
        return (
            f"{where} holds a build with other slides or options (or one begun by a wsishard that "
            "writes another format version, plans or resamples differently); re-run with the same "
            "ones to resume it, or pass --overwrite to replace it"
        )

    def _beside(self, foreign: list[str], overwrite: bool, stamps: Mapping[str, Stamp] | None) -> None:
        """A folder holding no build: refuse its files, or (``overwrite``) build beside them unless in the way."""
        where = self.dest.location
        if foreign and not overwrite:
            raise OptionError(
                f"{where} holds {len(foreign)} files that are not a wsishard build ({_names(foreign)}); "
                "choose an empty or new folder, or pass --overwrite to build beside them (they are "
                "kept)"
            )
        pictures = _pictures(fmt.unique_slide_ids(list(stamps or {}), self.names))
        clash = [n for n in foreign if _untemp(n) in pictures or _build_name(_untemp(n))]
        if clash:
            raise OptionError(
                f"{where} holds files that are not a wsishard build's but bear names a build writes "
                f"({_names(clash)}); choose an empty or new folder"
            )

    def _clear(self, survey: _Survey) -> None:
        """Remove the build found in the output: the files it wrote, nothing else."""
        files = [n for n in survey.owned if n != STATE_DIR]
        shards, unlisted = sum(map(fmt.is_shard_name, files)), [n for n in survey.foreign if fmt.is_shard_name(n)]
        logger.info(
            "replacing the build in %s: removing %d shards, %d manifests, %d QC pictures and its resume "
            "state; keeping %d other files",
            self.dest.location,
            shards,
            sum(map(_build_name, files)) - shards,
            sum(n.endswith(".png") and n == _untemp(n) for n in files),
            len(survey.foreign),
        )
        if unlisted:
            logger.warning(
                "%s: keeping %d files named like shards that no manifest or done record lists (%s): "
                "remove them if they are leftovers",
                self.dest.location,
                len(unlisted),
                _names(unlisted),
            )
        for name in files + [self._name(n) for n in self.dest.listdir(STATE_DIR) if not n.startswith("lock.")]:
            self.dest.remove(name)
        if not self.dest.listdir("qc"):
            self.dest.remove("qc")

    def _survey(self) -> _Survey:
        names = [n for n in self.dest.listdir() if n != STATE_DIR]
        entries = [n for n in names if n != "qc"] + [f"qc/{n}" for n in self.dest.listdir("qc") if "qc" in names]
        build = self._json(_BUILD) or {}
        candidates = [n for n in names if fmt.parse_part_manifest(n) or n == fmt.MANIFEST_NAME]
        manifests = {n: m for n in candidates if (m := self._manifest(n)) is not None}
        if not build and not manifests:
            return _Survey(False, None, None, [], entries)
        listed = {s.get("name") for m in manifests.values() for s in m.get("shards", [])}
        listed |= {n.removesuffix(".json") for n in self.dest.listdir(self._name(_DONE))}
        ids = {s.get("slide_id") for m in manifests.values() for s in m.get("slides", [])}
        ids |= set(
            fmt.unique_slide_ids(sorted(build.get("inputs") or {}), self.names) if build else self._slide_ids(names)
        )
        pictures = _pictures(ids)

        def owned(name: str) -> bool:
            if (target := _untemp(name)) != name:  # being written, or left by a killed build, under a temporary name
                return target in pictures or _build_name(target)
            return (
                name in manifests
                or name in pictures
                or fmt.is_slides_name(name)
                or is_summary_name(name)
                or (fmt.is_shard_name(name) and name in listed)
                or index_shard(name) in listed
            )

        digest = build.get("fingerprint") or next(
            (m.get("extra", {}).get("fingerprint") for m in manifests.values()), None
        )
        return _Survey(
            True,
            digest,
            build.get("inputs"),
            [STATE_DIR, *filter(owned, entries)],
            [n for n in entries if not owned(n)],
        )

    def _slide_ids(self, names: list[str]) -> set[str]:
        """The slide ids in the slide records files among ``names`` (a finished build whose state was removed)."""
        ids: set[str] = set()
        for name in filter(fmt.is_slides_name, names):
            with contextlib.suppress(ValueError):
                ids |= {
                    r.slide_id for r in manifest_records.parse_slide_lines((self.dest.read_bytes(name) or b"").decode())
                }
        return ids

    def _manifest(self, name: str) -> dict[str, Any] | None:
        """The wsishard manifest ``name`` as plain data; None for anything else."""
        with contextlib.suppress(ValueError):
            data = json.loads(self.dest.read_bytes(name) or b"null")
            return data if isinstance(data, dict) and data.get("format") == fmt.FORMAT_NAME else None
        return None

    @property
    def scans(self) -> ScanStore:
        """The per-slide scan results of this output (shared by the parts of a cluster build: each saves its own)."""
        return ScanStore(self.dest, STATE_DIR)

    def load_failed(self) -> dict[int, str]:
        return {int(k): v for k, v in (self._json(self._failed) or {}).items()}

    def save_failed(self, failed: dict[int, str]) -> None:
        self.lock.refresh()
        self._put_json({str(k): v for k, v in failed.items()}, self._failed)

    def save_done(self, outcome: ShardDone, name: str, excluded: frozenset[int]) -> None:
        self.lock.refresh()
        record = dataclasses.asdict(outcome.record) if outcome.record else None
        by_slide = {str(k): v for k, v in (outcome.patches_by_slide or {}).items()}
        entry = {"index": outcome.index, "record": record, "patches_by_slide": by_slide, "excluded": sorted(excluded)}
        self._put_json(entry, _DONE, f"{name}.json")

    def load_done(self) -> dict[int, tuple[ShardDone, frozenset[int]]]:
        """Finished shards whose file is still there as written: index -> (outcome, slides that were excluded when
        it was written). A shard missing, of another size, or (locally) modified after its done record was written
        and no longer of its recorded sha256 is left out, with a warning: the build writes it again."""
        done = {}
        records = self.dest.file_stats(self._name(_DONE))
        shards = self.dest.file_stats()
        for name in records:  # another part may be writing one: skip temporary files
            entry = self._json(_DONE, name) if _untemp(name) == name else None
            if entry is None:
                continue
            record = manifest_records.ShardRecord(**entry["record"]) if entry["record"] else None
            damage = record and recorded_shard_damage(self.dest, record, shards.get(record.name), records[name][1])
            if record and damage:
                logger.warning(
                    "%s: %s, recorded as written, %s: writing it again", self.dest.location, record.name, damage
                )
                continue
            by_slide = {int(k): v for k, v in entry["patches_by_slide"].items()}
            done[entry["index"]] = (ShardDone(entry["index"], record, by_slide), frozenset(entry["excluded"]))
        return done


def _changed(recorded: Mapping[str, Stamp] | None, current: Mapping[str, Stamp] | None) -> list[str]:
    return [p for p, s in current.items() if recorded.get(p) != s] if recorded and current else []


def _names(names: Sequence[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _untemp(name: str) -> str:
    """The name a temporary file (:func:`wsishard.format.temp_name`) stands for; ``name`` when it is none."""
    folder, slash, base = name.rpartition("/")
    return folder + slash + (fmt.temp_target(base) or base)


def _pictures(slide_ids: Iterable[str]) -> set[str]:
    """The QC files a build of these slides writes: their pictures and the page showing them."""
    return {fmt.qc_picture_name(i) for i in slide_ids} | {fmt.QC_INDEX_NAME}


def _build_name(name: str) -> bool:
    return (
        fmt.is_shard_name(name)
        or name == fmt.MANIFEST_NAME
        or fmt.parse_part_manifest(name) is not None
        or fmt.is_slides_name(name)
        or is_summary_name(name)
        or index_shard(name) is not None
    )
