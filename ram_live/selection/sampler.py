"""Model-based samplers inside a search: in an arm's refinement, candidates are proposed by a model of the scores
seen so far in that arm's box (:mod:`ram_live.selection.sampler_box`), each raced on slices of the prompts as any
candidate (``fidelity="halving"``), the race's estimates fed back as the model's observations.

``search(sampler=...)``:

- None (the default): ``"tpe"`` in a race (``fidelity="halving"``) of ``budget="10x"`` or more, else ``"moves"``;
- ``"moves"``: no model; the coordinate ascents and local steps (:mod:`ram_live.selection.moves`);
- ``"tpe"``: the built-in Tree-structured Parzen Estimator (:class:`TPE`), pure Python, seeded by ``seed``: the
  same seed and scores give the same candidates on every machine; no extra needed;
- ``"optuna-tpe"``, ``"optuna-gp"``, ``"optuna-cmaes"``, ``"optuna-random"``, ``"optuna-nsga2"`` (the names of
  ``ram-live search --sampler``, for configs that hold text: verl's ``+ram.search.sampler``): that Optuna sampler,
  seeded by ``seed``;
- an Optuna sampler (``optuna.samplers.TPESampler(seed=0)``, ``GPSampler``, ``CmaEsSampler``, ``NSGAIISampler``,
  ...): ask-and-tell, one study per arm over the box as Optuna distributions; a candidate the race stopped is told
  ``PRUNED`` with its estimate reported at the prompts it saw; NSGA-II (and NSGA-III) search two objectives, the
  score and the worst task's score (the winner is still the best score). A copy of the sampler is used (the one
  given is left as it was), so a seeded sampler proposes the same candidates in every search.
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
from typing import Any, Iterator

from ..errors import ConfigError
from .result import Trial
from .sampler_box import Box, Dim

__all__ = ["TPE", "OptunaProposer", "parse_sampler", "sampler_name", "sampler_label", "TPE_FROM"]

#: ``sampler=None``: the built-in TPE in a race (``fidelity="halving"``) of at least this many full evaluations'
#: worth of prompts, the moves otherwise (where each won on benchmarks/bench_samplers.py; docs/search.md).
TPE_FROM = 10.0
#: The built-in TPE: share of the observations that model the good region, candidates drawn from it per proposal.
GAMMA, DRAWS, BANDWIDTH = 0.25, 48, 0.25
MULTI_OBJECTIVE = ("NSGAIISampler", "NSGAIIISampler")
#: Optuna samplers that learn from complete trials only: a raced candidate is told to them as complete, with the
#: race's estimate (as pruned, a race would leave the GP on its random start-up draws, CMA-ES on a few points).
COMPLETE_ONLY = ("GPSampler", "CmaEsSampler", "QMCSampler")


def parse_sampler(sampler: Any, seed: int, raced: bool = False, budget: float = 0.0) -> Any:
    """``search``'s ``sampler=``: None (the default: ``"tpe"`` in a race of a budget of at least :data:`TPE_FROM`
    full evaluations, else ``"moves"``), ``"moves"``, ``"tpe"``, an Optuna sampler's name (``"optuna-tpe"``, ...:
    that sampler seeded by ``seed``) or an Optuna sampler. Returns None for the moves, else a proposer
    (:class:`TPE` or :class:`OptunaProposer`)."""
    from ..cli.parser import OPTUNA_SAMPLERS  # the names, declared once (the parser imports nothing heavy)

    if sampler is None:
        sampler = "tpe" if raced and budget >= TPE_FROM - 1e-9 else "moves"
    if isinstance(sampler, str):
        if sampler == "moves":
            return None
        if sampler == "tpe":
            return TPE(seed)
        if sampler in OPTUNA_SAMPLERS:
            try:
                import optuna
            except ImportError:
                raise ConfigError(
                    f'sampler={sampler!r} needs Optuna: pip install -e ".[optuna]" (or pip install optuna)'
                ) from None
            return OptunaProposer(getattr(optuna.samplers, OPTUNA_SAMPLERS[sampler])(seed=seed))
        raise ConfigError(
            f"sampler must be 'moves', 'tpe', one of {', '.join(map(repr, OPTUNA_SAMPLERS))} or an Optuna "
            f"sampler, got {sampler!r:.80}"
        )
    module = type(sampler).__module__ or ""
    if module.startswith("optuna") or _is_optuna_sampler(sampler):
        return OptunaProposer(sampler)
    raise ConfigError(
        f"sampler must be 'moves', 'tpe' or an Optuna sampler (optuna.samplers.TPESampler(seed=0), ...), "
        f"got {type(sampler).__name__}"
    )


def sampler_label(sampler: Any) -> str | None:
    """How a record names a ``sampler=`` as given, before any search: None, its text, or ``"optuna:<class>"``.

    Example:
        >>> sampler_label("tpe")
        'tpe'
    """
    if sampler is None or isinstance(sampler, str):
        return sampler
    return f"optuna:{type(sampler).__name__}"


def _is_optuna_sampler(sampler: Any) -> bool:
    try:
        import optuna
    except ImportError:
        return False
    return isinstance(sampler, optuna.samplers.BaseSampler)


def sampler_name(proposer: Any) -> str:
    """How the table and the record name the sampler: ``"moves"``, ``"tpe"`` or ``"optuna:<class>"``."""
    if proposer is None:
        return "moves"
    return proposer.name


# ------------------------------------------------------------------------------------------- the built-in TPE


def _unit(dim: Dim, value: Any) -> float:
    return (float(value) - dim.low) / (dim.high - dim.low) if dim.high > dim.low else 0.5


class TPE:
    """The Tree-structured Parzen Estimator over a box: the observations split at the best ``GAMMA`` share into
    good and bad; a Parzen window (Gaussian kernels on the unit box, bandwidth ``BANDWIDTH · m^(-1/(d+4))``, a
    wide prior kernel at the centre) models each; of ``DRAWS`` points drawn from the good model, the one with the
    highest good/bad density ratio is proposed (categorical dimensions: smoothed frequencies). With fewer than
    two observations, a uniform draw. Seeded by the search's seed, the arm and the number of observations."""

    name = "tpe"

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def propose(self, box: Box, observed: list[tuple[dict[str, Any], Trial]]) -> dict[str, Any]:
        rng = random.Random(f"tpe:{self.seed}:{box.arm}:{len(observed)}")
        if len(observed) < 2:
            return {d.name: _uniform(d, rng) for d in box.dims}
        ranked = sorted(observed, key=lambda pt: (-pt[1].score, pt[1].index))  # type: ignore[operator]
        n_good = max(1, math.ceil(GAMMA * len(ranked)))
        good, bad = [p for p, _ in ranked[:n_good]], [p for p, _ in ranked[n_good:]]
        floats = [d for d in box.dims if d.choices is None]
        width_good, width_bad = _bandwidth(len(good), len(floats)), _bandwidth(len(bad), len(floats))
        best, best_gain = None, -math.inf
        for _ in range(DRAWS):
            point: dict[str, Any] = {}
            pick = rng.randrange(len(good) + 1)  # the prior kernel is the last one
            centre = good[pick] if pick < len(good) else None
            for d in box.dims:
                if d.choices is not None:
                    point[d.name] = _draw_choice(d, good, rng)
                elif centre is None:
                    point[d.name] = _uniform(d, rng)
                else:
                    u = min(1.0, max(0.0, _unit(d, centre[d.name]) + rng.gauss(0.0, width_good)))
                    point[d.name] = d.low + u * (d.high - d.low)
            gain = _log_density(point, good, box.dims, width_good) - _log_density(point, bad, box.dims, width_bad)
            if gain > best_gain:
                best, best_gain = point, gain
        return best  # type: ignore[return-value]

    def tell(self, point: dict[str, Any], trial: Trial | None) -> None:
        """Nothing to keep: the next proposal reads every observation again."""


