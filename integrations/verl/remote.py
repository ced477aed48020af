"""The verl integration's evaluations run in a Ray actor, never on verl's driver.

In a verl run the checkpoint hook runs on the driver (verl's ``TaskRunner``, a CPU-only Ray actor), where no
model may generate. When Ray is running (``ray.is_initialized()``), every evaluation the hook makes
(``ram.evaluate``, ``ram.rewards``, ``ram.search.evaluate`` / ``confirm``) is therefore a call to one Ray actor,
:class:`EvaluationHost`, created with ``.options(**ram.eval_resources)`` (default ``{"num_gpus": 1}``) at the first
evaluation and reused for the rest of the run: it builds each evaluation once (``ram.rewards`` loads its model
once, on the actor's GPU) and evaluates the folders the driver writes, read by path (the same node, or a file
system both see). The calls return the metrics; an exception inside comes back as the same library error
(:class:`~ram_live.errors.EvaluationError`, or the library's own), its message naming the function.

:class:`RemoteEvaluator` is the driver's side: one actor, placed within ``ram.eval_timeout`` seconds of the first
call and each call answered within it, else an EvaluationError naming ``ram.eval_timeout`` (the actor is then
killed, freeing what it held; the next evaluation starts a new one). Nothing here imports Ray or torch at import
time.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import time
import traceback
from typing import Any, Callable, Mapping

from ram_live.errors import ConfigError, EvaluationError, RamLiveError

__all__ = [
    "RESOURCE_KEYS",
    "Evaluation",
    "EvaluationHost",
    "RemoteEvaluation",
    "RemoteEvaluator",
    "check_eval_resources",
    "check_eval_timeout",
    "ray_if_running",
    "wants_gpu",
]

log = logging.getLogger("ram_live.verl")

#: the keys of ``ram.eval_resources``: the resource options of Ray's ``.options(...)``
RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory", "resources", "accelerator_type")


def ray_if_running() -> Any:
    """The ``ray`` module when a Ray job runs in this process (``ray.is_initialized()``), else None; Ray is not
    imported here (a process that never imported it runs no Ray job)."""
    import sys

    ray = sys.modules.get("ray")
    return ray if ray is not None and getattr(ray, "is_initialized", lambda: False)() else None


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"ram.eval_resources.{key} must be a finite number >= 0; got {value!r}")
    return value


def check_eval_resources(value: Any) -> dict[str, Any] | None:
    """``ram.eval_resources`` checked: None (the default), or a mapping of Ray's resource options.

    Args:
        value: ``{"num_gpus": 1}``, ``{"num_gpus": 0.5, "num_cpus": 2}``, ``{"resources": {"eval_gpu": 1}}``, ...
            (keys: :data:`RESOURCE_KEYS`; numbers >= 0; ``memory`` in bytes; ``accelerator_type`` a string).

    Raises:
        ConfigError: naming the key at fault.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"ram.eval_resources must be a mapping of Ray resource options (e.g. "
            f"+ram.eval_resources.num_gpus=1), got {value!r}"
        )
    unknown = sorted(map(str, set(value) - set(RESOURCE_KEYS)))
    if unknown:
        raise ConfigError(
            f"unknown ram.eval_resources option(s) {', '.join(unknown)}; the options are: {', '.join(RESOURCE_KEYS)}"
        )
    out: dict[str, Any] = {}
    for key, v in value.items():
        if key == "resources":
            if not isinstance(v, Mapping) or not v:
                raise ConfigError(
                    f"ram.eval_resources.resources must be a mapping of custom resources to amounts, got {v!r}"
                )
            out[key] = {str(k): _number(f"resources.{k}", n) for k, n in v.items()}
        elif key == "accelerator_type":
            if not isinstance(v, str) or not v:
                raise ConfigError(f"ram.eval_resources.accelerator_type must be a string, got {v!r}")
            out[key] = v
        else:
            out[key] = _number(key, v)
    return out


