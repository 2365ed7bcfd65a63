"""Small wsishard build outputs for tests: noise patches in tar shards plus a manifest.

The format is the one ``wsishard build`` writes (see :mod:`wsishard.format` and :mod:`wsishard.shards.writer`):
members ``<key>.<jpg|png|webp>``, ``<key>.json`` (PatchMeta, sorted keys) and ``<key>.cls`` (labelled
builds only), written by ``webdataset.TarWriter`` without an encoder and with a fixed mtime; shards named
``shard-000000.tar``...; ``manifest.json`` with per-shard counts, bytes and sha256.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import webdataset as wds
from PIL import Image

from wsishard.format import PatchMeta, is_sample_member, sample_key, shard_name
from wsishard.manifest import Manifest, ShardRecord, SlideRecord
from wsishard.shards.reader import group_members

_PIL = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
SMALL_COUNTS = (8, 6, 9, 7)  # samples per shard of conftest's ``small_output``


@dataclass
class Output:
    """What :func:`make_output` wrote."""

    root: str
    manifest: Manifest
    keys: dict[str, list[str]] = field(default_factory=dict)  # shard name -> keys in order
    images: dict[str, np.ndarray] = field(default_factory=dict)  # key -> (h, w, 3) uint8 as encoded
    labels: dict[str, int] = field(default_factory=dict)  # key -> label (-1 unlabelled)

    def path(self, shard_index: int) -> str:
        return os.path.join(self.root, self.manifest.shards[shard_index].name)

    @property
    def shard_of(self) -> dict[str, str]:
        """key -> shard name."""
        return {k: name for name, keys in self.keys.items() for k in keys}


def encode(image: np.ndarray, image_format: str = "jpg", jpeg_subsampling: int = -1) -> bytes:
    """``image`` in ``image_format``; a JPEG at quality 90 with PIL's ``subsampling`` (-1: its default, 4:2:0)."""
    buf = io.BytesIO()
    jpeg = {"quality": 90, "subsampling": jpeg_subsampling}
    Image.fromarray(image).save(buf, _PIL[image_format], **(jpeg if image_format == "jpg" else {}))
    return buf.getvalue()


def make_output(
    root: str,
    shard_samples: list[int] | tuple[int, ...] = (8, 8, 8, 8),
    *,
    size_px: int = 16,
    labelled: bool = True,
    image_format: str = "jpg",
    slides: int = 3,
    slide_prefix: str = "slide",
    seed: int = 0,
    extra_members: dict[str, bytes] | None = None,
    slide_labels: list[int] | tuple[int, ...] | None = None,
    jpeg_subsampling: int = -1,
) -> Output:
    """Write shards holding ``shard_samples[i]`` noise patches each, then the manifest.

    Samples go to the slides in turn (sample ``j`` of the output to slide ``j % slides``).

    Args:
        extra_members: members added to every sample (e.g. ``{"pyd": pickle_bytes}``), not in the format.
        slide_labels: each slide's label (default: the slide's number).
        jpeg_subsampling: PIL's ``subsampling`` for JPEG patches (-1: 4:2:0, 0: 4:4:4).
    """
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = Output(root=root, manifest=None)  # type: ignore[arg-type]
    records, serial = [], 0
    slide_ids = [f"{slide_prefix}{i}" for i in range(slides)]
    for index, count in enumerate(shard_samples):
        name = shard_name(index)
        out.keys[name] = []
        with open(os.path.join(root, name), "wb") as fh:
            writer = wds.TarWriter(fh, encoder=False, mtime=0.0, user="wsishard", group="wsishard")
            used = set()
            for _ in range(count):
                slide = serial % slides
                label = slide if slide_labels is None else slide_labels[slide]
                key, members = _sample(
                    rng, slide_ids[slide], serial, size_px, labelled, label, image_format, out, jpeg_subsampling
                )
                members.update(extra_members or {})
                writer.write({"__key__": key, **members})
                out.keys[name].append(key)
                used.add(slide)
                serial += 1
            writer.close()
        with open(os.path.join(root, name), "rb") as fh:
            data = fh.read()
        records.append(
            ShardRecord(
                name=name, samples=count, bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), slides=len(used)
            )
        )
    slide_records = [
        SlideRecord(
            slide_id=s,
            file=f"{s}.svs",
            status="ok",
            width=10_000,
            height=10_000,
            slide_mpp=0.25,
            mpp_source="openslide",
            level=0,
            downsample=1.0,
            label=((i if slide_labels is None else slide_labels[i]) if labelled else None),
            patches=sum(1 for k in out.labels if k.startswith(s + "_")),
        )
        for i, s in enumerate(slide_ids)
    ]
    options = {  # what ``wsishard build`` records (the stream and verify read the patch size from here)
        "patch": {"target_mpp": 0.5, "patch_size_px": size_px, "mpp_tolerance": 0.0},
        "image_format": image_format,
        "labels": {f"{s}.svs": (i if slide_labels is None else slide_labels[i]) for i, s in enumerate(slide_ids)}
        if labelled
        else {},
        "patch_size": size_px,
        "seed": seed,
    }
    out.manifest = Manifest(
        options=options,
        shards=records,
        slides=slide_records,
        image_format=image_format,
        created="1970-01-01T00:00:00Z",
        wsishard_version="test",
    )
    write_manifest(out)
    return out