def _uniform(d: Dim, rng: random.Random) -> Any:
    if d.choices is not None:
        return d.choices[rng.randrange(len(d.choices))]
    return d.low + rng.random() * (d.high - d.low)


def _bandwidth(m: int, d: int) -> float:
    return min(1.0, max(0.03, BANDWIDTH * max(m, 1) ** (-1.0 / (max(d, 1) + 4))))


def _draw_choice(d: Dim, good: list[dict[str, Any]], rng: random.Random) -> Any:
    weights = [1.0 + sum(p[d.name] == c for p in good) for c in d.choices]  # type: ignore[union-attr]
    x = rng.random() * sum(weights)
    for c, w in zip(d.choices, weights):  # type: ignore[arg-type]
        x -= w
        if x < 0:
            return c
    return d.choices[-1]  # type: ignore[index]


def _log_density(point: dict[str, Any], centres: list[dict[str, Any]], dims: list[Dim], width: float) -> float:
    """Log of the Parzen mixture at ``point``: the centres' kernels and the prior (centre 0.5, width 1), equally
    weighted; a categorical dimension contributes its smoothed frequency (the same for every kernel: counted once)."""
    frequency = [
        math.log((1.0 + sum(c[d.name] == point[d.name] for c in centres)) / (len(d.choices) + len(centres)))
        if d.choices is not None
        else 0.0
        for d in dims
    ]
    total = 0.0
    kernels = [(c, width) for c in centres] + [(None, 1.0)]
    for centre, w in kernels:
        log_k = 0.0
        for d, log_f in zip(dims, frequency):
            if d.choices is not None:
                log_k += log_f
            else:
                mu = 0.5 if centre is None else _unit(d, centre[d.name])
                z = (_unit(d, point[d.name]) - mu) / w
                log_k += -0.5 * z * z - math.log(w)
        total += math.exp(log_k)
    return math.log(total / len(kernels) + 1e-300)


# ------------------------------------------------------------------------------------------- Optuna


