"""``SearchResult.plot``: scores by family, the winner and the best baseline marked (matplotlib, imported here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, Sequence

__all__ = ["plot_result", "PlottedResult"]


class PlottedResult(Protocol):
    """What the plot reads of a :class:`~ram_live.selection.SearchResult` (declared here, so this module does not
    import the result's)."""

    @property
    def scored(self) -> Sequence[Any]: ...

    @property
    def best_trial(self) -> Any: ...

    @property
    def best_baseline(self) -> Any: ...

    @property
    def best_score(self) -> float: ...

    def margin(self) -> float | None: ...


def plot_result(result: PlottedResult, path: Path) -> Path:
    """Write a PNG: one column of points per family (RAM family blue, baselines grey), the winner as a star, the
    best baseline as a diamond, and the margin between them in the title."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        from ..errors import ConfigError

        raise ConfigError(
            'SearchResult.plot needs matplotlib (in the ram-live clone: pip install -e ".[plot]")'
        ) from exc
    families = list(dict.fromkeys(t.family for t in result.scored))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(families) + 2), 4.5))
    marked = False
    for x, family in enumerate(families):
        trials = [t for t in result.scored if t.family == family]
        color = "tab:blue" if trials[0].side == "ram" else "tab:gray"
        ax.scatter([x] * len(trials), [t.score for t in trials], s=18, alpha=0.7, color=color)
        far = [t for t in trials if t.extrapolates]
        if far:
            ax.scatter(
                [x] * len(far),
                [t.score for t in far],
                s=40,
                facecolors="none",
                edgecolors="tab:red",
                label=None if marked else "extrapolates (> 2 × τ)",
            )
            marked = True
    best = result.best_trial
    ax.scatter(
        [families.index(best.family)],
        [best.score],
        marker="*",
        s=260,
        color="tab:orange",
        zorder=3,
        label=f"winner: {best.label()[:60]}",
    )
    baseline = result.best_baseline
    title = f"best {result.best_score:.4g}"
    if baseline is not None:
        ax.scatter(
            [families.index(baseline.family)],
            [baseline.score],
            marker="D",
            s=90,
            color="black",
            zorder=3,
            label=f"best baseline: {baseline.label()[:60]}",
        )
        ax.axhline(baseline.score, color="black", lw=0.8, ls=":")
        title += f"   best baseline {baseline.score:.4g}   margin {result.margin():+.4g}"
    ax.set_xticks(range(len(families)))
    ax.set_xticklabels(families, rotation=30, ha="right")
    ax.set_ylabel("score (higher is better)")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