def _sample(
    rng: np.random.Generator,
    slide_id: str,
    serial: int,
    size: int,
    labelled: bool,
    label: int,
    image_format: str,
    out: Output,
    jpeg_subsampling: int = -1,
) -> tuple[str, dict[str, bytes]]:
    x, y = (serial % 100) * size * 2, (serial // 100) * size * 2
    key = sample_key(slide_id, x, y)
    image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)  # (h, w, 3)
    data = encode(image, image_format, jpeg_subsampling)
    out.images[key] = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    meta: PatchMeta = {
        "slide_id": slide_id,
        "file": f"{slide_id}.svs",
        "x": x,
        "y": y,
        "extent": size * 2,
        "patch_mpp": 0.5,
        "level": 0,
        "patch_size": size,
        "tissue": 1.0,
    }
    members = {image_format: data}
    if labelled:
        meta["label"] = label
        members["cls"] = str(label).encode()
    members["json"] = json.dumps(meta, sort_keys=True).encode()
    out.labels[key] = label if labelled else -1
    return key, members


def write_manifest(out: Output) -> None:
    with open(os.path.join(out.root, "manifest.json"), "w") as fh:
        fh.write(out.manifest.to_json())


def set_count(out: Output, shard_index: int, samples: int) -> None:
    """Make the manifest promise ``samples`` samples for one shard (to fake a short shard)."""
    shards = list(out.manifest.shards)
    old = shards[shard_index]
    shards[shard_index] = ShardRecord(
        name=old.name, samples=samples, bytes=old.bytes, sha256=old.sha256, slides=old.slides
    )
    out.manifest = Manifest(**{**out.manifest.__dict__, "shards": shards})
    write_manifest(out)


def rewrite_member(out: Output, shard_index: int, key: str, ext: str, change: Callable[[bytes], bytes]) -> None:
    """Rewrite one shard with member ``<key>.<ext>`` replaced by ``change(old bytes)`` (a valid tar)."""
    path = out.path(shard_index)
    with tarfile.open(path) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    with open(path, "wb") as fh:
        writer = wds.TarWriter(fh, encoder=False, mtime=0.0, user="wsishard", group="wsishard")
        for k, group in group_members(members):
            writer.write({"__key__": k, **{e: change(d) if (k, e) == (key, ext) else d for e, d in group.items()}})
        writer.close()


def rewrite_shard(
    out: Output, shard_index: int, change: Callable[[list[tuple[str, bytes]]], list[tuple[str, bytes]]]
) -> None:
    """Rewrite one shard as ``change(its (member name, data) list)`` (any names, a valid USTAR tar) and update its
    manifest record (samples, bytes, sha256) to match: the shard then differs from the format, not the manifest."""
    path = out.path(shard_index)
    with tarfile.open(path) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in change(members):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uname, info.gname = len(data), 0o444, "wsishard", "wsishard"
            tar.addfile(info, io.BytesIO(data))
    refresh_record(out, shard_index)


def refresh_record(out: Output, shard_index: int) -> None:
    """Make the manifest's record of one shard match its file (samples, bytes, sha256), e.g. after
    :func:`rewrite_member`, so that only what is inside the samples differs from the manifest."""
    path = out.path(shard_index)
    with open(path, "rb") as fh:
        data = fh.read()
    with tarfile.open(path) as tar:
        samples = len(list(group_members((m.name, None) for m in tar.getmembers() if is_sample_member(m.name))))
    shards = list(out.manifest.shards)
    old = shards[shard_index]
    shards[shard_index] = ShardRecord(
        name=old.name, samples=samples, bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), slides=old.slides
    )
    out.manifest = Manifest(**{**out.manifest.__dict__, "shards": shards})
    write_manifest(out)


def truncate(path: str, keep_fraction: float = 0.6) -> None:
    """Cut a shard file short (mid-member, like an interrupted upload)."""
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:
        fh.truncate(int(size * keep_fraction) // 512 * 512 + 100)


def zero_bytes(path: str, sample_index: int, nbytes: int = 600) -> None:
    """Overwrite ``nbytes`` with zeros from the header of sample ``sample_index``'s first member.

    Tar readers take the zero block as a clean end of archive: the shard just looks shorter.
    """
    with tarfile.open(path) as tar:
        samples = list(group_members((m.name, m) for m in tar.getmembers()))
    firsts = [next(iter(group.values())) for _, group in samples]  # each sample's first member, in tar order
    with open(path, "r+b") as fh:
        fh.seek(firsts[sample_index].offset)
        fh.write(b"\0" * nbytes)
