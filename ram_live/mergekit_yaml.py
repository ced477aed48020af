"""mergekit's YAML merge configs, read into a ram_live merge with mergekit's semantics.

>>> plan = from_mergekit_yaml("ties.yml")                                  # doctest: +SKIP
>>> models, base, kwargs = plan                                             # doctest: +SKIP
>>> ram_live.merge(models, base=base, out="merged/", **kwargs)              # doctest: +SKIP

Methods both libraries have: ``linear``, ``task_arithmetic``, ``ties``, ``dare_linear``, ``dare_ties``, ``ram``
and ``ramplus_tl``. docs/mergekit.md maps every key and says where the results differ. Needs PyYAML
(in the ram-live clone: ``pip install -e ".[yaml]"``), imported when a file is read.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import ConfigError

__all__ = ["MergekitPlan", "from_mergekit_yaml", "plan_from_mergekit"]

_GTA = ("task_arithmetic", "ties", "dare_linear", "dare_ties")
METHODS = ("linear", *_GTA, "ram", "ramplus_tl")
#: per method: the parameters mergekit reads (model-level and top-level ``parameters``)
_PARAMS: dict[str, frozenset[str]] = {
    "linear": frozenset({"weight", "normalize"}),
    **{m: frozenset({"weight", "density", "normalize", "rescale", "lambda", "int8_mask"}) for m in _GTA},
    "ram": frozenset({"epsilon"}),
    "ramplus_tl": frozenset({"epsilon", "r", "alpha"}),
}
_SHARED = frozenset({"normalize", "rescale", "lambda", "int8_mask", "epsilon", "r", "alpha"})  # one value per merge
#: mergekit's default ``normalize`` per method (merge_methods/registry.py)
_NORMALIZE = {"linear": True, "task_arithmetic": False, "ties": True, "dare_linear": False, "dare_ties": False}
_TOP = frozenset({"merge_method", "base_model", "models", "parameters", "dtype", "out_dtype", "tokenizer_source"})
_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
}


@dataclass
class MergekitPlan:
    """A mergekit config as ram_live arguments: ``merge(models, base=base, method=method, dtype=dtype, **options)``.

    Unpacks as ``models, base, kwargs = plan``; :meth:`merge` runs it.

    Args:
        mergekit_method: the config's ``merge_method``.
        method: the ram_live method it maps to.
        models: agent name → model folder (the base model excluded).
        base: the base model folder.
        options: the method's options (``weights``, ``density``/``densities``, ``divide_by``, ...).
        dtype: the output dtype (``out_dtype``, else ``dtype``), None: the base's.

    Example:
        >>> from_mergekit_yaml("ties.yml").merge(out="merged/")                  # doctest: +SKIP
    """

    mergekit_method: str
    method: str
    models: dict[str, str]
    base: str
    options: dict[str, Any] = field(default_factory=dict)
    dtype: torch.dtype | None = None

    def config(self) -> Any:
        """The method's config: for ``ram`` / ``ramplus_tl`` a :class:`~ram_live.RamConfig`
        (``ramplus_tl``: ``RamConfig(lam=RhoClip(r, alpha), rho_scope="tensor")``), which
        ``merge(models, base, config=plan.config())`` runs as :meth:`merge` does.

        Returns:
            The method's config object (``RamConfig``, ``TiesConfig``, ...), made from :attr:`options`.

        Raises:
            ConfigError: options the method does not take, or values it refuses.
        """
        from .methods import make_config

        return make_config(self.method, **self.options)

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`ram_live.merge` besides the models and the base.

        Returns:
            A new dict: ``method``, ``dtype`` and the method's :attr:`options`.
        """
        return {"method": self.method, "dtype": self.dtype, **self.options}

    def __iter__(self) -> Iterator[Any]:
        return iter((self.models, self.base, self.kwargs()))

    def merge(self, out: str | os.PathLike[str] | None = None, **overrides: Any) -> Any:
        """Run the merge with :func:`ram_live.merge`.

        Args:
            out: write the merge there as a Hugging Face folder (with the base's config and tokenizer files);
                None: return it.
            **overrides: more :func:`ram_live.merge` keywords (``device``, ``progress``, ...), or ones replacing
                the plan's (``dtype``, an option).

        Returns:
            What :func:`ram_live.merge` returns: the path written with ``out=``, else the merged model (a state
            dict: the base is a folder).

        Raises:
            ConfigError: an override or option :func:`ram_live.merge` refuses.
        """
        from .api import merge

        return merge(self.models, base=self.base, out=out, **{**self.kwargs(), **overrides})