def check_eval_timeout(value: Any) -> float:
    """``ram.eval_timeout`` checked: a finite number of seconds > 0.

    Args:
        value: the key's value.

    Raises:
        ConfigError: naming the key.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"ram.eval_timeout must be a finite number of seconds > 0; got {value!r}")
    return float(value)


def wants_gpu(resources: Mapping[str, Any]) -> bool:
    """Whether Ray's resource options ``resources`` ask for a GPU.

    Args:
        resources: checked ``ram.eval_resources``.
    """
    return float(resources.get("num_gpus") or 0) > 0 or float((resources.get("resources") or {}).get("GPU", 0)) > 0


class Evaluation:
    """An evaluation ``fn(merged_dir, step=step) -> dict | float`` under the name its errors use: the library's
    errors pass as they are, any other exception becomes an :class:`~ram_live.errors.EvaluationError` naming it
    (the cause chained). The same wrapper runs locally and in :class:`EvaluationHost`, so both raise alike.

    Args:
        name: how errors name the evaluation (``"ram.evaluate my_pkg.evals:score"``).
        fn: the evaluation.
    """

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name = name
        self.fn = fn

    def __call__(self, merged_dir: str, step: int | None = None) -> Any:
        try:
            return self.fn(merged_dir, step=step)
        except RamLiveError:
            raise
        except Exception as exc:
            raise EvaluationError(
                f"{self.name} raised {type(exc).__name__} on {merged_dir}: {exc}", function=self.name
            ) from exc


def _portable(exc: BaseException, name: str) -> BaseException:
    """``exc`` if it survives pickling as it is, else an EvaluationError with its type and message."""
    try:
        back = pickle.loads(pickle.dumps(exc))
        if type(back) is type(exc) and str(back) == str(exc):
            return exc
    except Exception:
        pass
    return EvaluationError(f"{type(exc).__name__}: {exc}", function=name)


class EvaluationHost:
    """The Ray actor's class: builds each evaluation once, on first use, from its factory, and runs it.

    Args:
        factories: per key, ``(name, factory)``: ``factory()`` returns the evaluation (picklable: a
            ``functools.partial`` of a module-level function, or a callable to use as it is).
    """

    def __init__(self, factories: Mapping[str, tuple[str, Callable[[], Callable[..., Any]]]]) -> None:
        self.factories = dict(factories)
        self.built: dict[str, Evaluation] = {}

    def where(self) -> tuple[int, str]:
        """``(pid, node id)`` of the actor's process."""
        node = ""
        try:
            import ray

            node = ray.get_runtime_context().get_node_id()
        except Exception:  # not in Ray (a test calling the class directly)
            pass
        return os.getpid(), node

    def run(self, key: str, merged_dir: str, step: int | None) -> tuple[str, Any, str]:
        """``("ok", metrics, "")``, or ``("error", the exception, its traceback)``: errors come back as values,
        so the driver re-raises the library's own error rather than Ray's wrapper."""
        name = self.factories.get(key, (key, None))[0]
        try:
            if key not in self.built:
                self.built[key] = Evaluation(name, self.factories[key][1]())
            return "ok", self.built[key](merged_dir, step=step), ""
        except Exception as exc:
            if not isinstance(exc, RamLiveError):
                exc = EvaluationError(f"{name} could not be built: {type(exc).__name__}: {exc}", function=name)
            return "error", _portable(exc, name), traceback.format_exc()


_HOST: Any = None


def _host_class(ray: Any) -> Any:
    global _HOST
    if _HOST is None:
        _HOST = ray.remote(EvaluationHost)
    return _HOST


