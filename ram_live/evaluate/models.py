"""What an evaluation is handed, as a ``generate``-capable model and its tokenizer.

``search`` hands a module (the reused output module of a module base; in the callbacks, the training model with
the candidate swapped in), a state dict (a state-dict or path base; ``ram-live search``) or, in verl, a Hugging
Face folder. A module is used as it is (no copy); a state dict is copied into ``model`` (given once); a folder is
loaded into ``model`` when one is given, else with ``AutoModelForCausalLM.from_pretrained``.

``device=`` / ``dtype=``: where and in what precision a folder (``model=`` given as a folder, or a candidate
folder without ``model=``) is loaded. A module handed in (``model=`` or the evaluated one) is never copied or
moved: one that is elsewhere, or in another dtype, is refused with a :class:`ConfigError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError, EvaluationError
from ..io.hub import resolve_model
from .checks import meta_tensor

__all__ = ["Resolver", "generator_of", "load_model", "device_of", "parse_device", "parse_dtype"]


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise ConfigError(
            "ram_live.evaluate generates with Hugging Face transformers: pip install -e "
            '".[transformers]" (in the ram-live clone)'
        ) from exc
    return transformers


def load_model(folder: str | os.PathLike, device: Any = None, dtype: Any = None) -> Any:
    """``AutoModelForCausalLM.from_pretrained(folder)`` (in ``dtype``, then moved to ``device``, when given), with
    library errors."""
    folder = Path(resolve_model(folder, what="rewards: model"))  # a cached Hugging Face id: its folder
    if not (folder / "config.json").is_file():
        raise ConfigError(f"rewards: {folder} is not a Hugging Face model folder (no config.json)")
    transformers = _transformers()
    kwargs = {}
    if dtype is not None:  # transformers 5 names it dtype; 4.x torch_dtype
        kwargs["dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"] = dtype
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(os.fspath(folder), **kwargs)
    except Exception as exc:  # a damaged folder: OSError, ValueError, TypeError (a config that is no object), ...
        raise EvaluationError(f"rewards: cannot load the model in {folder}: {type(exc).__name__}: {exc}") from None
    return model.to(device) if device is not None else model


def parse_device(device: Any) -> Any:
    """``device=`` as a ``torch.device`` (None stays None)."""
    import torch

    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise ConfigError(
            f"rewards: device must be a device name ('cuda', 'cuda:1', 'cpu'), an index or a "
            f"torch.device, got {_kind(device)}"
        )
    try:
        return torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(f"rewards: device={device!r} is not a device: {exc}") from None


def parse_dtype(dtype: Any) -> Any:
    """``dtype=`` as a floating ``torch.dtype``: one, or its name (``"bfloat16"``, ``"torch.float16"``)."""
    import torch

    if dtype is None:
        return None
    value = getattr(torch, dtype.removeprefix("torch."), None) if isinstance(dtype, str) else dtype
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ConfigError(
            f"rewards: dtype must be a floating torch dtype or its name ('bfloat16', 'float16', "
            f"'float32'), got {dtype!r:.80}"
        )
    return value


def device_of(model: Any) -> Any:
    """The device of the model's first weight not on meta; for a model offloaded with accelerate (its weights on
    meta), its hooks' execution device."""
    import torch

    for p in model.parameters():
        if not p.is_meta:
            return p.device
    for sub in model.modules():
        device = getattr(getattr(sub, "_hf_hook", None), "execution_device", None)
        if device is not None:
            return torch.device(device)
    return torch.device("cpu")


def _check_placement(model: Any, device: Any, dtype: Any, what: str) -> None:
    """Refuse a module handed in that is not on ``device`` or not in ``dtype`` (it is never copied or moved)."""
    if device is not None:
        actual = device_of(model)
        if actual.type != device.type or (device.index is not None and actual.index != device.index):
            raise ConfigError(
                f"rewards: {what} is on {actual}, and device={str(device)!r} was asked; a module is "
                f"evaluated where it is, never copied: move it there (.to({str(device)!r})) or leave "
                "device=None"
            )
    if dtype is not None:
        actual_dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
        if actual_dtype is not None and actual_dtype != dtype:
            raise ConfigError(
                f"rewards: {what} is in {actual_dtype}, and dtype={dtype} was asked; a module is "
                f"evaluated as it is, never copied: convert it (.to({dtype})) or leave dtype=None"
            )


