"""``search(..., parallel=N)``: candidates merged and scored by N workers ahead of the search loop, which takes
their outcomes in its own order, so the trials, the winner and the table are those of one process.

The loop tells the pool what it will try next where it knows (a grid, the probes, leave-one-out, both directions of
an ascent step); each worker merges its candidate into an output of its own, from the shared inputs (files are
memory-mapped by each worker; in-memory tensors go to shared memory once, never copied per worker), and scores it.
The loop then runs its trials in order as one process would: an outcome computed against the reference the loop
has at that point (always, without a race) is taken as it is; otherwise, or for a candidate nobody prefetched, a
worker scores it now. Every score comes from a worker, so all of them are computed alike; speculation costs wall
time only where it guessed wrong.

The inputs are read-only and shared; the scorer (``evaluate`` with whatever it holds) is not: it is pickled once by
value and each worker unpickles a copy of its own, so an evaluation that loads each candidate into a model it
holds (``rewards(..., model=...)``) loads it into that worker's model, never into one another worker scores on or
into the caller's.

Workers are local processes (``spawn``) by default, or Ray actors when ``ray_address`` is given or the search runs
inside a Ray job (``ray.is_initialized()``): ``evaluate`` and the inputs must be picklable (a module-level
function or an object; not a lambda). Each worker sees ``RAM_LIVE_WORKER`` (0..N-1), e.g. to pick its GPU.

The workers rebuild the search's merger from the same inputs (:func:`make_merger`): full models and their base, or
the :class:`~.adapters.AdapterAgents` of an adapter search (the adapters' factors already read, its base, its SVD
options), from which each worker builds an :class:`~.adapters.AdapterMerger`.
"""

from __future__ import annotations

import os
import pickle
import re
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from ..errors import ConfigError, SearchError
from ..option_checks import shown
from .fidelity import Scored, Scorer
from .outcome import Outcome, run_candidate
from .target import Merger
from .adapters import AdapterAgents, AdapterMerger

__all__ = ["Pool", "check_parallel", "make_merger"]

_STATE: dict[str, Any] = {}


def check_parallel(parallel: Any) -> int:
    """``parallel=`` as a worker count (1: no pool)."""
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ConfigError(f"parallel must be an int >= 1 (candidates scored at once), got {shown(parallel)}")
    return parallel


def make_merger(models: Any, base: Any, device: Any, workers: int | None) -> Merger:
    """The search's merger: an :class:`AdapterMerger` for :class:`AdapterAgents` (``base`` None: they hold it),
    else a :class:`Merger` of full models; built alike by the search process and by each worker."""
    if isinstance(models, AdapterAgents):
        return AdapterMerger(models, device=device, workers=workers)
    return Merger(models, base, device=device, workers=workers)


def _init_worker(counter: Any, payload: tuple[Any, ...], threads: int) -> None:
    """A process worker's start: its index, its thread share, its own merger and scorer."""
    import torch

    with counter.get_lock():
        index = counter.value
        counter.value += 1
    os.environ["RAM_LIVE_WORKER"] = str(index)
    torch.set_num_threads(threads)
    _STATE["worker"] = _Worker(*payload)


def _work(candidate: dict[str, Any], reference: Scored | None) -> Outcome:
    return _STATE["worker"].run(candidate, reference)