def from_mergekit_yaml(path: str | os.PathLike[str]) -> MergekitPlan:
    """Read a mergekit YAML config (the file ``mergekit-yaml`` takes) into a :class:`MergekitPlan`.

    Args:
        path: the YAML file. Model paths are local folders, relative to the working directory as in mergekit,
            or Hugging Face ids (``org/name[@revision]``) found in the local cache (ram_live downloads nothing).

    Returns:
        The :class:`MergekitPlan`: unpacks as ``models, base, kwargs``; :meth:`MergekitPlan.merge` runs it.

    Raises:
        ConfigError: PyYAML is not installed; the file cannot be read or is not valid YAML; a key ram_live does not
            support (all of them named), a ``merge_method`` other than those above, a model that is not a local
            folder, a ``.safetensors`` file or a cached Hugging Face id, or a value out of range.

    Example:
        >>> models, base, kwargs = from_mergekit_yaml("ties.yml")               # doctest: +SKIP
        >>> ram_live.merge(models, base=base, out="merged", **kwargs)           # doctest: +SKIP
    """
    try:
        import yaml
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(
            'reading mergekit YAML needs PyYAML: pip install -e ".[yaml]" (in the ram-live clone)'
        ) from exc
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config ({exc.strerror or exc})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
    return plan_from_mergekit(data, source=str(path))


