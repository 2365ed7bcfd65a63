"""The embedding pass's model: ``timm:NAME`` made through timm's ``create_model`` (without pretrained weights or a
head), and ``weights=`` read from a ``.safetensors`` file (tensors only: nothing is unpickled) into any model."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from embedmodels import MeanLinear
from safetensors.torch import save_file

from wsishard.embedding.flags import embed_options
from wsishard.embedding.model import load_model
from wsishard.embedding.options import EmbedOptions
from wsishard.errors import ModelError, OptionError


def _weights(tmp_path: Path, state: dict[str, torch.Tensor], name: str = "w.safetensors") -> str:
    path = tmp_path / name
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return str(path)


def test_weights_from_a_safetensors_file_are_the_models_own(tmp_path: Path) -> None:
    other = torch.nn.Linear(3, 8)  # weights unlike the callable's seeded ones
    path = _weights(tmp_path, {"linear.weight": other.weight.detach(), "linear.bias": other.bias.detach()})
    net = load_model("embedmodels:mean_linear", path)
    assert torch.equal(net.linear.weight, other.weight) and torch.equal(net.linear.bias, other.bias)
    assert not torch.equal(load_model("embedmodels:mean_linear").linear.weight, other.weight)


def test_a_classifier_head_beside_the_weights_is_left_out_and_a_misfit_is_named(tmp_path: Path) -> None:
    own = MeanLinear().state_dict()
    with_head = _weights(tmp_path, {**own, "head.weight": torch.zeros(2, 8)}, "head.safetensors")
    assert torch.equal(load_model("embedmodels:mean_linear", with_head).linear.weight, own["linear.weight"])
    lacking = _weights(tmp_path, {"linear.weight": own["linear.weight"]}, "lacking.safetensors")
    with pytest.raises(ModelError, match=r"do not fit model 'embedmodels:mean_linear': 1 of its tensors missing"):
        load_model("embedmodels:mean_linear", lacking)
    shaped = _weights(tmp_path, {**own, "linear.weight": torch.zeros(4, 3)}, "shaped.safetensors")
    with pytest.raises(ModelError, match="do not fit model"):
        load_model("embedmodels:mean_linear", shaped)
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelError, match="cannot be read"):
        load_model("embedmodels:mean_linear", str(tmp_path / "bad.safetensors"))


def test_a_pickled_checkpoint_is_refused_before_anything_is_read() -> None:
    for name in ("model.pt", "model.pth", "pytorch_model.bin"):
        with pytest.raises(OptionError, match="never unpickles"):
            EmbedOptions(weights=name)


def test_timm_name_is_made_by_timm_without_weights_or_head(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    def create_model(name: str, **kw: Any) -> torch.nn.Module:  # timm's signature, a stand-in model
        calls.append((name, kw))
        if name != "vit_small_patch16_224":
            raise RuntimeError(f"Unknown model ({name})")
        return MeanLinear()

    monkeypatch.setitem(sys.modules, "timm", types.SimpleNamespace(create_model=create_model))
    assert isinstance(load_model("timm:vit_small_patch16_224"), MeanLinear)
    assert calls == [("vit_small_patch16_224", {"pretrained": False, "num_classes": 0})]
    with pytest.raises(ModelError, match=r"timm cannot make 'vit_tiny_typo' \(RuntimeError: Unknown model"):
        load_model("timm:vit_tiny_typo")


def test_timm_name_without_timm_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm raises ImportError
    with pytest.raises(ModelError, match=r"timm is not installed \(pip install timm\)"):
        load_model("timm:vit_small_patch16_224")


def test_the_cli_passes_weights_on() -> None:
    from wsishard.cli import parser

    args = parser().parse_args(["embed", "in", "-o", "out", "--model", "timm:x", "--weights", "w.safetensors"])
    assert embed_options(args).weights == "w.safetensors" and args.model == "timm:x"
    assert EmbedOptions(weights="w.safetensors").record()["weights"] == "w.safetensors"  # in the manifest, the resume
