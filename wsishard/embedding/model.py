"""The user's model: ``MODULE:CALLABLE`` imported and called, or a module given as is; its output shape checked."""

from __future__ import annotations

import importlib

import torch

from wsishard.errors import ModelError

__all__ = ["check_features", "load_model", "model_name"]


def load_model(model: torch.nn.Module | str) -> torch.nn.Module:
    """``model`` itself, or ``CALLABLE()`` of ``"MODULE:CALLABLE"`` (called with no argument).

    Raises:
        ModelError: not ``MODULE:CALLABLE``, a module that does not import, no such callable, or a callable that does
            not return a ``torch.nn.Module``.
    """
    if isinstance(model, torch.nn.Module):
        return model
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