def generator_of(module: Any) -> Any:
    """``module`` if it can ``generate``, else the first submodule that can (a LightningModule's HF model)."""
    if callable(getattr(module, "generate", None)) and hasattr(module, "generation_config"):
        return module
    named = getattr(module, "named_modules", None)
    if named is not None:
        for _, sub in named():
            if sub is not module and callable(getattr(sub, "generate", None)) and hasattr(sub, "generation_config"):
                return sub
    raise EvaluationError(
        f"rewards: {type(module).__name__} has no generate() and holds no module that has one; "
        "pass a transformers causal LM (or a module holding one)"
    )


class Resolver:
    """Turns what the evaluation is handed into ``(model, tokenizer)``; ``model``/``tokenizer`` may be folders,
    loaded at first use."""

    def __init__(self, model: Any = None, tokenizer: Any = None, device: Any = None, dtype: Any = None) -> None:
        if (
            model is not None
            and not isinstance(model, (str, os.PathLike))
            and (isinstance(model, type) or not hasattr(model, "state_dict"))
        ):
            raise ConfigError(f"rewards: model must be a module or a Hugging Face folder, got {_kind(model)}")
        self.device, self.dtype = parse_device(device), parse_dtype(dtype)
        if model is not None and not isinstance(model, (str, os.PathLike)):
            _not_meta(model, "model=", ConfigError)
            _check_placement(model, self.device, self.dtype, f"model= ({type(model).__name__})")
        _check_tokenizer(tokenizer)
        self._model, self._tokenizer = model, tokenizer
        self._folder = model if isinstance(model, (str, os.PathLike)) else None  # model= as a folder: its tokenizer
        self._ready_tokenizer: Any = None

    @property
    def given_tokenizer(self) -> Any:
        """The ``tokenizer=`` given (a tokenizer or a folder), or None."""
        return self._tokenizer

    def resolve(self, merged: Any) -> tuple[Any, Any]:
        if isinstance(merged, (str, os.PathLike)) and not os.fspath(merged):
            raise EvaluationError("rewards: cannot evaluate '' (an empty path); pass a Hugging Face folder")
        if isinstance(merged, (str, os.PathLike)):
            folder = Path(resolve_model(merged, what="rewards: the evaluated model"))  # an id: its cached folder
            if self._model is None:
                model = load_model(folder, self.device, self.dtype)
            else:
                model = self._target()
                self._copy_into(model, _read_folder(folder), f"folder {folder}")
            return model, self.tokenizer(folder)
        if isinstance(merged, Mapping):
            if self._model is None:
                raise ConfigError(
                    "rewards: the evaluation was handed a state dict (a state-dict or path base); "
                    "pass rewards(..., model=<a module or HF folder of the base's structure>) to load "
                    "it into"
                )
            model = self._target()
            self._copy_into(model, merged, "the state dict")
            return model, self.tokenizer(None)
        if hasattr(merged, "state_dict") and not isinstance(merged, type):
            model = generator_of(merged)
            _not_meta(model, f"the evaluated {type(model).__name__}", EvaluationError)
            _check_placement(model, self.device, self.dtype, f"the evaluated {type(model).__name__}")
            return model, self.tokenizer(None, model)
        raise EvaluationError(
            f"rewards: cannot evaluate a {type(merged).__name__}; a module, a state dict or a "
            "Hugging Face folder is expected"
        )

    def tokenizer(self, folder: Path | None, model: Any = None) -> Any:
        if self._ready_tokenizer is not None:
            return self._ready_tokenizer
        source = self._tokenizer
        if source is None:
            source = (
                folder
                if folder is not None
                else self._folder
                if self._folder is not None
                else getattr(getattr(model, "config", None), "_name_or_path", None) or None
            )
        if source is None:
            raise ConfigError("rewards: no tokenizer: pass rewards(..., tokenizer=<a tokenizer or its folder>)")
        if isinstance(source, (str, os.PathLike)):
            try:
                source = _transformers().AutoTokenizer.from_pretrained(
                    os.fspath(resolve_model(source, what="rewards: tokenizer"))
                )  # ids: the local cache only
            except Exception as exc:  # a damaged folder: OSError, ValueError, TypeError (a config that is no object)
                raise ConfigError(
                    f"rewards: cannot load a tokenizer from {source}: {type(exc).__name__}: {exc}"
                ) from None
            _check_tokenizer(source)
        if getattr(source, "pad_token_id", None) is None and getattr(source, "eos_token", None) is not None:
            source.pad_token = source.eos_token  # generation pads on the left with EOS
        self._ready_tokenizer = source
        return source

    def _target(self) -> Any:
        if isinstance(self._model, (str, os.PathLike)):
            self._model = load_model(Path(self._model), self.device, self.dtype)
        target = generator_of(self._model)
        _not_meta(target, "model=", ConfigError)
        return target

    @staticmethod
    def _copy_into(model: Any, state: Mapping[str, Any], what: str) -> None:
        """Copy ``state`` into ``model``'s tensors; a key it lacks must be tied to one it has."""
        own = model.state_dict()
        unexpected = sorted(set(state) - set(own), key=str)
        if unexpected:
            raise EvaluationError(
                f"rewards: {what} has keys the model lacks: {unexpected[:5]} (is model= the base's structure?)"
            )
        given = {own[k].data_ptr() for k in state}
        missing = sorted(k for k in set(own) - set(state) if own[k].data_ptr() not in given)
        if missing:
            raise EvaluationError(f"rewards: {what} lacks the model's keys {missing[:5]}")
        on_meta = next((k for k, v in state.items() if getattr(v, "is_meta", False)), None)
        if on_meta is not None:
            raise EvaluationError(f"rewards: {what} holds {on_meta!r} on the meta device (a tensor without data)")
        try:
            model.load_state_dict(dict(state), strict=False)
        except RuntimeError as exc:
            raise EvaluationError(f"rewards: cannot load {what} into the model: {exc}") from None


