"""What a sample of a build must hold (:class:`SampleRules`, from its manifest's options): a key in the key
grammar, an image of the patch size and format (read from its header only), a ``.json`` that agrees with the
options, and a ``.cls`` exactly where the slide has a label (on a ``--roi-labels`` build, a patch's class where its
slide's annotations gave one). :func:`sample_problems` names what a sample gets wrong;
``verify`` applies it to every sample of every shard.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field

import numpy as np

from wsishard.format import (
    COORDS_EXT,
    FEATURES_EXT,
    IMAGE_FORMATS,
    KEYS_EXT,
    LABEL_EXT,
    LABEL_RANGE,
    META_EXT,
    image_header,
    is_embeddings_extra,
    is_sample_key,
    is_slide_id,
    key_slide,
    patch_mpp_name,
)
from wsishard.manifest import Manifest, expected_patch_size
from wsishard.shards.verify_context import context_problems

_MPP_ROUNDING = 1e-5  # relative: the recorded mpp is rounded to 6 decimals


@dataclass(frozen=True, kw_only=True)
class SampleRules:
    """What every sample of a build must be, from its manifest.

    Attributes:
        patch_size_px: width = height of every image (``options.patch.patch_size_px``).
        image_format: ``jpg``, ``png`` or ``webp``: the image member's extension and the image's header.
        target_mpp: ``options.patch.target_mpp`` (None: not recorded, the ``.json`` mpp is not checked).
        mpp_tolerance: ``options.patch.mpp_tolerance``: the relative distance the mpp may have from the target.
        mpp_name: the ``.json``'s name for the patch's mpp in the manifest's format version (``patch_mpp``, or ``mpp``).
        labels: slide id -> its label (None: unlabelled), from the manifest's slide records.
        labelled: the build had labels (``options.labels``): for slides the manifest does not list.
        roi_classes: the classes of ``options.roi.labels`` (0: none): a slide without a slide label may then hold
            ``.cls`` members, each a class index below this.
        context_scales, context_size_px: the context patches of every sample (``options.context_mpp``, ``size``).
    """

    patch_size_px: int
    image_format: str
    target_mpp: float | None = None
    mpp_tolerance: float = 0.0
    mpp_name: str = "patch_mpp"
    labels: dict[str, int | None] = field(default_factory=dict)
    labelled: bool = False
    roi_classes: int = 0
    context_scales: int = 0  # len(options.context_mpp): the ctx<i> members every sample holds
    context_size_px: int = 0  # options.context_size
    multi_mpp: bool = False  # options.patch.target_mpp a list: keys name their scale (format.key_slide)
    target_mpps: tuple[float, ...] = ()  # that list: each sample's mpp is held to the nearest of them
    bags: bool = False  # an embeddings output: one slide per sample (features.npy, coords.npy, keys.json, .json)

    @classmethod
    def of(cls, manifest: Manifest, location: str) -> SampleRules:
        """The rules ``manifest`` sets (``location`` names it in errors).

        Raises:
            ManifestError: the options lack the patch size.
        """
        options = manifest.options if isinstance(manifest.options, dict) else {}
        patch = options.get("patch")
        patch = patch if isinstance(patch, dict) else {}
        target = _number(patch.get("target_mpp"))
        roi = options.get("roi")
        roi_labels = _list(roi.get("labels")) if isinstance(roi, dict) else []
        return cls(
            patch_size_px=expected_patch_size(manifest, location),
            image_format=manifest.image_format,
            target_mpp=target if target is not None and target > 0 else None,
            mpp_tolerance=_number(patch.get("mpp_tolerance")) or 0.0,
            mpp_name=patch_mpp_name(manifest.version),
            labels={s.slide_id: s.label for s in manifest.slides},
            labelled=bool(options.get("labels")),
            roi_classes=len(roi_labels),
            context_scales=len(_list(options.get("context_mpp"))),
            context_size_px=int(_number(options.get("context_size")) or 0),
            bags=is_embeddings_extra(manifest.extra),
            multi_mpp=isinstance(patch.get("target_mpp"), list),
            target_mpps=tuple(v for v in map(_number, _list(patch.get("target_mpp"))) if v is not None and v > 0),
        )


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _number(value: object) -> float | None:
    """``value`` as a float when it is a JSON number (not a bool), else None."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def sample_problems(key: str, members: dict[str, bytes], rules: SampleRules | None) -> list[tuple[str, str]]:
    """``(problem, detail)`` for each way a sample breaks the format or, with ``rules``, the manifest's options
    (empty: it matches). ``problem`` reads after a count ("3 samples ..."); ``detail`` describes this sample."""
    if rules is not None and rules.bags:
        return _bag_problems(key, members, rules)
    if not is_sample_key(key):
        return [("samples are not named <slide>_x<X>_y<Y>.<ext> (a path, or not a wsishard sample)", "")]
    image_ext = next((ext for ext in IMAGE_FORMATS if ext in members), None)
    if image_ext is None or META_EXT not in members:
        return [(f"samples lack an image or .{META_EXT}", "")]
    if rules is None:
        return []
    return [
        *_image_problems(members[image_ext], image_ext, rules),
        *_meta_problems(members[META_EXT], rules),
        *_label_problems(key, members.get(LABEL_EXT), rules),
        *context_problems(members, rules.image_format, rules.context_scales, rules.context_size_px),
    ]


