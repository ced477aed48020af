"""The checks :mod:`ram_live.evaluate` runs on what users hand it: reward functions' returns, reward weights,
modules on the meta device, and what can be checked when an evaluation is built (``device=``, ``dtype=``,
``model=``/``tokenizer=`` folders, ``eos_token_id``). Each returns the checked value or raises a library error
naming the culprit."""

from __future__ import annotations

from collections.abc import Mapping, Set
from itertools import chain, islice
from typing import Any, Callable

from ..errors import ConfigError, EvaluationError
from ..option_checks import finite_float, shown

__all__ = [
    "reward_list",
    "weight_list",
    "meta_tensor",
    "short",
    "one_line",
    "usable_device",
    "loadable_dtype",
    "existing_source",
    "token_ids_in",
    "vocab_size",
]


def short(value: Any) -> str:
    """A one-line repr of ``value`` of at most about 80 characters (:func:`~ram_live.option_checks.shown`)."""
    return shown(value)


def one_line(text: object, limit: int = 300) -> str:
    """``text`` on one line (whitespace runs collapsed), cut at ``limit`` characters: an exception's message inside
    one of ours."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _not_a_sequence(value: Any) -> str | None:
    """Why ``value`` is not a flat, ordered sequence of values (None when it is one)."""
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} (a mapping, not one value per prompt in the prompts' order)"
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return f"a {type(value).__name__} {short(value)}"
    if isinstance(value, Set):
        return f"a {type(value).__name__} (unordered)"
    ndim = getattr(value, "ndim", None)
    if isinstance(ndim, int) and ndim != 1:
        return f"a {ndim}-D {type(value).__name__} of shape {tuple(getattr(value, 'shape', ()))}"
    if not hasattr(value, "__iter__"):
        return f"a {type(value).__name__} {short(value)}"
    return None


def _is_array(value: Any) -> bool:
    """A 1-D numpy array or tensor (or anything else with ``ndim == 1`` and ``tolist``)."""
    return getattr(value, "ndim", None) == 1 and callable(getattr(value, "tolist", None))


def reward_list(
    out: Any, name: str, n: int, where: Callable[[int], tuple[int, str]] | None = None, unit: str = "prompts"
) -> list[float | None]:
    """A reward function's return as one float (or None: not applicable) per row.

    Accepted: a list, tuple, 1-D numpy array or tensor, or any other iterable of numbers or None. Raises
    :class:`EvaluationError` naming the function (and the prompt, for a bad value).

    Args:
        out: what the function returned. name: the function's name. n: the rows it was called on.
        where: row ``j``'s prompt index and its name in messages (default ``(j, "prompt j")``).
        unit: what the rows are, in messages (``"prompts"``, or ``"completions"`` with k samples a prompt).
    """
    where = where or (lambda j: (j, f"prompt {j}"))
    why = _not_a_sequence(out)
    if why is not None:
        raise EvaluationError(
            f"reward function {name!r} returned {why}, not a sequence of rewards (one number per "
            f"{unit[:-1]}, {n} {unit})",
            function=name,
        )
    values: list[Any] = []
    try:
        if _is_array(out):
            values = list(out.tolist())  # plain numbers at once
        else:
            for v in islice(out, n + 1):  # a generator raises here; one endless stops after n + 1
                values.append(v)
    except Exception as exc:
        at = where(len(values)) if len(values) < n else None
        raise EvaluationError(
            f"reward function {name!r} returned an iterable that raised {type(exc).__name__} "
            f"while its rewards were read{f' at {at[1]}' if at else ''}: {one_line(exc)}",
            function=name,
            index=at[0] if at else None,
        ) from exc
    if len(values) != n:
        count = len(values) if len(values) < n or _is_array(out) else f"more than {n}"
        raise EvaluationError(
            f"reward function {name!r} returned {count} rewards for {n} {unit} (one per {unit[:-1]} is needed)",
            function=name,
        )
    checked: list[float | None] = []
    for j, v in enumerate(values):
        if v is None:
            checked.append(None)
            continue
        try:
            checked.append(finite_float(v))
        except ValueError as exc:
            index, label = where(j)
            raise EvaluationError(
                f"reward function {name!r} returned {short(v)} for {label}: {exc}; a reward "
                "must be a finite number (or None: not applicable)",
                function=name,
                index=index,
            ) from None
    return checked


def weight_list(reward_weights: Any, n: int) -> list[float]:
    """``reward_weights`` as ``n`` floats: a list, tuple or 1-D array of finite numbers, else :class:`ConfigError`
    naming ``reward_weights``."""
    expected = f"rewards: reward_weights must be {n} finite numbers (one per reward function)"
    why = _not_a_sequence(reward_weights)
    if why is None and not _is_array(reward_weights) and not hasattr(reward_weights, "__getitem__"):
        why = f"a {type(reward_weights).__name__} (an iterator: give a list)"
    if why is not None:
        raise ConfigError(f"{expected} in a list, got {why}")
    try:
        values = list(reward_weights.tolist() if _is_array(reward_weights) else reward_weights)
    except Exception as exc:
        raise ConfigError(f"{expected}; reading reward_weights raised {type(exc).__name__}: {one_line(exc)}") from exc
    if len(values) != n:
        raise ConfigError(f"{expected}, got {len(values)}: {short(reward_weights)}")
    out = []
    for i, w in enumerate(values):
        try:
            out.append(finite_float(w))
        except ValueError as exc:
            raise ConfigError(f"{expected}; reward_weights[{i}] is {short(w)}: {exc}") from None
    return out


def meta_tensor(module: Any) -> str | None:
    """The name of the first parameter or buffer of ``module`` on the meta device that no accelerate hook loads
    (an offloaded model's weights are on meta, put in place by its hooks): None when there is none."""
    hooked: list[str] = []
    for prefix, sub in module.named_modules():
        if getattr(sub, "_hf_hook", None) is not None:
            hooked.append(prefix)
        own = chain(sub.named_parameters(recurse=False), sub.named_buffers(recurse=False))
        for name, tensor in own:
            if getattr(tensor, "is_meta", False) and not any(
                h == "" or prefix == h or prefix.startswith(h + ".") for h in hooked
            ):
                return f"{prefix}.{name}" if prefix else name
    return None


def usable_device(device: Any) -> None:
    """Refuse a parsed ``device=`` this torch cannot use: a CUDA (or other accelerator) device on a build without
    it or an index past the devices it sees, and ``meta`` (no data: nothing there can generate).

    Raises:
        ConfigError: naming ``device=`` and what this torch has."""
    import torch

    if device is None or device.type == "cpu":
        return
    if device.type == "meta":
        raise ConfigError(
            "rewards: device='meta' holds no data: a model loaded there cannot generate; pick 'cpu' or 'cuda'"
        )
    backend = torch.backends.mps if device.type == "mps" else getattr(torch, device.type, None)
    available = getattr(backend, "is_available", None)
    if not callable(available):  # a backend without is_available ('xla', 'hpu', 'lazy', ...): try it
        try:
            torch.empty(0, device=device)
        except Exception as exc:
            raise ConfigError(
                f"rewards: device={str(device)!r}, and this torch cannot put a tensor there "
                f"({type(exc).__name__}: {one_line(exc, 120)}); pick an available device ('cpu') or install its "
                "backend"
            ) from None
        return
    if not available():
        cpu_only = device.type == "cuda" and not torch.version.cuda and not getattr(torch.version, "hip", None)
        built = f" (torch {torch.__version__}, built without CUDA)" if cpu_only else ""
        raise ConfigError(
            f"rewards: device={str(device)!r}, and this torch has no usable {device.type} device{built}; "
            "pick an available device ('cpu') or install a torch with it"
        )
    count = getattr(backend, "device_count", None)
    if device.index is not None and callable(count) and device.index >= count():
        raise ConfigError(
            f"rewards: device={str(device)!r}, and this torch sees {count()} {device.type} device(s) "
            f"({device.type}:0..{device.type}:{count() - 1})"
        )


def loadable_dtype(dtype: Any) -> None:
    """Refuse a parsed ``dtype=`` a causal LM cannot be loaded and run in (float8 and other storage-only types).

    Raises:
        ConfigError: naming ``dtype=`` and the dtypes that are accepted."""
    import torch

    if dtype is not None and dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise ConfigError(
            f"rewards: dtype={dtype} cannot be loaded and generated with (matmuls in {dtype} are not supported); "
            "use 'bfloat16', 'float16', 'float32' or 'float64' (a quantized model: load it yourself and pass the "
            "module as model=)"
        )


def existing_source(value: Any, what: str) -> Any:
    """``value`` (``model=`` or ``tokenizer=``) checked now, when it names a folder: an existing path, or a model
    id the local Hugging Face cache holds (its snapshot folder is returned); a model folder must hold
    ``config.json``. Anything else (a module, a tokenizer, None) is returned as it is.

    Raises:
        ConfigError: naming ``what`` and the path: no such folder (a typo: found now, not at the first
            evaluation hours later inside a training run), an id not in the cache, a model folder without
            ``config.json``, with one that does not load, or without weights."""
    import os

    from ..io.hub import resolve_model

    if not isinstance(value, (str, os.PathLike)):
        return value
    resolved = resolve_model(value, what=f"rewards: {what}")  # an id the cache lacks: ConfigError naming it
    path = os.fspath(resolved)
    if not os.path.exists(path):
        raise ConfigError(
            f"rewards: {what}={os.fspath(value)!r} does not exist (no such folder, nor a model in the local "
            "Hugging Face cache); pass an existing folder"
        )
    if what == "model" and not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError(f"rewards: model={os.fspath(value)!r} is not a Hugging Face model folder (no config.json)")
    if what == "model":
        _loadable_config(path, os.fspath(value))
    return resolved


def _loadable_config(folder: str, given: str) -> None:
    """The ``config.json`` of a ``model=`` folder loads (a JSON object transformers knows), and weights are beside
    it: what the first evaluation would find broken, found when the evaluation is built."""
    import glob
    import os

    try:
        import transformers
    except ImportError:
        return  # the evaluation's own error names the missing package when it runs
    try:
        transformers.AutoConfig.from_pretrained(folder)
    except Exception as exc:
        raise ConfigError(
            f"rewards: model={given!r}: its config.json does not load ({type(exc).__name__}: {one_line(exc, 160)})"
        ) from None
    if not any(glob.glob(os.path.join(glob.escape(folder), pattern)) for pattern in ("*.safetensors", "*.bin")):
        raise ConfigError(
            f"rewards: model={given!r} holds no weights (no *.safetensors or *.bin file beside its config.json)"
        )


def token_ids_in(ids: Any, vocab: int | None, of: str) -> None:
    """Refuse ``eos_token_id`` values past the vocabulary (``vocab`` tokens, None: unknown, nothing checked).

    Raises:
        ConfigError: naming ``eos_token_id``, the id and ``of`` (whose vocabulary it is)."""
    bad = next((t for t in ids or () if vocab is not None and t >= vocab), None)
    if bad is not None:
        raise ConfigError(
            f"rewards: eos_token_id {bad} is out of range: {of} has {vocab} tokens (ids 0..{vocab - 1}); no "
            "completion could ever end on it"
        )


def vocab_size(model: Any = None, tokenizer: Any = None) -> tuple[int | None, str]:
    """How many token ids a model can emit (its output layer's rows, else its config's ``vocab_size``; a folder:
    its ``config.json``'s), else a tokenizer object's ``len()``; ``(None, "")`` when neither tells."""
    import json
    import os

    if isinstance(model, (str, os.PathLike)):
        try:
            with open(os.path.join(os.fspath(model), "config.json"), encoding="utf-8") as fh:
                config = json.load(fh)
        except (OSError, ValueError):
            return None, ""
        size = config.get("vocab_size") if isinstance(config, dict) else None
        return (size, f"the model in {os.fspath(model)}") if _count(size) else (None, "")
    if model is not None:
        head = getattr(model, "get_output_embeddings", None)
        weight = getattr(head() if callable(head) else None, "weight", None)
        size = getattr(getattr(model, "config", None), "vocab_size", None)
        if getattr(weight, "ndim", 0) == 2:
            size = weight.shape[0]
        if _count(size):
            return int(size), f"the model ({type(model).__name__})"
    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        try:
            size = len(tokenizer)
        except TypeError:
            return None, ""
        return (size, f"the tokenizer ({type(tokenizer).__name__})") if _count(size) else (None, "")
    return None, ""


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
