"""``search(..., storage="sqlite:///search.db", study="name")``: every scored candidate lives in an Optuna study, so a
search killed midway resumes where it stopped and several processes (or machines, through an RDB URL) share one
search.

A search is a function of its seed and the scores it sees (:mod:`ram_live.selection.budget`, the moves, the seeded
samplers), so it resumes by running again from the start: a candidate whose outcome is in the study is taken from
there (its score, its per-prompt scores for the race, its cost), not merged or scored again, and the search walks
the same path until it reaches what nobody scored yet. Under the race the outcome depends on the reference it ran
against, so the study keys it by the candidate *and* the reference.

Each candidate scored is one Optuna trial: ``COMPLETE`` with its score, or ``PRUNED`` (stopped by the race) with
its estimate reported at the share of prompts it saw; its options, family and outcome in ``user_attrs``; where
the candidate is a point of its arm's box (:func:`~ram_live.selection.sampler_box.trial_params`: per-agent weights
``w:<agent>``, λ ``lam:<agent>``, ``scale``, ``density``, RAM+'s ``r``/``alpha``) that point is the trial's
``params``, with the box's distributions, so the dashboard's parameter plots show them. Before
scoring, a process *claims* the candidate (a ``RUNNING`` trial naming it, its host and process); another process
that needs the same candidate scores the candidates the search has announced next (a grid, the probes, both
directions of an ascent step) while it waits, so two processes split that work and both end with the trials of
one. A claim whose process is gone (same host, no such process) or older than ``STALE_SECONDS`` is abandoned
(``FAIL``) and scored again. ``optuna-dashboard sqlite:///search.db`` shows the study.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
import uuid
from typing import Any, Callable, Sequence

from ..errors import ConfigError
from .fidelity import Scored
from .outcome import Outcome
from .sampler import quiet_tell, quiet_optuna

__all__ = ["Ledger", "check_storage", "probe_storage", "open_ledger", "STALE_SECONDS"]

#: A claim older than this (seconds) from another host is taken as abandoned.
STALE_SECONDS = 3600.0
#: How often a process waiting for another's candidate looks again (seconds).
POLL_SECONDS = 0.2
OPEN_TRIES = 5
_KEY, _OUT, _OWNER, _AT = "ram_live:key", "ram_live:outcome", "ram_live:owner", "ram_live:claimed_at"


def check_storage(storage: Any, study: Any) -> None:
    """``storage=`` and ``study=`` checked without opening anything (what ``search(plan=True)`` and a training
    callback's pre-flight check).

    Args:
        storage: None, an RDB URL such as ``"sqlite:///search.db"`` or an Optuna storage.
        study: None or the study's name (needs ``storage``).

    Raises:
        ConfigError: ``study`` without ``storage``, a storage that is neither, an empty or non-str name, or no
            Optuna installed.

    Example:
        >>> check_storage("sqlite:///search.db", "grpo")
    """
    if storage is None:
        if study is not None:
            raise ConfigError(f"study={study!r} needs storage= (e.g. storage='sqlite:///search.db')")
        return
    try:
        import optuna
    except ImportError:
        raise ConfigError('storage= needs Optuna: pip install -e ".[optuna]" (or pip install optuna)') from None
    if not isinstance(storage, (str, optuna.storages.BaseStorage)) or isinstance(storage, str) and not storage:
        raise ConfigError(f"storage must be an RDB URL such as 'sqlite:///search.db', got {storage!r:.80}")
    if study is not None and (not isinstance(study, str) or not study):
        raise ConfigError(f"study must be a non-empty name, got {study!r:.80}")


def in_memory(storage: Any) -> bool:
    """Whether ``storage`` keeps its studies in this process's memory (an in-memory SQLite URL such as
    ``"sqlite://"`` or ``"sqlite:///:memory:"``, an Optuna ``RDBStorage`` of one, or Optuna's ``InMemoryStorage``):
    nothing a resumed job or another process can read.

    Example:
        >>> in_memory("sqlite://"), in_memory("sqlite:///:memory:"), in_memory("sqlite:///search.db")
        (True, True, False)
    """
    if isinstance(storage, str):
        scheme, sep, rest = storage.strip().partition("://")
        if not sep or not scheme.lower().startswith("sqlite"):
            return False
        path, _, query = rest.partition("?")
        return path in ("", "/") or ":memory:" in path or "mode=memory" in query
    optuna = sys.modules.get("optuna")
    if optuna is None:
        return False
    storage = getattr(storage, "_backend", storage)  # get_storage's cache around an RDB storage
    if isinstance(storage, optuna.storages.RDBStorage):
        return in_memory(str(storage.url))
    return isinstance(storage, optuna.storages.InMemoryStorage)


def probe_storage(storage: Any) -> None:
    """``storage`` opened once (an RDB URL: its database made if new, its tables created), so that a URL that
    cannot be used fails now, not at the first search (a training callback's pre-flight).

    Raises:
        ConfigError: Optuna could not open it (the message names the URL and Optuna's error).
    """
    check_storage(storage, None)
    if storage is None or not isinstance(storage, str):
        return
    import optuna

    try:
        with quiet_optuna():
            optuna.storages.get_storage(storage)
    except Exception as exc:  # SQLAlchemy's and the drivers' errors, of many classes
        raise ConfigError(f"storage={storage!r:.80}: Optuna could not open it ({exc})") from None


def inputs_fingerprint(agents: Sequence[Any], base: Any) -> str:
    """A digest of the search's inputs (the base's and every agent's tensors: names, shapes and their first and last
    64 stored entries, :class:`~ram_live.engine.digest.InputsDigest`): a stored study's scores are taken only for the
    weights they were scored on (a resumed job whose other agents published newer snapshots is another search).

    Args:
        agents: the agents' tensor sources, in order.
        base: the base's source.
    """
    from ..engine.digest import inputs_digest

    digest = inputs_digest()
    names = hashlib.sha1()
    for source in (base, *agents):
        keys = sorted(source.keys())
        names.update(
            json.dumps([getattr(source, "name", ""), keys, [list(source.spec(k).shape) for k in keys]]).encode()
        )
        for key in keys:
            digest.update([source.get(key).reshape(-1)])
    names.update(digest.hexdigest().encode())
    return names.hexdigest()


def models_fingerprint(models: Any, base: Any) -> str:
    """:func:`inputs_fingerprint` of models as :func:`ram_live.search` takes them (modules, state dicts, files,
    snapshots).

    Example:
        >>> import torch
        >>> len(models_fingerprint({"a": {"w": torch.ones(2)}}, {"w": torch.zeros(2)})) > 16
        True
    """
    from ..api import input_sources

    agents, base_source = input_sources(models, base)
    return inputs_fingerprint(agents, base_source)


def open_ledger(storage: Any, study: str | None, settings: dict[str, Any]) -> Ledger | None:
    """The search's ledger in ``storage`` (an RDB URL such as ``"sqlite:///search.db"`` or an Optuna storage), or
    None without one. ``settings`` (agents, budget, seed, ...) must match the study's if it exists."""
    check_storage(storage, study)
    if storage is None:
        return None
    import optuna

    for attempt in range(OPEN_TRIES):  # processes creating one new database at once: the losers see it made
        try:
            with quiet_optuna():
                handle = optuna.create_study(
                    storage=storage, study_name=study or "ram_live_search", load_if_exists=True, direction="maximize"
                )
            break
        except Exception as exc:
            if attempt == OPEN_TRIES - 1:
                raise ConfigError(f"storage={storage!r:.80}: Optuna could not open the study ({exc})") from None
            time.sleep(POLL_SECONDS * (attempt + 1))
    return Ledger(handle, settings)


def _reference_id(reference: Scored | None) -> str:
    """What the race ran against, as a short digest of its per-prompt scores ("" without a race)."""
    if reference is None:
        return ""
    text = json.dumps(sorted((int(i), v) for i, v in (reference.values or {}).items()))
    return hashlib.sha1(f"{reference.score!r}:{text}".encode()).hexdigest()[:16]


class Ledger:
    """The study as the search's record: look up, claim, and record the outcome of each candidate."""

    def __init__(self, study: Any, settings: dict[str, Any]) -> None:
        self.study = study
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.known: dict[str, dict[str, Any]] = {}
        self.reused = 0  # outcomes taken from the study instead of scored
        #: ``params_of(candidate, outcome) -> {name: (value, distribution)}``: a scored candidate's Optuna params
        #: (:func:`~ram_live.selection.sampler_box.trial_params`, set by the search), None: none recorded
        self.params_of: Callable[[dict[str, Any], Outcome], dict[str, tuple[Any, Any]]] | None = None
        given = json.loads(json.dumps(settings, default=str))
        stored = study.user_attrs.get("ram_live:settings")
        if stored is None:
            study.set_user_attr("ram_live:settings", given)
        elif stored != given:
            diff = sorted(k for k in set(stored) | set(given) if stored.get(k) != given.get(k))
            raise ConfigError(
                f"study {study.study_name!r} holds another search ({', '.join(diff)} differ: stored "
                f"{ {k: stored.get(k) for k in diff} }); use another study= name or the same settings"
            )

    # ------------------------------------------------------------------------------------------- lookups

    def _refresh(self) -> list[Any]:
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        for t in trials:
            key = t.user_attrs.get(_KEY)
            if key is not None and t.state in (TrialState.COMPLETE, TrialState.PRUNED) and _OUT in t.user_attrs:
                self.known.setdefault(key, t.user_attrs[_OUT])
        return trials

    def _claims(self, key: str, trials: list[Any]) -> list[Any]:
        from optuna.trial import TrialState

        return [t for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get(_KEY) == key]

    def _stale(self, t: Any) -> bool:
        host, pid, _ = (str(t.user_attrs.get(_OWNER, "::")).split(":") + ["", "", ""])[:3]
        if host == socket.gethostname() and pid.isdigit():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
            return False
        return time.time() - float(t.user_attrs.get(_AT, 0.0)) > STALE_SECONDS

    # ------------------------------------------------------------------------------------------- the protocol

    def outcome(
        self,
        key: str,
        reference: Scored | None,
        compute: Callable[[], Outcome],
        ahead: Callable[[], list[tuple[str, Scored | None, Callable[[], Outcome], dict[str, Any]]]],
        candidate: dict[str, Any],
        family: str,
    ) -> Outcome:
        """The outcome of the candidate ``key`` raced against ``reference``: from the study, or scored here
        (``compute``) under a claim; while another process holds the claim, the candidates ``ahead()`` announces
        are scored here."""
        lkey = f"{key}|{_reference_id(reference)}"
        while True:
            if lkey in self.known:
                self.reused += 1
                return _from_record(self.known[lkey])
            trials = self._refresh()
            if lkey in self.known:
                continue
            claims = self._claims(lkey, trials)
            live = [t for t in claims if not self._stale(t)]
            for t in claims:
                if t not in live:
                    self._abandon(t)
            if not live:
                mine = self._claim(lkey, candidate, family)
                if mine is not None:
                    return self._score(mine, compute, candidate)
                continue
            if not self._help(ahead()):
                time.sleep(POLL_SECONDS)

    def _claim(self, lkey: str, candidate: dict[str, Any], family: str) -> Any:
        """A RUNNING trial for ``lkey``, or None when another process claimed it first (the lower number wins)."""
        import optuna
        from optuna.trial import TrialState, create_trial

        attrs = {
            _KEY: lkey,
            _OWNER: self.owner,
            _AT: time.time(),
            "method": candidate["method"],
            "family": family,
            "options": _jsonable({k: v for k, v in candidate.items() if k != "method"}),
        }
        # made with its key in one write, so that a rival that looks after it was made sees the key
        template = create_trial(state=TrialState.RUNNING, user_attrs=attrs)
        trial = optuna.Trial(self.study, self.study._storage.create_new_trial(self.study._study_id, template))
        # an earlier claim, running or done since this process last looked, wins
        rivals = self.study.get_trials(
            deepcopy=False, states=(TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)
        )
        if any(t.number < trial.number and t.user_attrs.get(_KEY) == lkey for t in rivals):
            quiet_tell(self.study, trial, state=TrialState.FAIL)
            return None
        return trial

    def _abandon(self, t: Any) -> None:
        from optuna.trial import TrialState

        try:
            self.study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
        except Exception:  # another process abandoned it first
            pass

    def _score(self, trial: Any, compute: Callable[[], Outcome], candidate: dict[str, Any]) -> Outcome:
        from optuna.trial import TrialState

        try:
            out = compute()
        except BaseException:
            quiet_tell(self.study, trial, state=TrialState.FAIL)
            raise
        if out.scored is None:  # failed merges and evaluations are not kept: a resumed search meets them again
            quiet_tell(self.study, trial, state=TrialState.FAIL)
            return out
        record = _record(out)
        self._params(trial, candidate, out)
        trial.set_user_attr(_OUT, record)
        self.known[trial.user_attrs[_KEY]] = record
        if out.scored.fidelity >= 1.0:
            quiet_tell(self.study, trial, out.scored.score)
        else:
            trial.report(out.scored.score, int(round(out.scored.fidelity * 1000)))
            quiet_tell(self.study, trial, state=TrialState.PRUNED)
        return out

    def _params(self, trial: Any, candidate: dict[str, Any], out: Outcome) -> None:
        """The candidate's point in its arm's box as the trial's params (``trial.params``, the dashboard's plots)."""
        if self.params_of is None:
            return
        storage = self.study._storage
        for name, (value, distribution) in self.params_of(candidate, out).items():
            try:
                storage.set_trial_param(trial._trial_id, name, distribution.to_internal_repr(value), distribution)
            except ValueError:  # a name another trial holds with another kind of distribution: left out
                pass

    def _help(self, ahead: list[tuple[str, Scored | None, Callable[[], Outcome], dict[str, Any]]]) -> bool:
        """Score one announced candidate nobody has claimed; False when there is none."""
        trials = self.study.get_trials(deepcopy=False)
        for key, reference, compute, candidate in ahead:
            lkey = f"{key}|{_reference_id(reference)}"
            if lkey in self.known or self._claims(lkey, trials):
                continue
            mine = self._claim(lkey, candidate, "ahead")
            if mine is not None:
                self._score(mine, compute, candidate)
                return True
        return False


def _jsonable(value: Any) -> Any:
    from .result import to_json

    return json.loads(json.dumps(to_json(value), default=lambda v: f"<{type(v).__name__}>"))


def _record(out: Outcome) -> dict[str, Any]:
    s = out.scored
    assert s is not None
    return _jsonable(
        {
            "score": s.score,
            "cost": s.cost,
            "fidelity": s.fidelity,
            "tasks": s.tasks,
            "values": None if s.values is None else [[int(i), v] for i, v in s.values.items()],
            "stop": s.stop,
            "se": s.se,
            "clamped": s.clamped,
            "merge_seconds": out.merge_seconds,
            "evaluate_seconds": out.evaluate_seconds,
            "extrapolation": out.extrapolation,
            "lambdas": out.lambdas,
        }
    )


def _from_record(r: dict[str, Any]) -> Outcome:
    from .result import from_json

    r = from_json(r)
    values = None if r["values"] is None else {int(i): v for i, v in r["values"]}
    scored = Scored(r["score"], r["cost"], r["fidelity"], r["tasks"], values, r["stop"], r["se"], r["clamped"])
    # the time was spent by the process that scored it: not counted again
    return Outcome(scored=scored, extrapolation=r["extrapolation"], lambdas=r["lambdas"])
