"""The user's model: ``MODULE:CALLABLE`` imported and called, or a module given as is; its output shape checked."""

from __future__ import annotations

import importlib

import torch

from wsishard.errors import ModelError

__all__ = ["check_features", "load_model", "model_name"]


HEADS = ("head.", "fc.", "classifier.")  # a classifier's weights, left unused by a model made without one


def load_model(model: torch.nn.Module | str, weights: str | None = None) -> torch.nn.Module:
    """``model`` itself, ``CALLABLE()`` of ``"MODULE:CALLABLE"`` (called with no argument), or timm's ``NAME`` of
    ``"timm:NAME"`` (made without pretrained weights or a classifier: its pooled features); then, given ``weights``
    (a ``.safetensors`` file), those weights loaded into it.

    Raises:
        ModelError: not ``MODULE:CALLABLE`` or ``timm:NAME``, a module that does not import (timm not installed), no
            such callable or timm model, a callable that does not return a ``torch.nn.Module``, or weights that cannot
            be read or do not fit the model.
    """
    net = _made(model)
    if weights is not None:
        _load_weights(net, weights, model_name(model))
    return net


def _made(model: torch.nn.Module | str) -> torch.nn.Module:
    if isinstance(model, torch.nn.Module):
        return model
    if isinstance(model, str) and model.startswith("timm:"):
        return _timm(model)
    if not isinstance(model, str):
        raise ModelError(f"model {model!r}: a torch.nn.Module or a 'MODULE:CALLABLE' string")
    module_name, _, attr = model.partition(":")
    if not module_name or not attr:
        raise ModelError(f"model {model!r}: expected MODULE:CALLABLE (e.g. mypackage.models:vit_small)")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any error of the user's module: named in one line
        raise ModelError(f"model {model!r}: module {module_name!r} does not import ({_one_line(exc)})") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelError(f"model {model!r}: module {module_name!r} has no callable {attr!r}")
    try:
        made = factory()
    except Exception as exc:
        raise ModelError(f"model {model!r}: {attr}() failed ({_one_line(exc)})") from exc
    if not isinstance(made, torch.nn.Module):
        raise ModelError(f"model {model!r}: {attr}() returned a {type(made).__name__}, not a torch.nn.Module")
    return made


def _timm(model: str) -> torch.nn.Module:
    name = model.removeprefix("timm:")
    try:
        import timm  # an optional dependency: only for "timm:NAME" models
    except ImportError as exc:
        raise ModelError(f"model {model!r}: timm is not installed (pip install timm)") from exc
    try:
        made = timm.create_model(name, pretrained=False, num_classes=0)
    except Exception as exc:
        raise ModelError(f"model {model!r}: timm cannot make {name!r} ({_one_line(exc)})") from exc
    if not isinstance(made, torch.nn.Module):
        raise ModelError(f"model {model!r}: timm returned a {type(made).__name__}, not a torch.nn.Module")
    return made


def _load_weights(net: torch.nn.Module, weights: str, name: str) -> None:
    """``weights`` (a ``.safetensors`` file: tensors only, nothing unpickled) loaded into ``net``; a classifier's
    weights the model was made without (:data:`HEADS`) are left out.

    Raises:
        ModelError: safetensors not installed, a file that cannot be read, or weights that do not fit ``net``.
    """
    try:
        from safetensors.torch import load_file
    except ImportError as exc:
        raise ModelError(f"weights {weights!r}: reading them needs safetensors (pip install safetensors)") from exc
    try:
        state = load_file(weights)
    except Exception as exc:
        raise ModelError(f"weights {weights!r} cannot be read ({_one_line(exc)})") from exc
    own = net.state_dict()
    state = {k: v for k, v in state.items() if k in own or not k.startswith(HEADS)}
    try:
        missing, unexpected = net.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a tensor of another shape
        raise ModelError(f"weights {weights!r} do not fit model {name!r} ({_one_line(exc)})") from exc
    if missing or unexpected:
        raise ModelError(
            f"weights {weights!r} do not fit model {name!r}: {len(missing)} of its tensors missing "
            f"{list(missing)[:3]}, {len(unexpected)} unknown to it {list(unexpected)[:3]}"
        )


def model_name(model: torch.nn.Module | str) -> str:
    """The model as recorded in the output: its string, or ``<module>.<class>`` of a module given as is."""
    return model if isinstance(model, str) else f"{type(model).__module__}.{type(model).__qualname__}"


def check_features(out: object, batch: int, name: str, dim: int | None) -> torch.Tensor:
    """``out`` if it is a float ``(batch, D)`` tensor (``D == dim`` when known).

    Raises:
        ModelError: anything else, named with its shape.
    """
    if not isinstance(out, torch.Tensor):
        raise ModelError(f"model {name!r} returned a {type(out).__name__}, not a (batch, D) tensor")
    if (
        out.ndim != 2
        or out.shape[0] != batch
        or not out.is_floating_point()
        or (dim is not None and out.shape[1] != dim)
    ):
        want = f"({batch}, {dim if dim is not None else 'D'}) float"
        raise ModelError(
            f"model {name!r} returned shape {tuple(out.shape)} {out.dtype} for a batch of {batch}: want {want}"
        )
    return out


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