class RemoteEvaluator:
    """The driver's side of the evaluation actor: created at the first call, reused, killed by :meth:`close`.

    Args:
        factories: what :class:`EvaluationHost` builds (per key, ``(name, factory)``).
        resources: Ray's ``.options(...)`` of the actor (``ram.eval_resources`` resolved).
        timeout: ``ram.eval_timeout``: seconds for the actor to be placed (first call) and each call to finish.
        ray: the ``ray`` module (Ray running).

    Raises:
        ConfigError: Ray refuses ``resources`` (naming ``ram.eval_resources``).
    """

    def __init__(
        self,
        factories: Mapping[str, tuple[str, Callable[[], Callable[..., Any]]]],
        resources: Mapping[str, Any],
        timeout: float,
        ray: Any,
    ) -> None:
        self.factories = dict(factories)
        self.resources = dict(resources)
        self.timeout = timeout
        self.ray = ray
        self.actor: Any = None
        self.pid: int | None = None
        self.node: str | None = None
        try:
            _host_class(ray).options(**self.resources)  # Ray's own checks of the options, at start-up
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"ram.eval_resources={self.resources!r}: {exc}") from None

    def function(self, key: str) -> RemoteEvaluation:
        """The evaluation ``key`` as a driver-side callable ``fn(merged_dir, step=step)``.

        Args:
            key: one of the factories' keys.
        """
        return RemoteEvaluation(self, key, self.factories[key][0])

    def _unplaced(self, name: str, merged_dir: str) -> EvaluationError:
        return EvaluationError(
            f"ram.eval_timeout: the evaluation actor for {name} ({merged_dir}) was not placed within "
            f"{self.timeout:g} s with ram.eval_resources={self.resources!r}: the GPUs may all be held by verl's "
            "workers (their placement groups reserve whole GPUs); leave one out of verl's pool (trainer.n_gpus_per_"
            "node below the node's GPUs) or give fractional num_gpus of a GPU they do not hold, or raise "
            "ram.eval_timeout",
            function=name,
        )

    def call(self, key: str, merged_dir: str, step: int | None = None) -> Any:
        """Evaluate ``merged_dir`` with the evaluation ``key`` in the actor; returns what the evaluation returned.

        Args:
            key: which evaluation.
            merged_dir: the folder to evaluate (read by the actor by path).
            step: the training step.

        Raises:
            EvaluationError: the actor was not placed, or the call did not finish, within ``ram.eval_timeout``;
                the actor died; or the evaluation raised (the library's own error as it is, any other as an
                EvaluationError naming the function; the remote traceback in the exception's notes).
        """
        ray, name = self.ray, self.factories[key][0]
        start = time.monotonic()
        if self.actor is None:
            self.actor = _host_class(ray).options(**self.resources).remote(self.factories)
            ready = self.actor.where.remote()
            done, _ = ray.wait([ready], timeout=self.timeout)
            if not done:
                self.close()
                raise self._unplaced(name, merged_dir)
            self.pid, self.node = self._get(ready, name, merged_dir, 1.0)
            log.info(
                "ram_live: evaluations run in a Ray actor (pid %s, node %s, %s), placed in %.1f s",
                self.pid,
                self.node,
                self.resources,
                time.monotonic() - start,
            )
        left = max(self.timeout - (time.monotonic() - start), 1e-3)
        status, value, remote_tb = self._get(self.actor.run.remote(key, merged_dir, step), name, merged_dir, left)
        if status == "error":
            if remote_tb and hasattr(value, "add_note"):
                value.add_note(f"raised in the evaluation actor (pid {self.pid}):\n{remote_tb}")
            raise value
        return value

    def _get(self, ref: Any, name: str, merged_dir: str, timeout: float) -> Any:
        from ray.exceptions import GetTimeoutError, RayError

        try:
            return self.ray.get(ref, timeout=timeout)
        except GetTimeoutError:
            self.close()
            raise EvaluationError(
                f"ram.eval_timeout: {name} did not finish on {merged_dir} within {self.timeout:g} s "
                "(the evaluation actor was killed; the next evaluation starts a new one); raise "
                "ram.eval_timeout",
                function=name,
            ) from None
        except RayError as exc:
            self.close()
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise EvaluationError(
                f"the evaluation actor failed while running {name} on {merged_dir} ({type(exc).__name__}: {first})",
                function=name,
            ) from None

    def close(self) -> None:
        """Kill the actor (freeing its GPU); a later call starts a new one."""
        actor, self.actor = self.actor, None
        if actor is not None:
            try:
                self.ray.kill(actor)
            except Exception:  # already gone
                pass


class RemoteEvaluation:
    """One evaluation of a :class:`RemoteEvaluator`, called like the local one: ``fn(merged_dir, step=step)``.

    Args:
        evaluator: the driver's side of the actor.
        key: which evaluation.
        name: how errors name it.
    """

    def __init__(self, evaluator: RemoteEvaluator, key: str, name: str) -> None:
        self.evaluator = evaluator
        self.key = key
        self.name = name

    def __call__(self, merged_dir: str, step: int | None = None) -> Any:
        return self.evaluator.call(self.key, merged_dir, step)
