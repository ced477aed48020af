"""The options of re-factoring a merged ΔW* into LoRA factors by truncated SVD, declared once: :class:`SvdOptions`.

:func:`~ram_live.peft.refactor`, :func:`~ram_live.peft.ram_merge_adapters` and
:func:`~ram_live.peft.ram_merge_adapter_files` take one as ``svd_options=``; their old keyword spellings
(``rank=8, svd="randomized"``) are funnelled into it by :meth:`SvdOptions.of`.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigError
from ..option_checks import check_choice

__all__ = ["SVD_KINDS", "SvdOptions"]

#: The values of :attr:`SvdOptions.svd`.
SVD_KINDS = ("auto", "exact", "randomized")


def _check_int(name: str, value: Any, low: int, *, optional: bool = False, meaning: str = "") -> None:
    if optional and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        what = "a positive int" if low == 1 else f"an int >= {low}" if low > -1 else "an int"
        raise ConfigError(f"{name} must be {what}{' or None' + meaning if optional else ''}, got {value!r}")


@dataclass(frozen=True)
class SvdOptions:
    """How a merged ΔW* ([out, in]) is re-factored into B [out, k] @ A [k, in] (B = U√S, A = √S Vᵀ).

    Args:
        rank: k (capped at min(out, in)); None: the largest input rank (merging adapters), or ``energy`` alone.
        energy: the smallest k whose singular values capture that fraction of ‖ΔW‖²_F, at most ``rank``;
            in (0, 1].
        svd: ``"exact"`` (``torch.linalg.svd``), ``"randomized"`` (``torch.svd_lowrank``) or ``"auto"``
            (randomized when q = k + oversample ≤ min(out, in) / 4).
        oversample: the randomized SVD's extra columns (None: max(k, 16)); >= 0.
        niter: the randomized SVD's power iterations; >= 0.
        seed: the randomized SVD's seed (per module it is mixed with the module's name when merging adapters).

    Invalid values are :class:`~ram_live.errors.ConfigError` naming the option.

    Example:
        >>> opts = SvdOptions(rank=8, svd="randomized", niter=2)
        >>> ram_merge_adapters(peft_model, ["code", "tool"], svd_options=opts)   # doctest: +SKIP
        >>> SvdOptions.of(None, rank=8) == SvdOptions(rank=8)
        True
    """

    rank: int | None = None
    energy: float | None = None
    svd: Literal["auto", "exact", "randomized"] = "auto"
    oversample: int | None = None
    niter: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        _check_int("rank", self.rank, 1, optional=True, meaning=" (the largest input rank)")
        if self.energy is not None and not (
            isinstance(self.energy, numbers.Real) and not isinstance(self.energy, bool) and 0.0 < self.energy <= 1.0
        ):
            raise ConfigError(f"energy must be in (0, 1], got {self.energy!r}")
        check_choice("svd", self.svd, SVD_KINDS)
        _check_int("oversample", self.oversample, 0, optional=True, meaning=" (max(rank, 16))")
        _check_int("niter", self.niter, 0)
        _check_int("seed", self.seed, -(2**63))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in declaration order.

        Returns:
            ``("rank", "energy", "svd", "oversample", "niter", "seed")``.
        """
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def take(cls, keywords: MutableMapping[str, Any]) -> dict[str, Any]:
        """Remove the options' keyword spellings from ``keywords``.

        Args:
            keywords: an entry point's ``**options``; the SVD options' names are popped from it.

        Returns:
            ``{name: value}`` of those popped (unchecked: pass them to :meth:`of`).
        """
        return {name: keywords.pop(name) for name in cls.names() if name in keywords}

    @classmethod
    def of(cls, options: SvdOptions | None = None, /, *, where: str = "", **keywords: Any) -> SvdOptions:
        """``options``, or the options built from the keyword spellings (``rank=8, svd="exact"``), checked.

        Args:
            options: an :class:`SvdOptions`, or None to build one from ``keywords``.
            where: the entry point, named in errors.
            **keywords: the options' keyword spellings (given only without ``options``).

        Returns:
            ``options`` itself, or ``SvdOptions(**keywords)``.

        Raises:
            ConfigError: an unknown keyword name, ``options`` not an :class:`SvdOptions`, keywords given together
                with ``options``, or an invalid value (naming the option and ``where``).
        """
        head = f"{where}: " if where else ""
        unknown = sorted(set(keywords) - set(cls.names()))
        if unknown:
            raise ConfigError(
                f"{head}unknown SVD option(s) {', '.join(map(repr, unknown))}; the SVD options are: "
                f"{', '.join(cls.names())}"
            )
        if options is None:
            return cls(**keywords)
        if not isinstance(options, SvdOptions):
            raise ConfigError(f"{head}svd_options must be an SvdOptions, got {type(options).__name__}")
        if keywords:
            raise ConfigError(
                f"{head}svd_options= is given, and {', '.join(f'{k}=' for k in sorted(keywords))} "
                "too: pass the SVD options one way (e.g. svd_options=SvdOptions(rank=8, ...))"
            )
        return options