def plan_from_mergekit(config: Any, source: str = "config") -> MergekitPlan:
    """:func:`from_mergekit_yaml` for a config already parsed into dicts and lists."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"{source}: a mergekit config is a mapping with merge_method, models, ...")
    unsupported = [f"{k} (top level)" for k in config if k not in _TOP]
    method = config.get("merge_method")
    if method not in METHODS:
        raise ConfigError(f"{source}: merge_method {method!r} is not one ram_live runs (it runs {', '.join(METHODS)})")
    known = _PARAMS[method]
    shared = _params(config.get("parameters"), "parameters", source)
    unsupported += [f"parameters.{k}" for k in shared if k not in known]
    if config.get("tokenizer_source") not in (None, "base"):
        unsupported.append(
            f"tokenizer_source: {config['tokenizer_source']!r} (the merge copies the base's tokenizer files only)"
        )
    entries = config.get("models")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{source}: 'models' must be a non-empty list of {{model: path, parameters: ...}}")
    base_ref = config.get("base_model")
    if base_ref is not None:
        base_ref = _model_ref(base_ref, "base_model", source)
    models: dict[str, str] = {}
    params: dict[str, dict[str, Any]] = {}
    for i, entry in enumerate(entries):
        where = f"models[{i}]"
        if not isinstance(entry, Mapping) or "model" not in entry:
            raise ConfigError(f"{source}: {where} must be a mapping with a 'model' key")
        unsupported += [f"{where}.{k}" for k in entry if k not in ("model", "parameters")]
        ref = _model_ref(entry["model"], f"{where}.model", source)
        own = _params(entry.get("parameters"), f"{where}.parameters", source)
        if base_ref is not None and Path(ref).resolve() == Path(base_ref).resolve():
            continue  # mergekit takes the base out of the task vectors
        unsupported += [f"{where}.parameters.{k}" for k in own if k not in known]
        unsupported += [
            f"{where}.parameters.{k} (one value per merge: put it in the top-level parameters)"
            for k in own
            if k in known and k in _SHARED
        ]
        name = _name(ref if ref == entry["model"] else entry["model"].partition("@")[0], models)  # id: its name
        models[name] = ref
        params[name] = {**shared, **own}
    if unsupported:
        raise ConfigError(f"{source}: not supported by ram_live: {'; '.join(unsupported)}")
    if not models:
        raise ConfigError(f"{source}: no model to merge besides the base model")
    if base_ref is None:
        if method != "linear":
            raise ConfigError(f"{source}: merge_method {method} needs base_model")
        base_ref = next(iter(models.values()))  # a normalized linear merge is the same from any base
    for name, p in params.items():
        for key, value in p.items():
            _scalar(value, f"{key} of model {name!r}", source, boolean=key in ("normalize", "rescale", "int8_mask"))
    options = _options(method, params, shared, source)
    dtype = _dtype(config.get("out_dtype", config.get("dtype")), source)
    target = {"linear": "linear", "ram": "ram", "ramplus_tl": "ram_plus"}.get(method, method)
    return MergekitPlan(method, target, models, base_ref, options, dtype)


# ----------------------------------------------------------------------------------------------- helpers


def _params(value: Any, where: str, source: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: {where} must be a mapping of parameter names to values")
    return dict(value)


def _model_ref(value: Any, where: str, source: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{source}: {where} must be a model path, got {value!r}")
    if "+" in value and not Path(value).exists():
        raise ConfigError(
            f"{source}: {where} {value!r}: 'model+lora' references are not supported (merge the "
            "LoRA into its model first, or use ram_live.peft)"
        )
    if not Path(value).is_dir() and not value.endswith(".safetensors"):
        from .io.hub import cached_snapshot

        folder = cached_snapshot(value, what=f"{source}: {where}")  # org/name[@revision] in the local HF cache
        if folder is None:
            raise ConfigError(
                f"{source}: {where} {value!r} is not a local folder (ram_live downloads nothing; "
                "paths are relative to the working directory, as in mergekit)"
            )
        return str(folder)
    return value


def _name(ref: str, taken: Mapping[str, str]) -> str:
    stem = Path(ref.rstrip("/")).name.removesuffix(".safetensors") or "model"
    name, i = stem, 2
    while name in taken:
        name, i = f"{stem}_{i}", i + 1
    return name


def _scalar(value: Any, what: str, source: str, boolean: bool = False) -> None:
    if isinstance(value, (list, Mapping)):
        raise ConfigError(
            f"{source}: {what} is {'a list' if isinstance(value, list) else 'a mapping'} "
            f"({value!r}): mergekit interpolates lists over the layers and applies filters per "
            "tensor; ram_live takes one value per model: give a number"
        )
    if boolean:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {what} must be true or false, got {value!r}")
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{source}: {what} must be a finite number, got {value!r}")


def _options(method: str, params: dict[str, dict[str, Any]], shared: dict[str, Any], source: str) -> dict[str, Any]:
    """ram_live's options for ``method`` with mergekit's defaults and semantics."""
    if method in ("ram", "ramplus_tl"):
        opts: dict[str, Any] = {"eps": float(shared.get("epsilon", 1e-5)), "activity": "abs"}
        if method == "ramplus_tl":
            opts.update(r=float(shared.get("r", 0.1)), alpha=float(shared.get("alpha", 0.2)), rho_scope="tensor")
        return opts
    missing = [n for n, p in params.items() if "weight" not in p]
    if missing:
        raise ConfigError(
            f"{source}: merge_method {method} needs a weight for every model (mergekit requires "
            f"it); none for {', '.join(map(repr, missing))}"
        )
    weights = [float(p["weight"]) for p in params.values()]
    normalize = bool(shared.get("normalize", _NORMALIZE[method]))
    if method == "linear":
        if not normalize and not math.isclose(sum(weights), 1.0, rel_tol=1e-9):
            raise ConfigError(
                f"{source}: linear with normalize: false and weights summing to {sum(weights):g} "
                "(mergekit's Σ w·θ, not a merge around a base) is not supported; use normalize: true "
                "or weights that sum to 1"
            )
        return {"weights": weights, "normalize": True}
    scale = float(shared.get("lambda", 1.0))
    if method in ("task_arithmetic", "dare_linear") and normalize:
        total = sum(weights)
        weights = [w / total for w in weights] if abs(total) >= 1e-8 else weights  # mergekit keeps them at Σ≈0
    opts = {"weights": weights, "scale": scale}
    if method == "task_arithmetic":
        return opts
    densities = [float(p.get("density", 1.0)) for p in params.values()]
    for name, d in zip(params, densities):
        if not 0.0 <= d <= 1.0 or method.startswith("dare") and d == 0:
            raise ConfigError(
                f"{source}: density of model {name!r} must be in {'(0' if 'dare' in method else '[0'}, 1], got {d!r}"
            )
    if len(set(densities)) == 1:
        opts["density"] = densities[0]
    else:
        opts["densities"] = densities
    if method.startswith("dare") and shared.get("rescale", True) is False and any(d < 1 for d in densities):
        raise ConfigError(
            f"{source}: {method} with rescale: false is not supported (ram_live rescales DARE's survivors by 1/density)"
        )
    if method in ("ties", "dare_ties"):
        opts.update(elect_on="weighted", majority_sign="total", divide_by="weights" if normalize else "none")
    return opts


def _dtype(value: Any, source: str) -> torch.dtype | None:
    if value is None:
        return None
    name = str(value).removeprefix("torch.")
    if name not in _DTYPES:
        raise ConfigError(f"{source}: dtype {value!r} is not one of {', '.join(sorted(_DTYPES))}")
    return _DTYPES[name]
