"""Device-side collate: uint8 channels-last batches in, normalized (and augmented) device tensors out.

Workers ship compact uint8 ``(b, h, w, 3)`` batches. On a CUDA device the float conversion, normalization and
random dihedral augmentation run there, as a few batched tensor ops where they cost almost nothing next to the
model. On a CPU device (the main process, on the cores the workers use) they run as one pass over memory with no
arithmetic at all: a uint8 pixel can take only 256 values, so each channel's 256 outputs are computed once, by the
plain reference's own float32 operations, and every pixel is written by looking its value up (bit for bit the
reference). ``lut_apply`` of the package's C module (``wsishard/_native.c``) moves each sample by its dihedral
transform (a transpose, a flip) and writes it through the tables into the output past the caches, one thread, the
GIL released. The
CPU output buffers are reused (fresh float pages for every batch cost more than the work): an output is valid until
the next call, unless ``reuse_output=False``. Nothing in this module knows about shards.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NotRequired, TypedDict

import numpy as np
import torch

from wsishard._native import lut_apply as _lut_apply
from wsishard.augment import multicrop, stain_cpu
from wsishard.augment import stain as stain_ops
from wsishard.augment.multicrop import MultiCrop
from wsishard.augment.stain import StainOptions
from wsishard.streaming.decode import device_decoder

__all__ = ["DeviceBatch", "GpuCollate", "dihedral"]


# the functional form: "global" is a Python keyword, so no class body can declare it
DeviceBatch = TypedDict(
    "DeviceBatch",
    {
        "image": NotRequired[torch.Tensor],  # (b, 3, h, w) float, normalized: every collate but crops=
        "label": torch.Tensor,  # (b,) int64 on the device, -1 when unlabelled
        "meta": Sequence[Any],  # the batch's Metas (each sample's .json, parsed when read), passed through
        "key": list[str],
        "context": NotRequired[torch.Tensor],  # (b, K, 3, h', w') float, normalized: builds with context only
        "global": NotRequired[torch.Tensor],  # (G, b, 3, S, S) float, normalized: crops= only
        "local": NotRequired[torch.Tensor],  # (L, b, 3, s, s) float, normalized: crops= only
    },
)
DeviceBatch.__doc__ = "A batch on the training device."


def dihedral(x: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """Apply one of the 8 dihedral transforms to each image of ``x``, chosen by ``code``.

    Bit 0 of a code transposes (swaps height and width; needs square images), bit 1 flips width, bit 2
    flips height; together they give the identity, the flips and the 90/180/270 degree rotations.

    Args:
        x: (b, ..., h, w) tensor; the last two dims are the image plane.
        code: (b,) int64 in ``[0, 8)`` on ``x``'s device.

    Returns:
        (b, ..., h, w) tensor, each image transformed by its own code.
    """
    shape = (-1,) + (1,) * (x.dim() - 1)  # broadcast (b,) over the image dims
    if x.shape[-1] == x.shape[-2]:
        x = torch.where((code & 1).bool().view(shape), x.transpose(-1, -2), x)
    x = torch.where((code & 2).bool().view(shape), x.flip(-1), x)
    return torch.where((code & 4).bool().view(shape), x.flip(-2), x)


_TAG_DIHEDRAL = 0xD1  # the dihedral codes' random stream (np.random.default_rng((seed, batch, tag)))
_SPARE = 2  # CPU output buffers used in turn: the one the training step holds and the one being written
# the dtype an output element's bits are written as, by the element's size in bytes
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.float32, 8: torch.float64}


def check_mean_std(mean: Sequence[float], std: Sequence[float]) -> None:
    """Refuse a normalisation that is not 3 means and 3 positive standard deviations (GpuCollate's and
    ``wsishard.jax.Collate``'s).

    Raises:
        ValueError: naming the values.
    """
    if len(mean) != 3 or len(std) != 3:
        raise ValueError(f"mean and std need 3 values each, got mean={mean!r} std={std!r}")
    if min(std) <= 0:
        raise ValueError(f"std must be positive, got {std!r}")


class GpuCollate:
    """Move a uint8 batch to ``device`` and turn it into normalized float NCHW (optionally augmented).

    uint8 (b, h, w, 3) -> pinned (CUDA) -> ``.to(device, non_blocking=True)`` -> random dihedral transform
    per sample (on uint8, on the device) -> float32 -> /255 -> (x - mean) / std -> ``dtype`` -> NCHW
    (contiguous, or ``channels_last`` memory format). On a CPU device the same result comes from one pass over
    memory through per-channel tables of the 256 uint8 values (module docstring): exactly what the plain reference
    ``((x.float() / 255) - mean) / std`` computes, bit for bit. Its output then lives in a buffer this collate
    fills again: **on a CPU device an output is valid until the next call** (a training step's forward and
    backward pass are done by then); keep one longer by ``.clone()``, or build the collate with
    ``reuse_output=False``.

    Args:
        device: the training device.
        mean: per-channel mean, in [0, 1] units (e.g. ImageNet's ``(0.485, 0.456, 0.406)``).
        std: per-channel standard deviation, in [0, 1] units.
        dtype: output float dtype (``torch.float32``, ``torch.bfloat16``, ``torch.float16``).
        augment: apply a random flip / 90-degree rotation to each sample (flips only for non-square images).
        channels_last: return tensors in ``torch.channels_last`` memory format.
        seed: seed of the augmentation (None: from OS entropy). Give each rank its own (e.g. the loader's seed plus
            the rank). The ``n``-th batch's random parameters come from ``(seed, n)`` alone: :meth:`state_dict` /
            :meth:`load_state_dict` carry ``n`` over a resume.
        stain: colour normalisation and augmentation (:class:`~wsishard.augment.stain.StainOptions`), applied
            after the dihedral transform, before ``mean``/``std``, in float32 on ``device``. On a CPU device the
            options :func:`~wsishard.augment.stain_cpu.fusable` covers run in one C pass (the torch operations'
            results within float32 rounding; its output in the buffers used in turn, as the table pass's), the
            others as torch operations.
        reuse_output: on a CPU device, write each output into one of two buffers used in turn (True), or into
            memory of its own (False).
        crops: multi-crop views (:class:`~wsishard.augment.multicrop.MultiCrop`): the batch then has
            ``"global"`` (G, b, 3, S, S) and ``"local"`` (L, b, 3, s, s) instead of ``"image"``, each view a
            random-resized crop with its own dihedral transform (``augment``) and its own stain jitter (``stain``'s
            jitter options; its normalisation runs once per image, before cropping), by the same torch code on
            any device (:meth:`views`).

    Raises:
        ValueError: mean or std without 3 values, a non-positive std, or a non-float dtype.
    """

    def __init__(
        self,
        device: torch.device | str,
        *,
        mean: Sequence[float] = (0.0, 0.0, 0.0),
        std: Sequence[float] = (1.0, 1.0, 1.0),
        dtype: torch.dtype = torch.float32,
        augment: bool = False,
        channels_last: bool = False,
        seed: int | None = None,
        stain: StainOptions | None = None,
        reuse_output: bool = True,
        crops: MultiCrop | None = None,
    ) -> None:
        check_mean_std(mean, std)
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a float dtype, got {dtype}")
        self.device = torch.device(device)
        self.dtype = dtype
        self.augment = augment
        self.channels_last = channels_last
        self.mean = torch.tensor(mean, dtype=torch.float32, device=self.device).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32, device=self.device).view(1, 3, 1, 1)
        self.reuse_output = reuse_output
        self._spare: list[torch.UntypedStorage] = []  # CPU output buffers, used in turn
        self._turn = 0
        # the CPU path's tables: per channel, the output of each uint8 value (see _tables)
        self._table: tuple[tuple[Any, ...], np.ndarray] | None = None
        self.seed = seed if seed is not None else int(np.random.default_rng().integers(2**63))
        self.stain = stain
        self._decode: Callable[[list[bytes], torch.device], torch.Tensor] | None = None  # decode="device" batches
        self._twin: GpuCollate | None = None  # the context's collate: this one's settings, output buffers of its own
        self.batches = 0  # batches collated so far: the next one's number, which its random parameters follow
        self.crops = crops
        if stain is not None and stain.slides is not None:
            self.stain = replace(stain, slides=stain.slides.to(self.device))

    def state_dict(self) -> dict[str, int]:
        """The seed and the number of batches collated so far (plain JSON data, to save with a checkpoint)."""
        return {"seed": self.seed, "batches": self.batches}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Go on from :meth:`state_dict`: the next batch gets the random parameters (dihedral codes, stain jitter)
        the saved run's next batch got."""
        self.seed, self.batches = int(state["seed"]), int(state["batches"])

    def codes(self, batch_size: int) -> torch.Tensor:
        """(b,) dihedral codes for the next batch: drawn by ``np.random.default_rng((seed, batch number))``, so
        a collate resumed at batch ``n`` (:meth:`load_state_dict`) draws what the uninterrupted one drew."""
        drawn = np.random.default_rng((self.seed, self.batches, _TAG_DIHEDRAL)).integers(0, 8, batch_size)
        return torch.from_numpy(drawn).to(self.device, non_blocking=True)  # (b,) int64

    def images(self, image: torch.Tensor, slide_ids: Sequence[str] | None = None) -> torch.Tensor:
        """uint8 (b, h, w, 3) on any device -> normalized (b, 3, h, w) ``dtype`` on ``self.device``.

        ``slide_ids``: each sample's slide (``normalize="macenko"`` needs them; :meth:`__call__` reads the meta).
        """
        if image.dtype != torch.uint8 or image.dim() != 4 or image.shape[-1] != 3:
            raise ValueError(f"expected a uint8 (b, h, w, 3) batch, got {image.dtype} {tuple(image.shape)}")
        try:
            return self._images(image, slide_ids)
        finally:
            self.batches += 1

    def views(self, image: torch.Tensor, slide_ids: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        """uint8 (b, h, w, 3) on any device -> ``{"global": ..., "local": ...}`` (``crops``), normalized ``dtype``
        on ``self.device`` (:func:`~wsishard.augment.multicrop.views`)."""
        try:
            return multicrop.views(self, image, slide_ids)
        finally:
            self.batches += 1

    def _images(
        self, image: torch.Tensor, slide_ids: Sequence[str] | None, codes: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``codes``: each sample's dihedral code, where not the batch's own draw (:meth:`codes`)."""
        if self.stain is not None:
            return self._stained(image, self.stain, slide_ids, codes)
        if self.device.type == "cpu" and image.device.type == "cpu":
            return self._cpu_images(image, codes)
        if self.device.type == "cuda" and image.device.type == "cpu" and not image.is_pinned():
            image = image.pin_memory()
        x = image.to(self.device, non_blocking=True).permute(0, 3, 1, 2)  # (b, 3, h, w) uint8 view
        if self.augment:
            x = dihedral(x, self.codes(x.shape[0]) if codes is None else codes)
        # lay out the uint8 batch once, in the output's memory format: every float op after it then runs on
        # dense memory and keeps that format
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        x = x.contiguous(memory_format=fmt)
        x = x.float().div_(255).sub_(self.mean).div_(self.std)  # (b, 3, h, w) float32
        return x.to(dtype=self.dtype, memory_format=fmt)

    def _stained(
        self,
        image: torch.Tensor,
        options: StainOptions,
        slide_ids: Sequence[str] | None,
        codes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The float path with the stain operations (:mod:`wsishard.augment.stain`) before mean and std."""
        rows = None
        if options.normalize == "macenko":
            if slide_ids is None or len(slide_ids) != image.shape[0]:
                raise ValueError(
                    "normalize='macenko' needs each sample's slide id: call the collate on the batch "
                    "(its meta names them) or pass images(..., slide_ids=...)"
                )
            rows = options.slides.rows(slide_ids)  # type: ignore[union-attr]  # checked by StainOptions
        if self.device.type == "cpu" and image.device.type == "cpu" and stain_cpu.fusable(options):
            return self._cpu_stained(image, options, rows, codes)
        if self.device.type == "cuda" and image.device.type == "cpu" and not image.is_pinned():
            image = image.pin_memory()
        x = image.to(self.device, non_blocking=True).permute(0, 3, 1, 2)  # (b, 3, h, w) uint8 view
        if self.augment:
            x = dihedral(x, self.codes(x.shape[0]) if codes is None else codes)
        x = x.contiguous().float().div_(255)  # (b, 3, h, w) float32 in [0, 1]
        x = stain_ops.apply(x, options, seed=self.seed, batch=self.batches, slide_rows=rows)
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        x = x.sub_(self.mean).div_(self.std)
        return x.to(dtype=self.dtype, memory_format=fmt)

    def _cpu_stained(
        self,
        image: torch.Tensor,
        options: StainOptions,
        rows: torch.Tensor | None,
        codes_of: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The stained path on a CPU device in one C pass (:mod:`wsishard.augment.stain_cpu`), into the buffers
        used in turn (through a float32 one for another ``dtype``)."""
        b, h, w, _ = image.shape
        codes = (self.codes(b) if codes_of is None else codes_of).tolist() if self.augment else [0] * b
        out = self._output((b, 3, h, w))
        f32 = out if self.dtype == torch.float32 else torch.empty_like(out, dtype=torch.float32)
        stain_cpu.stain_pass(
            image,
            f32,
            options,
            seed=self.seed,
            batch=self.batches,
            slide_rows=rows,
            codes=codes,
            mean=self.mean.flatten().tolist(),
            std=self.std.flatten().tolist(),
            channels_last=self.channels_last,
        )
        return out if f32 is out else out.copy_(f32)

    def _cpu_images(self, image: torch.Tensor, codes_of: torch.Tensor | None = None) -> torch.Tensor:
        """The CPU path, one pass over memory: each sample moved by its dihedral transform and written through a
        table of the 256 values each channel can take (computed by the plain reference's own float32 operations
        and rounded to ``dtype``, so the same values, bit for bit), in C (``lut_apply``), its output written past the
        caches."""
        b, h, w, _ = image.shape
        codes = (self.codes(b) if codes_of is None else codes_of).tolist() if self.augment else [0] * b
        out = self._output((b, 3, h, w))  # (b, 3, h, w) self.dtype, in the asked memory format
        bits = out.view(_BITS[self.dtype.itemsize])  # the same bytes as a dtype numpy knows
        dst = (bits.permute(0, 2, 3, 1) if self.channels_last else bits).numpy()  # (b, h, w, 3) / (b, 3, h, w)
        table = self._tables()
        src = image if image.is_contiguous() else image.contiguous()
        _lut_apply(src.numpy(), dst, table, bytes(codes), b, h, w, self.dtype.itemsize, self.channels_last)
        return out

    def _tables(self) -> np.ndarray:
        """The output bits of each uint8 value, ((v / 255) - mean) / std in float32 as the reference computes it,
        then rounded to ``dtype`` (in the dtype :data:`_BITS` names): (3, 256), a row per channel."""
        made_for = (self.dtype, *self.mean.flatten().tolist(), *self.std.flatten().tolist())
        if self._table is None or self._table[0] != made_for:  # made again if dtype, mean or std were changed
            v = torch.arange(256, dtype=torch.uint8).view(1, 1, 1, 256).expand(1, 3, 1, 256).float()
            x = ((v / 255) - self.mean.cpu()) / self.std.cpu()  # (1, 3, 1, 256) float32
            bits = x.to(self.dtype).view(_BITS[self.dtype.itemsize]).numpy()[0, :, 0]  # (3, 256)
            self._table = (made_for, np.ascontiguousarray(bits))
        return self._table[1]

    def _output(self, shape: tuple[int, int, int, int]) -> torch.Tensor:
        """A ``shape`` tensor of ``dtype`` in the asked memory format: in the next of the buffers used in turn (a new
        one where it is missing or of another size), or in memory of its own without ``reuse_output`` (numpy's
        allocation: transparent huge pages, fewer faults)."""
        b, c, h, w = shape
        nbytes = b * c * h * w * self.dtype.itemsize
        strides = (c * h * w, 1, w * c, c) if self.channels_last else (c * h * w, h * w, w, 1)
        if not self.reuse_output:
            storage = torch.from_numpy(np.empty(nbytes, dtype=np.uint8)).untyped_storage()
            return torch.empty(0, dtype=self.dtype).set_(storage, 0, shape, strides)
        turn, self._turn = self._turn, (self._turn + 1) % _SPARE
        if turn >= len(self._spare):
            self._spare.append(torch.from_numpy(np.empty(nbytes, dtype=np.uint8)).untyped_storage())
        elif self._spare[turn].nbytes() != nbytes:
            self._spare[turn] = torch.from_numpy(np.empty(nbytes, dtype=np.uint8)).untyped_storage()
        return torch.empty(0, dtype=self.dtype).set_(self._spare[turn], 0, shape, strides)

    def __call__(self, batch: Mapping[str, Any]) -> DeviceBatch:
        """Collate a :class:`~wsishard.streaming.decode.Batch`; ``meta`` and ``key`` pass through unchanged. A
        batch of ``loader(..., decode="device")`` (its ``"jpeg"`` bytes instead of an ``"image"``) is decoded on
        the device first (torchvision's ``decode_jpeg``). A batch's ``"context"`` comes out as ``out["context"]``
        (:meth:`context`)."""
        label = batch["label"].to(self.device, non_blocking=True)
        if "jpeg" in batch:  # a batch of loader(..., decode="device"): its JPEGs decoded here, on the GPU
            if self._decode is None:
                self._decode = device_decoder()
            batch = {**batch, "image": self._decode(batch["jpeg"], self.device)}
        ids = None
        if self.stain is not None and self.stain.normalize == "macenko":
            ids = [m.get("slide_id") for m in batch["meta"]]  # each sample's .json, parsed here (~2 us a sample)
        context = None if batch.get("context") is None else self.context(batch["context"], ids)  # before images()
        out = DeviceBatch(label=label, meta=batch["meta"], key=batch["key"])
        if self.crops is not None:
            out.update(self.views(batch["image"], ids))  # type: ignore[typeddict-item]  # "global", "local"
        else:
            out["image"] = self.images(batch["image"], ids)
        if context is not None:
            out["context"] = context
        return out

    def context(self, context: torch.Tensor, slide_ids: Sequence[str] | None = None) -> torch.Tensor:
        """uint8 (b, K, h, w, 3) context patches on any device -> normalized (b, K, 3, h, w) ``dtype`` on
        ``self.device``, each sample's K patches by the same dihedral transform and stain parameters as its image of
        the batch :meth:`images` collates next (call this first: :meth:`__call__` does). Output buffers of their own
        (reused as the images' are); contiguous (b, K, 3, h, w), or each sample's patches ``channels_last``."""
        if context.dtype != torch.uint8 or context.dim() != 5 or context.shape[-1] != 3:
            raise ValueError(f"expected uint8 (b, K, h, w, 3) context, got {context.dtype} {tuple(context.shape)}")
        b, k, h, w, _ = context.shape
        twin = self._context_collate()
        codes = self.codes(b)  # (b,) the draw images() makes for this batch
        if self.device.type == "cuda" and context.device.type == "cpu":
            context = (context if context.is_pinned() else context.pin_memory()).to(self.device, non_blocking=True)
        if self.stain is None:  # every patch of the batch at once, each by its sample's code
            return twin._images(context.reshape(b * k, h, w, 3), None, codes.repeat_interleave(k)).view(b, k, 3, h, w)
        out = torch.empty((b, k, 3, h, w), dtype=self.dtype, device=self.device)
        for scale in range(k):  # a scale at a time: the stain draws are per sample of a batch of b
            out[:, scale] = twin._images(context[:, scale], slide_ids, codes)
        return out

    def _context_collate(self) -> GpuCollate:
        """This collate's twin for the context: every setting and the batch number this one's, output buffers its
        own (the context's size may differ from the images')."""
        if self._twin is None:
            self._twin = copy.copy(self)
            self._twin._spare, self._twin._turn = [], 0
        own = {"_spare": self._twin._spare, "_turn": self._twin._turn, "_twin": None}
        self._twin.__dict__.update({**self.__dict__, **own})
        return self._twin