class _Worker:
    """A worker's own merger (one output of its own) and scorer (unpickled from the bytes the pool made)."""

    def __init__(self, models: Any, base: Any, device: Any, workers: Any, scorer: bytes) -> None:
        self.merger = make_merger(models, base, device, workers)
        self.scorer: Scorer = pickle.loads(scorer)

    def run(self, candidate: dict[str, Any], reference: Scored | None) -> Outcome:
        out = run_candidate(self.merger, self.scorer, candidate, reference)
        if out.raised is not None:
            out.raised = _portable(out.raised)
        return out


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError with its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class Pool:
    """N workers scoring prefetched candidates. ``submit`` starts one; ``take`` returns its outcome if it was
    computed against ``reference`` (the same object the loop holds now), else None."""

    def __init__(self, n: int, payload: tuple[Any, ...], ray_address: str | None = None) -> None:
        """``payload``: ``(models, base, device, workers, scorer)`` (``models`` an :class:`AdapterAgents` and
        ``base`` None for adapters, as :func:`make_merger` takes them); the scorer goes to each worker by value."""
        import torch

        *inputs, scorer = payload
        self.n, self.ray_address = n, ray_address
        # key -> (its future, the reference it is raced against, (index, actor) of the Ray actor running it or None)
        self.pending: dict[str, tuple[Future | Any, Scored | None, Any]] = {}
        self.ray = _use_ray(ray_address)
        self._started_ray = False
        self._executor: ProcessPoolExecutor | None = None
        # the workers compute as this process does: the same thread count (float sums can depend on it)
        self.threads = torch.get_num_threads()
        try:
            # by value with the plain pickler: torch's multiprocessing one would move evaluate's tensors (a model
            # it loads candidates into) to memory shared with every worker, and they would write into each other's
            self.payload = (*inputs, pickle.dumps(scorer, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception as exc:
            raise ConfigError(
                f"parallel={shown(n)} sends evaluate to worker processes, but it cannot be pickled "
                f"({type(exc).__name__}: {exc}); pass a module-level function or an object "
                "(not a lambda or a closure), or parallel=1"
            ) from None
        if self.ray is not None:
            self._started_ray = not self.ray.is_initialized()
            self._new_actor = _ray_factory(self.ray, self.payload, ray_address)
            self._actors = [self._new_actor(i) for i in range(n)]
            self._next = 0
        else:
            self._start()

    def _start(self) -> None:
        import torch.multiprocessing as tmp

        ctx = tmp.get_context("spawn")
        self._executor = ProcessPoolExecutor(
            max_workers=self.n,
            mp_context=ctx,
            initializer=_init_worker,
            initargs=(ctx.Value("i", 0), self.payload, self.threads),
        )

    def submit(self, key: str, candidate: dict[str, Any], reference: Scored | None, slot: int | None = None) -> None:
        """Start scoring ``candidate`` against ``reference`` (on Ray: on the actor of ``slot``, else the next one in
        turn)."""
        if key in self.pending and self.pending[key][1] is reference:
            return
        self.discard([key])
        where = None
        try:
            if self._executor is not None:
                try:
                    future = self._executor.submit(_work, candidate, reference)
                except BrokenProcessPool:  # a worker died on an earlier prefetch: what it held is scored anew
                    self._restart()
                    future = self._executor.submit(_work, candidate, reference)
            else:
                if slot is None:
                    slot, self._next = self._next % len(self._actors), self._next + 1
                where = (slot, self._actors[slot])
                future = where[1].run.remote(candidate, reference)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise ConfigError(
                f"parallel={shown(self.n)} sends the agents, the base and evaluate to worker processes, and "
                f"one of them cannot be pickled ({type(exc).__name__}: {exc}); use parallel=1"
            ) from None
        except RuntimeError as exc:
            if "Too many open files" in str(exc):
                raise ConfigError(
                    f"parallel={shown(self.n)}: sharing the in-memory inputs with the workers needs one file "
                    "descriptor per tensor and hit the limit (raise it: ulimit -n; or pass the agents "
                    "and base as checkpoint folders, which each worker memory-maps)"
                ) from None
            raise
        self.pending[key] = (future, reference, where)

    def discard(self, keys: Any) -> None:
        """Forget these prefetched candidates (the loop will not ask for them): cancelled if not started."""
        for key in list(keys):
            future, _, _ = self.pending.pop(key, (None, None, None))
            if future is None:
                continue
            if self._executor is not None:
                future.cancel()
            else:
                self.ray.cancel(future)

    def score(self, key: str, candidate: dict[str, Any], reference: Scored | None, label: str) -> Outcome:
        """The outcome of ``candidate`` against ``reference``: prefetched, or computed by a worker now. A worker
        that dies on a prefetched candidate (one the loop may never ask for) costs a restart of the pool (here or
        at the next :meth:`submit`; on Ray, a new actor in the dead one's place), and this candidate is scored again
        on its own; one that dies on it alone is a :class:`SearchError`."""
        slot = None
        try:
            outcome = self.take(key, reference, label)
            if outcome is None:
                self.submit(key, candidate, reference)
                outcome = self.take(key, reference, label)
            return outcome  # type: ignore[return-value]
        except BrokenProcessPool:
            self._restart()
        except _ActorDied as died:
            slot = self._replace(*died.where)
        try:
            self.submit(key, candidate, reference, slot=slot)
            return self.take(key, reference, label)  # type: ignore[return-value]
        except _ActorDied as died:
            self._replace(*died.where)
            raise SearchError(f"a Ray evaluation worker died while scoring candidate {label}: {died.reason}") from None
        except BrokenProcessPool:
            self._restart()
            raise SearchError(
                f"an evaluation worker died while scoring candidate {label} (killed, out of memory, "
                "or it could not start: worker processes re-import the main module, so a script "
                'needs `if __name__ == "__main__":`, and evaluate\'s class must be importable); '
                "the search stopped, nothing was written"
            ) from None

    def _restart(self) -> None:
        self.pending.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._start()

    def _replace(self, slot: int, dead: Any) -> int:
        """``slot`` with a new Ray actor in ``dead``'s place, unless an earlier failure of work queued on ``dead``
        replaced it already; the retry goes to that slot's new actor (not the next in turn: another may be dead)."""
        if self._actors[slot] is dead:
            try:
                self.ray.kill(dead)
            except Exception:  # already gone
                pass
            self._actors[slot] = self._new_actor(slot)
        return slot

    def take(self, key: str, reference: Scored | None, label: str) -> Outcome | None:
        if key not in self.pending:
            return None
        future, used, where = self.pending.pop(key)
        try:
            outcome = future.result() if self._executor is not None else self.ray.get(future)
        except Exception as exc:  # (a BrokenProcessPool is passed on as it is: score() restarts the pool)
            if type(exc).__name__ in ("RayActorError", "WorkerCrashedError", "ActorDiedError"):
                first = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines() or [type(exc).__name__]
                raise _ActorDied(where, first[0]) from None
            raise
        return outcome if used is reference else None

    def close(self, abort: bool = False) -> None:
        """Stop the workers; ``abort`` (the search is failing or interrupted): without waiting for their work."""
        if self._executor is not None:
            for future, _, _ in self.pending.values():
                future.cancel()
            if abort:
                for process in list(getattr(self._executor, "_processes", {}).values()):
                    process.terminate()
            self._executor.shutdown(wait=True, cancel_futures=True)
        elif self.ray is not None:
            for actor in self._actors:
                self.ray.kill(actor)
            if self._started_ray:  # a Ray this search started ends with it
                self.ray.shutdown()
        self.pending.clear()


def _use_ray(address: str | None) -> Any:
    """The ``ray`` module when the search should use Ray (an address given, or inside a Ray job), else None."""
    if address is None:
        try:
            import ray
        except ImportError:
            return None
        return ray if ray.is_initialized() else None
    try:
        import ray
    except ImportError:
        raise ConfigError(f'ray_address={address!r} needs Ray: pip install -e ".[ray]" (or pip install ray)') from None
    return ray


class _ActorDied(Exception):
    """A Ray actor died while it held a candidate (killed, out of memory, its node lost)."""

    def __init__(self, where: tuple[int, Any], reason: str) -> None:
        super().__init__(reason)
        self.where, self.reason = where, reason


def _ray_factory(ray: Any, payload: tuple[Any, ...], address: str | None) -> Any:
    """``make(index)``: a new Ray worker actor, from ``payload`` put in Ray's object store once."""
    if not ray.is_initialized():
        ray.init(
            address=None if address == "local" else address,
            ignore_reinit_error=True,
            include_dashboard=False,
            log_to_driver=False,
        )

    @ray.remote
    class RayWorker:
        def __init__(self, index: int, payload: tuple[Any, ...]) -> None:
            os.environ["RAM_LIVE_WORKER"] = str(index)
            self.worker = _Worker(*payload)

        def run(self, candidate: dict[str, Any], reference: Scored | None) -> Outcome:
            return self.worker.run(candidate, reference)

    ref = ray.put(payload)
    return lambda index: RayWorker.remote(index, ref)