def _npy_shape(data: bytes) -> tuple[tuple[int, ...], str] | None:
    """An npy member's shape and dtype from its header alone (None: not a plain npy array)."""
    try:
        stream = io.BytesIO(data)
        version = np.lib.format.read_magic(stream)
        shape, _, dtype = _header(stream, version)
    except (ValueError, EOFError):
        return None
    return (tuple(shape), dtype.str) if not dtype.hasobject else None


def _header(stream: io.BytesIO, version: tuple[int, int]) -> tuple[tuple[int, ...], bool, np.dtype]:
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return read(stream)


def _bag_problems(key: str, members: dict[str, bytes], rules: SampleRules) -> list[tuple[str, str]]:
    """How a slide sample of an embeddings output breaks its format (its npy members checked by their headers)."""
    if not is_slide_id(key):
        return [("samples are not named <slide_id>.<ext> (a path, or not an embeddings sample)", "")]
    lacking = [ext for ext in (FEATURES_EXT, COORDS_EXT, KEYS_EXT, META_EXT) if ext not in members]
    if lacking:
        return [(f"slide samples lack .{lacking[0]}", "")]
    features, coords = _npy_shape(members[FEATURES_EXT]), _npy_shape(members[COORDS_EXT])
    if features is None or coords is None or len(features[0]) != 2 or coords[0] != (features[0][0], 2):
        return [("slide samples' features.npy and coords.npy are not (N, D) and (N, 2) plain npy arrays", "")]
    return list(_label_problems(key, members.get(LABEL_EXT), rules))


def _image_problems(data: bytes, ext: str, rules: SampleRules) -> list[tuple[str, str]]:
    header, want = image_header(data), rules.image_format
    if header is None:
        return [("images have no JPEG, PNG or WebP header", f"a .{ext} member")]
    image_format, width, height = header
    problems = []
    if ext != want or image_format != want:
        problems.append((f"images are not {want} as the manifest's image_format says", f"a {image_format} as .{ext}"))
    px = rules.patch_size_px
    if (width, height) != (px, px):
        wrong = f"samples are not {px}x{px} px as the manifest's patch_size_px {px} says"
        problems.append((wrong, f"{width}x{height} px"))
    return problems


def _meta_problems(data: bytes, rules: SampleRules) -> list[tuple[str, str]]:
    try:
        meta = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested too deep for the parser
        meta = None
    if not isinstance(meta, dict):
        return [(f"samples' .{META_EXT} is not a JSON object", "")]
    problems = []
    if "label" in meta and not _is_label(meta["label"]):
        problems.append((f"samples' .{META_EXT} label is not an integer in int64's range", _short(meta["label"])))
    size, mpp = meta.get("patch_size"), _number(meta.get(rules.mpp_name))
    if size != rules.patch_size_px or isinstance(size, bool):
        problems.append((f"samples' .{META_EXT} patch_size is not {rules.patch_size_px}", f"patch_size {size!r}"))
    target, tolerance = rules.target_mpp, rules.mpp_tolerance
    if rules.target_mpps:  # a multi-mpp build: the scale nearest the sample's mpp
        target = min(rules.target_mpps, key=lambda t: abs((mpp or 0) / t - 1))
    if target is not None and (mpp is None or abs(mpp / target - 1) > tolerance + _MPP_ROUNDING):
        name = rules.mpp_name
        problems.append(
            (
                f"samples' .{META_EXT} {name} is off the manifest's target_mpp {target:g} by more than its "
                f"mpp_tolerance {tolerance:g}",
                f"{name} {meta.get(name)!r}",
            )
        )
    return problems


def _label_problems(key: str, cls: bytes | None, rules: SampleRules) -> list[tuple[str, str]]:
    slide = key_slide(key, rules.multi_mpp)
    label = rules.labels.get(slide)
    labelled = label is not None if slide in rules.labels else rules.labelled
    if not labelled and rules.roi_classes:
        return [] if cls is None else _class_problems(cls, rules.roi_classes)
    if not labelled:
        return [] if cls is None else [(f"samples have .{LABEL_EXT} though their slide has no label", "")]
    if cls is not None and not _is_label(cls):
        return [(f"samples' .{LABEL_EXT} is not an integer in int64's range", f".{LABEL_EXT} {cls[:20]!r}")]
    if cls is None:
        return [(f"samples lack .{LABEL_EXT} though their slide is labelled", "")]
    if label is not None and cls.strip() != str(label).encode():
        return [
            (f"samples' .{LABEL_EXT} differs from their slide's label", f".{LABEL_EXT} {cls[:20]!r}, label {label}")
        ]
    return []


def _class_problems(cls: bytes, classes: int) -> list[tuple[str, str]]:
    """A ``--roi-labels`` patch's ``.cls``: the index of one of the build's ``classes`` annotation classes."""
    if _is_label(cls) and 0 <= int(cls) < classes:
        return []
    wrong = f"samples' .{LABEL_EXT} is not a class index 0..{classes - 1} of the manifest's roi labels"
    return [(wrong, f".{LABEL_EXT} {cls[:20]!r}")]


def _is_label(value: object) -> bool:
    """Whether ``value`` (a ``.json`` label, or a ``.cls``'s bytes) is a label the stream can hand over."""
    if isinstance(value, bytes):
        try:
            value = int(value)
        except ValueError:  # not digits, or more than Python reads
            return False
    return isinstance(value, int) and not isinstance(value, bool) and value in LABEL_RANGE


def _short(value: object) -> str:
    text = json.dumps(value) if isinstance(value, int | float | str | bool) or value is None else type(value).__name__
    return f"label {text if len(text) <= 24 else text[:12] + f'... ({len(text)} characters)'}"
