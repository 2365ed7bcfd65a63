"""wsishard.jax.Collate: GpuCollate's normalisation and dihedral codes on the JAX devices, NHWC."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from wsishard.streaming.collate import GpuCollate

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
wjax = pytest.importorskip("wsishard.jax")

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.mark.parametrize("augment", [False, True])
@pytest.mark.parametrize(("dtype", "torch_dtype"), [("float32", torch.float32), ("bfloat16", torch.bfloat16)])
def test_the_output_is_gpu_collates_for_the_same_seed_bit_for_bit(
    augment: bool, dtype: str, torch_dtype: torch.dtype
) -> None:
    """Batch after batch: the same dihedral codes (drawn alike from (seed, batch number)) and the same values."""
    rng = np.random.default_rng(0)
    torch_side = GpuCollate("cpu", mean=MEAN, std=STD, augment=augment, seed=11, dtype=torch_dtype)
    jax_side = wjax.Collate(mean=MEAN, std=STD, augment=augment, seed=11, dtype=getattr(jnp, dtype))
    for _ in range(4):
        x = rng.integers(0, 256, (8, 16, 16, 3), dtype=np.uint8)
        ref = torch_side.images(torch.from_numpy(x)).permute(0, 2, 3, 1).float().numpy()  # (8, 16, 16, 3)
        out = jax_side.images(jax.device_put(x, wjax.default_sharding())).astype(jnp.float32)
        assert out.shape == (8, 16, 16, 3)
        assert out.sharding.is_equivalent_to(wjax.default_sharding(), 4)
        assert np.array_equal(np.asarray(out), ref)  # bit for bit


def test_augment_gives_each_of_the_8_dihedral_transforms_about_equally() -> None:
    x = np.arange(5 * 5 * 3, dtype=np.uint8).reshape(1, 5, 5, 3).repeat(800, axis=0)  # no symmetry of its own
    out = np.asarray(wjax.Collate(augment=True, seed=3, std=(1 / 255,) * 3).images(jnp.asarray(x)))
    transforms = {np.rot90(t, k).tobytes(): (k, f) for f, t in enumerate((x[0], x[0, :, ::-1])) for k in range(4)}
    assert len(transforms) == 8
    seen = collections.Counter(transforms[np.rint(o).astype(np.uint8).tobytes()] for o in out)
    assert len(seen) == 8 and min(seen.values()) > 60 and max(seen.values()) < 140  # 100 each expected


def test_non_square_images_are_only_flipped() -> None:
    x = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(1, 4, 6, 3).repeat(64, axis=0)
    out = np.rint(np.asarray(wjax.Collate(augment=True, seed=1, std=(1 / 255,) * 3).images(jnp.asarray(x))))
    flips = {x[0][::a, ::b].tobytes() for a in (1, -1) for b in (1, -1)}
    assert out.shape == x.shape and {o.astype(np.uint8).tobytes() for o in out} == flips


def test_state_dict_resumes_the_codes_and_bfloat16_is_rounded() -> None:
    x = jnp.asarray(np.random.default_rng(1).integers(0, 256, (16, 8, 8, 3), dtype=np.uint8))
    first = wjax.Collate(augment=True, seed=5, dtype=jnp.bfloat16)
    first.images(x)
    state = first.state_dict()
    second = wjax.Collate(augment=True, seed=99, dtype=jnp.bfloat16)
    second.load_state_dict(state)
    a, b = first.images(x), second.images(x)
    assert a.dtype == jnp.bfloat16 and np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    assert state == {"seed": 5, "batches": 1}


@pytest.mark.parametrize(
    ("kw", "bad"),
    [({"mean": (0.5, 0.5)}, "3 values"), ({"std": (1.0, 0.0, 1.0)}, "positive"), ({"dtype": jnp.int32}, "float")],
)
def test_bad_options_are_refused_with_the_value(kw: dict, bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        wjax.Collate(**kw)


def test_a_batch_of_another_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="uint8"):
        wjax.Collate().images(jnp.zeros((2, 4, 4, 3), jnp.float32))
