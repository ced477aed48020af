"""``ram.rewards``: the run's own reward on a held-out prompts file as the verl integration's evaluation (for
``ram.search`` and after each merge), with :func:`ram_live.evaluate.rewards`.

    +ram.rewards.prompts=/data/held_out.jsonl +ram.rewards.max_new_tokens=256 +ram.search.budget=40

The reward is ``ram.rewards.compute_score`` (verl's ``compute_score(data_source, solution_str, ground_truth,
extra_info)``), else ``ram.rewards.reward`` (a TRL-style reward function), else the run's own: verl's
``custom_reward_function.path``/``.name`` when set, else ``verl.utils.reward_score.default_compute_score``. The
prompts file holds verl's rows (``prompt``, ``data_source``, ``reward_model: {"ground_truth": ...}``,
``extra_info``) as JSONL. The candidate folder's weights are copied into one model loaded once from the base
folder (on ``ram.rewards.device``, default CUDA when available, in ``ram.rewards.dtype``) and scored there;
``+ram.rewards.generate=vllm`` generates with vLLM instead (:class:`ram_live.evaluate.VLLMGenerate`, started from
the base folder, each candidate's weights swapped into it in place). Inside a Ray job (verl's driver)
all of this happens in the evaluation actor (:mod:`.remote`, on ``ram.eval_resources``: a GPU by default), never on
the driver; ``ram.rewards.device=cpu`` there asks for a CPU Ray worker instead.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ram_live.errors import ConfigError
from ram_live.loading import load_callable

from .checks import check_device, integer_value
from .dotted import get_dotted

__all__ = ["INTEGERS", "KEYS", "check_rewards", "rewards_evaluation", "run_reward_function"]

KEYS = ("prompts", "compute_score", "reward", "max_new_tokens", "batch_size", "samples", "device", "generate", "dtype")

#: ``ram.rewards.generate``: Hugging Face generate (default) or vLLM (:class:`ram_live.evaluate.VLLMGenerate`)
ENGINES = ("hf", "vllm")


#: the integer keys of ``ram.rewards``, with their defaults
INTEGERS = {"max_new_tokens": 64, "batch_size": 16, "samples": 1}


def check_rewards(values: Any) -> dict[str, Any]:
    """The ``ram.rewards`` group as a plain dict, every key checked at start-up (naming the key at fault):
    ``max_new_tokens`` / ``batch_size`` / ``samples`` integers >= 1 (``"4"`` from a command line becomes 4, ``2.7``
    is refused), ``device`` a torch device name, the reward paths strings, the prompts file readable.

    Args:
        values: the group (a mapping).

    Returns:
        The group, its integers as ``int``.

    Raises:
        ConfigError: naming ``ram.rewards.<key>``: an unknown key, a missing ``prompts``, both ``compute_score``
            and ``reward``, a value of the wrong type or out of range, a prompts file that does not load.
    """
    if not isinstance(values, Mapping):
        raise ConfigError(f"ram.rewards must be a mapping (+ram.rewards.prompts=FILE ...), got {values!r}")
    unknown = sorted(map(repr, set(values) - set(KEYS)))
    if unknown:
        raise ConfigError(f"unknown ram.rewards option(s) {', '.join(unknown)}; the options are: {', '.join(KEYS)}")
    if not values.get("prompts"):
        raise ConfigError("ram.rewards.prompts is required: a JSONL file of held-out prompts")
    if values.get("compute_score") and values.get("reward"):
        raise ConfigError("set ram.rewards.compute_score or ram.rewards.reward, not both")
    checked = dict(values)
    for key in ("compute_score", "reward"):
        if checked.get(key) is not None and (not isinstance(checked[key], str) or not checked[key].strip()):
            raise ConfigError(f"ram.rewards.{key} must be a dotted path 'pkg.module:function'; got {checked[key]!r}")
    for key in INTEGERS:
        if checked.get(key) is not None:
            checked[key] = integer_value(f"rewards.{key}", checked[key], minimum=1)
    if checked.get("device") is not None:
        checked["device"] = check_device("rewards.device", checked["device"])
    if checked.get("generate") is not None and checked["generate"] not in ENGINES:
        raise ConfigError(f"ram.rewards.generate must be one of {', '.join(ENGINES)}; got {checked['generate']!r}")
    if checked.get("dtype") is not None:
        from ram_live.evaluate.models import parse_dtype

        try:
            parse_dtype(checked["dtype"])
        except ConfigError as exc:
            raise ConfigError(f"ram.rewards.dtype: {exc}") from None
    from ram_live.evaluate import load_prompts

    try:
        load_prompts(checked["prompts"])
    except ConfigError as exc:
        raise ConfigError(f"ram.rewards.prompts: {exc}") from None
    return checked


def run_reward_function(config: Any) -> str | None:
    """``"<path>:<name>"`` of the verl run's ``custom_reward_function`` (top level, or under ``reward``), if set.

    Args:
        config: verl's trainer config.
    """
    for where in ("custom_reward_function", "reward.custom_reward_function"):
        path = get_dotted(config, f"{where}.path")
        if path:
            return f"{path}:{get_dotted(config, f'{where}.name') or 'compute_score'}"
    return None


def rewards_evaluation(values: Mapping[str, Any], base_dir: str | None) -> Callable[..., dict[str, float]]:
    """``fn(merged_dir, step) -> {"reward": mean, "reward/<fn>": ..., "ram/val-core/<task>/reward/<metric>": ...}``
    for ``ram.evaluate``/``ram.search`` (the ``ram/val-*`` keys: verl's layout, from
    :func:`~ram_live.integrations.metrics.evaluation_metrics`); the model is loaded at its first call, in the
    process that calls it (the evaluation actor inside Ray).

    Args:
        values: the checked ``ram.rewards`` group.
        base_dir: the base model's folder (its tokenizer, and the model each candidate's weights go into).

    Raises:
        ConfigError: no base folder, or a reward function path that does not load (naming its key).
    """
    import torch

    from ram_live.evaluate import compute_score, rewards
    from ram_live.evaluate.models import load_model

    from ..metrics import evaluation_metrics

    if base_dir is None:
        raise ConfigError("ram.rewards needs the base model's folder (ram.base)")
    if values.get("reward"):
        fn = load_callable(values["reward"], "ram.rewards.reward")
    else:
        fn = compute_score(
            load_callable(
                values.get("compute_score") or "verl.utils.reward_score:default_compute_score",
                "ram.rewards.compute_score",
            )
        )
    device = values.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    state: dict[str, Any] = {}

    vllm = values.get("generate") == "vllm"

    def evaluate(merged_dir: str, step: int | None = None) -> dict[str, float]:
        if "fn" not in state:  # the model (or vLLM, started from the base folder) is loaded at the first evaluation
            state["fn"] = rewards(
                values["prompts"],
                fn,
                tokenizer=base_dir,
                model=base_dir if vllm else load_model(base_dir, dtype=values.get("dtype")).to(device),
                dtype=values.get("dtype") if vllm else None,
                generate="vllm" if vllm else None,
                max_new_tokens=values.get("max_new_tokens") or INTEGERS["max_new_tokens"],
                batch_size=values.get("batch_size") or INTEGERS["batch_size"],
                samples=values.get("samples") or INTEGERS["samples"],  # k > 1: sampled, scored mean@k
            )
        state["fn"](merged_dir)
        return {**state["fn"].metrics, **evaluation_metrics(state["fn"], "verl")}

    return evaluate
