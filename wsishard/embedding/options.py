"""The options of an embedding pass, checked when made (plain Python: the CLI builds them before torch loads)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from wsishard.errors import OptionError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DTYPES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True, kw_only=True)
class EmbedOptions:
    """Options of :func:`wsishard.embedding.run.embed`.

    Attributes:
        mean: per-channel mean the images are normalized with, in [0, 1] units (ImageNet's by default).
        std: per-channel standard deviation, in [0, 1] units.
        device: ``"cuda"``, ``"cuda:1"``, ``"cpu"``...; None: CUDA when present (this rank's ``LOCAL_RANK`` GPU under
            torchrun, as :func:`wsishard.embedding.run.embed` is told), else the CPU.
        batch_size: patches per forward pass.
        dtype: ``"fp32"``; ``"bf16"``/``"fp16"`` run the model under autocast (on a CPU: ``bf16`` only; ``fp16`` is
            refused).
        num_workers: DataLoader worker processes decoding JPEGs.
        resize_px: resize every patch to ``resize_px`` x ``resize_px`` px (bilinear, antialiased) before the model;
            None: as built.
        part_samples: source patches per part, the unit of resume (a part is written atomically once embedded).
        slides_per_shard: slides (samples) per output shard.
        weights: a ``.safetensors`` file of the model's weights, loaded into it after it is made (never a pickle:
            ``.pt``/``.pth``/``.bin`` are refused); None: the model as its callable (or timm) makes it.
    """

    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    device: str | None = None
    batch_size: int = 64
    dtype: str = "fp32"
    num_workers: int = 2
    resize_px: int | None = None
    part_samples: int = 8192
    slides_per_shard: int = 64
    weights: str | None = None

    def __post_init__(self) -> None:
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise OptionError(f"mean and std need 3 values each, std > 0: got mean={self.mean} std={self.std}")
        if self.dtype not in DTYPES:
            raise OptionError(f"dtype {self.dtype!r}: one of {', '.join(DTYPES)}")
        for name in ("batch_size", "part_samples", "slides_per_shard"):
            if getattr(self, name) < 1:
                raise OptionError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_workers < 0:
            raise OptionError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.resize_px is not None and self.resize_px < 1:
            raise OptionError(f"resize_px must be >= 1 px or None, got {self.resize_px}")
        if self.weights is not None and not str(self.weights).endswith(".safetensors"):
            raise OptionError(
                f"weights {self.weights!r}: a .safetensors file (wsishard never unpickles: convert a .pt/.pth/.bin "
                "checkpoint with safetensors.torch.save_file first)"
            )

    def record(self) -> dict[str, Any]:
        """What decides the features (recorded in the output's manifest and in each part): not the speed options."""
        d = asdict(self)
        kept = ("mean", "std", "resize_px", "weights")
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items() if k in kept}