def _kind(value: Any) -> str:
    return f"the class {value.__name__}" if isinstance(value, type) else f"a {type(value).__name__}"


def _check_tokenizer(tokenizer: Any) -> None:
    """A tokenizer is None, a folder (str or path), or an object that is called on texts and has ``batch_decode``."""
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        return
    if isinstance(tokenizer, type) or not callable(tokenizer) or not callable(getattr(tokenizer, "batch_decode", None)):
        hint = " (a class: load one with .from_pretrained(folder))" if isinstance(tokenizer, type) else ""
        raise ConfigError(
            f"rewards: tokenizer must be a tokenizer (callable, with batch_decode) or the folder of one, "
            f"got {_kind(tokenizer)}{hint}"
        )


def _not_meta(model: Any, what: str, error: type[ConfigError] | type[EvaluationError]) -> None:
    """Refuse a module with weights on the meta device (no data: built under ``init_empty_weights`` or
    ``device="meta"``); one offloaded by accelerate, whose hooks load them, passes."""
    name = meta_tensor(model) if callable(getattr(model, "named_modules", None)) else None
    if name is not None:
        raise error(
            f"rewards: {what} has {name!r} on the meta device (a tensor without data); load the weights "
            "(e.g. from_pretrained, or to_empty(device=...) then load_state_dict) before evaluating it"
        )


def _read_folder(folder: Path) -> dict[str, Any]:
    """The folder's tensors, read as every merge input is (:class:`~ram_live.io.sources.SafetensorsSource`: the
    index when there is one, headers checked, regular files only), memory-mapped until copied into the model."""
    from ..io.sources import SafetensorsSource

    source = SafetensorsSource(folder)
    return {key: source.get(key) for key in source.keys()}
