"""The evaluations of a verl run's merges, and where they run.

A run has up to three: the one logged after each merge (``ram.evaluate``, or ``ram.rewards``: the run's own reward
on held-out prompts), and ``ram.search``'s selection evaluation (``ram.search.evaluate``, default the former) and
``confirm``. Outside Ray (tests, ``ram-live verl-snapshot``, a single process) they run in this process, as they
always did. Inside a Ray job (``ray.is_initialized()``: verl's driver) they run in one Ray actor
(:mod:`.remote`), never on the driver; the start-up checks refuse a Ray cluster without a GPU unless the user
asked for a CPU evaluation (``ram.rewards.device=cpu`` or ``ram.eval_resources`` without GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

from ram_live.errors import ConfigError
from ram_live.loading import load_callable

from .common import load_evaluate
from .config import EVAL_RESOURCES, EVAL_RESOURCES_CPU, RAMVerlOptions
from .remote import Evaluation, RemoteEvaluator, ray_if_running, wants_gpu

__all__ = ["Evaluations", "build_evaluations", "eval_resources"]

Factory = Callable[[], Callable[..., Any]]


@dataclass
class Evaluations:
    """A run's evaluations, each ``fn(merged_dir, step=step) -> dict | float`` (or None when not set).

    Attributes:
        evaluate: after each merge (``ram.evaluate`` or ``ram.rewards``); its scores are logged as ``ram/<name>``.
        search: ``ram.search``'s selection evaluation (None without ``ram.search``).
        confirm: ``ram.search.confirm`` (None when not set).
        remote: the Ray actor's driver side, when they run there (None: in this process).
    """

    evaluate: Callable[..., Any] | None = None
    search: Callable[..., Any] | None = None
    confirm: Callable[..., Any] | None = None
    remote: RemoteEvaluator | None = None

    def close(self) -> None:
        """Free the evaluation actor, if any (a later evaluation starts a new one)."""
        if self.remote is not None:
            self.remote.close()


def _given(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The factory of an evaluation given as a callable: the callable itself."""
    return fn


def _label(fn: Any) -> str:
    if isinstance(fn, str):
        return fn
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}:{name}" if module else name


def _rewards_name(values: Mapping[str, Any]) -> str:
    return f"ram.rewards ({values.get('reward') or values.get('compute_score') or 'default_compute_score'})"


def _specs(
    opts: RAMVerlOptions, base_dir: Path | None
) -> tuple[dict[str, tuple[str, Factory]], dict[str, Callable[..., Any]], dict[str, str]]:
    """``(factories, local functions, role -> key)``: each evaluation's name and factory (what the Ray actor
    builds it with), the same evaluations built here (every path loaded, so a bad one is refused at start-up;
    ``ram.rewards`` loads its model at its first call), and which key each role uses."""
    factories: dict[str, tuple[str, Factory]] = {}
    local: dict[str, Callable[..., Any]] = {}
    roles: dict[str, str] = {}
    if opts.rewards is not None:  # the run's reward on held-out prompts (integrations/verl/rewards.py)
        from .rewards import rewards_evaluation

        where = None if base_dir is None else str(base_dir)
        factories["evaluate"] = (_rewards_name(opts.rewards), partial(rewards_evaluation, dict(opts.rewards), where))
        local["evaluate"] = rewards_evaluation(opts.rewards, where)
        roles["evaluate"] = "evaluate"
    elif opts.evaluate:
        factories["evaluate"] = (f"ram.evaluate {opts.evaluate}", partial(load_evaluate, opts.evaluate))
        local["evaluate"] = load_evaluate(opts.evaluate)
        roles["evaluate"] = "evaluate"
    setting = opts.search
    if setting is not None:
        for role in ("search", "confirm"):
            value = setting.evaluate if role == "search" else setting.confirm
            if value is None:
                if role == "search" and "evaluate" in roles:
                    roles["search"] = "evaluate"  # the same function: one model in the actor
                continue
            option = f"ram.search.{'evaluate' if role == 'search' else 'confirm'}"
            factory = partial(load_callable, value, option) if isinstance(value, str) else partial(_given, value)
            factories[role] = (f"{option} {_label(value)}", factory)
            local[role] = load_callable(value, option)
            roles[role] = role
        if "search" not in roles:
            raise ConfigError(
                "ram.search needs an evaluation: set ram.search.evaluate, ram.evaluate or ram.rewards.prompts"
            )
    return factories, local, roles


def eval_resources(opts: RAMVerlOptions) -> dict[str, Any]:
    """The Ray resources of the evaluation actor: ``ram.eval_resources``, else
    :data:`~.config.EVAL_RESOURCES_CPU` with ``ram.rewards.device=cpu``, else :data:`~.config.EVAL_RESOURCES`.

    Args:
        opts: the validated options.
    """
    if opts.eval_resources is not None:
        return dict(opts.eval_resources)
    device = str((opts.rewards or {}).get("device") or "")
    if device == "cpu" or device.startswith("cpu:"):
        return dict(EVAL_RESOURCES_CPU)
    return dict(EVAL_RESOURCES)


def build_evaluations(opts: RAMVerlOptions, base_dir: Path | None) -> Evaluations:
    """The run's evaluations: local outside Ray, a Ray actor's inside (checked at start-up).

    Args:
        opts: the validated options.
        base_dir: the base model's folder (``ram.rewards`` loads its model from it).

    Raises:
        ConfigError: a path that does not load (naming its key); inside Ray, a cluster without a GPU while the
            evaluation would ask for one (one line: ``ram.rewards.device=cpu`` or ``ram.eval_resources`` without
            GPUs evaluates on a CPU worker instead), or resources Ray refuses (naming ``ram.eval_resources``).
    """
    factories, local, roles = _specs(opts, base_dir)
    if not roles:
        return Evaluations()
    ray = ray_if_running()
    if ray is None:  # one process: evaluated here, as always
        return Evaluations(**{role: Evaluation(factories[key][0], local[key]) for role, key in roles.items()})
    resources = eval_resources(opts)
    remote = RemoteEvaluator(factories, resources, opts.eval_timeout, ray)  # Ray's checks of the options first
    if wants_gpu(resources) and not ray.cluster_resources().get("GPU", 0):
        what = "ram.rewards" if opts.rewards is not None else "the evaluation"
        raise ConfigError(
            f"ram: the Ray cluster has no GPU and {what} would run in a Ray actor asking for "
            f"ram.eval_resources={resources!r}; the hook runs on verl's CPU-only driver and never "
            "generates there: give the cluster a GPU, or evaluate on a CPU Ray worker with "
            "+ram.rewards.device=cpu or +ram.eval_resources.num_cpus=N (no num_gpus)"
        )
    return Evaluations(**{role: remote.function(key) for role, key in roles.items()}, remote=remote)
