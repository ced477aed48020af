"""Held-out merge selection: :func:`search` merges candidates into one reused output, scores each with the user's
evaluation, and returns the :class:`SearchResult` (``merge(models, base=base, **result.best)`` reproduces the
winner). See ``docs/search.md``.

>>> result = search(agents, base=base, evaluate=held_out_score, budget=60)      # doctest: +SKIP
>>> print(result.table())                                                      # doctest: +SKIP
"""

from ..errors import SearchError
from .choice import ArbitraryChoiceWarning
from .result import EXTRAPOLATION_FAR, ExtrapolationWarning, SearchResult, Trial, from_json, to_json
from .run import search
from .space import DEFAULT_SPACE

__all__ = [
    "search",
    "SearchResult",
    "Trial",
    "SearchError",
    "ExtrapolationWarning",
    "ArbitraryChoiceWarning",
    "EXTRAPOLATION_FAR",
    "DEFAULT_SPACE",
    "from_json",
    "to_json",
]