class OptunaProposer:
    """Ask-and-tell with an Optuna sampler: one in-memory study per arm and box (a box grown as the sampler learns:
    a new study), over the box as Optuna distributions (floats as ``FloatDistribution``, choices as
    ``CategoricalDistribution`` of their text); the arm's trials scored before (its screen, other steps) are added
    to the study as they appear, so the model sees them."""

    def __init__(self, sampler: Any) -> None:
        import optuna  # noqa: F401  (the sampler is Optuna's: it is installed)

        self.template = sampler
        self.name = f"optuna:{type(sampler).__name__}"
        self.multi = type(sampler).__name__ in MULTI_OBJECTIVE
        self.estimates = self.multi or type(sampler).__name__ in COMPLETE_ONLY  # raced trials told as complete
        self.studies: dict[tuple[Any, ...], tuple[Any, dict[str, Any], set[int]]] = {}
        self.pending: Any = None

    def _study(self, box: Box) -> tuple[Any, dict[str, Any], set[int]]:
        import optuna

        key = _box_key(box)
        if key not in self.studies:
            distributions = {
                d.name: optuna.distributions.CategoricalDistribution([str(c) for c in d.choices])
                if d.choices is not None
                else optuna.distributions.FloatDistribution(d.low, d.high)
                for d in box.dims
            }
            with quiet_optuna():  # (Optuna announces each study it creates)
                study = optuna.create_study(
                    sampler=_copy(self.template),
                    directions=["maximize", "maximize"] if self.multi else ["maximize"],
                    study_name=f"ram_live:{box.arm}",
                )
            self.studies[key] = (study, distributions, set())
        return self.studies[key]

    def _values(self, trial: Trial) -> list[float]:
        score = float(trial.score)  # type: ignore[arg-type]
        if not self.multi:
            return [score]
        return [score, min(trial.tasks.values()) if trial.tasks else score]

    def propose(self, box: Box, observed: list[tuple[dict[str, Any], Trial]]) -> dict[str, Any]:
        import optuna
        from optuna.trial import TrialState, create_trial

        study, distributions, told = self._study(box)
        for point, trial in observed:
            if trial.index in told:
                continue
            told.add(trial.index)
            params = _encode(box, point)
            if trial.complete or self.estimates:
                study.add_trial(create_trial(params=params, distributions=distributions, values=self._values(trial)))
            else:
                study.add_trial(
                    create_trial(
                        params=params,
                        distributions=distributions,
                        state=TrialState.PRUNED,
                        intermediate_values={_step(trial): float(trial.score)},  # type: ignore[arg-type]
                    )
                )
        try:
            asked = study.ask(distributions)
        except (ValueError, RuntimeError, optuna.exceptions.OptunaError) as exc:
            raise ConfigError(f"the Optuna sampler {self.name} cannot search this box: {exc}") from None
        self.pending = (_box_key(box), asked)
        return _decode(box, asked.params)

    def tell(self, point: dict[str, Any], trial: Trial | None) -> None:
        from optuna.trial import TrialState

        pending, self.pending = self.pending, None
        if pending is None:
            return
        key, asked = pending
        study, _, told = self.studies[key]
        if trial is None or trial.score is None:
            quiet_tell(study, asked, state=TrialState.FAIL)
            return
        told.add(trial.index)
        if trial.complete or self.estimates:
            quiet_tell(study, asked, self._values(trial))
        else:
            asked.report(float(trial.score), _step(trial))
            quiet_tell(study, asked, state=TrialState.PRUNED)


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna's INFO lines off while the search makes its studies; the caller's verbosity back after."""
    import optuna

    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(max(before, optuna.logging.WARNING))
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)


def quiet_tell(study: Any, *args: Any, **kwargs: Any) -> None:
    """``study.tell`` without Optuna's INFO line for each trial."""
    with quiet_optuna():
        study.tell(*args, **kwargs)


def _copy(sampler: Any) -> Any:
    """A fresh copy of ``sampler`` (its seeded state as given). One that cannot be deep-copied (NSGA-II holds a lock)
    is copied attribute by attribute: its random states and child samplers copied, what cannot be (the lock) shared."""
    try:
        return copy.deepcopy(sampler)
    except TypeError:
        clone = copy.copy(sampler)
        for name, value in vars(sampler).items():
            try:
                vars(clone)[name] = copy.deepcopy(value)
            except TypeError:
                pass
        return clone


def _box_key(box: Box) -> tuple[Any, ...]:
    """A study's key: the arm and its box's dimensions (a box grown as the sampler learns,
    :func:`~ram_live.selection.sampler_box.grown`, is a new study over the wider distributions, every point of the
    arm told to it again)."""
    return (box.arm, *((d.name, d.low, d.high, d.choices) for d in box.dims))


def _step(trial: Trial) -> int:
    """The step a raced trial's estimate is reported at: the share of the prompts it saw, in thousandths."""
    return int(round(trial.fidelity * 1000))


def _encode(box: Box, point: dict[str, Any]) -> dict[str, Any]:
    return {d.name: str(point[d.name]) if d.choices is not None else float(point[d.name]) for d in box.dims}


def _decode(box: Box, params: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for d in box.dims:
        value = params[d.name]
        out[d.name] = next(c for c in d.choices if str(c) == value) if d.choices is not None else float(value)
    return out
