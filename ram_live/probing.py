"""How the agents' task vectors look: density, shared and unique entries, ρ and λ, overlap, similarity.

It is the merge's statistics pass plus pairwise Gram matrices, per agent and per tensor.

>>> report = probe([coder, tool_agent, memory_agent], base=base_model)     # doctest: +SKIP
>>> print(report.table()); report.plot("probe.png"); report.to_dict()      # doctest: +SKIP
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch

from .kernels import probe as probe_native
from . import functional as F
from .kernels.probe import ProbeCounts
from .api import Model, Models, check_run_options, input_sources
from .engine.passes import recheck
from .engine.plan import build_plan
from .engine.reader import Reader
from .engine.digest import digest_update, inputs_digest
from .engine.stream import DEFAULT_CHUNK_NUMEL, DeltaStream
from .engine.threads import in_native_workers, native_walk, worker_count
from .errors import ConfigError
from .methods.ram.rules import RAM_METHODS
from .methods.ram.lambdas import ram_lambda, rho
from .methods.ram.method import ram_activity
from .probe_device import DeviceProbe
from .probe_stats import AgentStats, layer_of, rho_text
from .types import Activity, RamStatistics
from .methods.ram.config import RamConfig
from .methods.ram.rules import RhoClip

__all__ = ["probe", "ProbeReport", "AgentStats"]


@dataclass
class ProbeReport:
    """Per agent (``agents``), per tensor (``tensors``), pairwise (``jaccard``, ``expected_jaccard``,
    ``cosine``) statistics of the task vectors, and the histogram of the overlap count c = 0..K.

    Attributes:
        agent_names: the agents' names, in input order (the rows and columns of the pairwise matrices).
        agents: name → its :class:`AgentStats` over every merged tensor (active, unique, ρ, λ per RAM variant).
        tensors: tensor name → agent name → its :class:`AgentStats` in that tensor, in model order.
        jaccard: K×K share of entries both agents updated among those either did.
        expected_jaccard: K×K, the Jaccard index independent masks of the agents' densities would give.
        cosine: K×K cosine similarity of the whole task vectors (0 for an all-zero one).
        histogram: entries by the number of agents c = 0..K that updated them.
        activity: the rule the entries were counted with.
        r, alpha: the RAM+ λ rule's parameters the λ were computed with.
        fingerprint: a digest of the inputs, as :attr:`RamStatistics.fingerprint`.

    Example:
        >>> print(probe([coder, tool_agent], base=base_model).table())   # doctest: +SKIP
    """

    agent_names: tuple[str, ...]
    agents: dict[str, AgentStats]
    tensors: dict[str, dict[str, AgentStats]]
    jaccard: list[list[float]]
    expected_jaccard: list[list[float]]
    cosine: list[list[float]]
    histogram: list[int]
    activity: Activity
    r: float
    alpha: float
    fingerprint: str = ""  # of the inputs, as RamStatistics.fingerprint

    def statistics(self) -> RamStatistics:
        """The per-agent counts as RAM+ needs them: ``ram_merge(..., statistics=report.statistics())`` on the same
        inputs with the same activity rule skips the merge's own statistics pass (RAM+ in one pass).

        Returns:
            The :class:`RamStatistics`: active and unique counts per agent and the histogram (int64), stamped with
            the agents, activity rule, entry count and inputs' fingerprint a merge checks before taking them.
        """
        return RamStatistics(
            torch.tensor([self.agents[n].active for n in self.agent_names], dtype=torch.int64),
            torch.tensor([self.agents[n].unique for n in self.agent_names], dtype=torch.int64),
            torch.tensor(self.histogram, dtype=torch.int64),
            agents=tuple(self.agent_names),
            activity=self.activity,
            numel=next(iter(self.agents.values())).total if self.agents else 0,
            fingerprint=self.fingerprint,
        )

    def layers(self) -> dict[str, dict[str, AgentStats]]:
        """Per-tensor stats summed by layer (see :func:`layer_of`), in model order.

        Returns:
            Layer → agent name → its :class:`AgentStats` (total, active, unique; no λ) over the layer's tensors.
        """
        out: dict[str, dict[str, AgentStats]] = {}
        for key, per_agent in self.tensors.items():
            layer = out.setdefault(layer_of(key), {})
            for name, s in per_agent.items():
                acc = layer.setdefault(name, AgentStats(0, 0, 0))
                acc.total += s.total
                acc.active += s.active
                acc.unique += s.unique
        return out

    def table(self) -> str:
        """A text table: per agent, then pairwise overlap and the histogram of c.

        Returns:
            The table, lines joined by newlines (no trailing newline), for ``print``.
        """
        head = ("agent", "active", "density", "unique", "shared", "uniq%", "rho", "λ ram+", "λ ram+s")
        rows = [head] + [
            (
                name,
                f"{s.active:,}",
                f"{s.density:.2%}",
                f"{s.unique:,}",
                f"{s.shared:,}",
                f"{s.unique_share:.1%}",
                rho_text(s.rho),
                f"{s.lambdas['ram_plus']:.4f}",
                f"{s.lambdas['ram_plus_soft']:.4f}",
            )
            for name, s in ((n, self.agents[n]) for n in self.agent_names)
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]  # from the content: any ρ, any name
        lines = [
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows
        ]
        lines.insert(1, "-" * len(lines[0]))
        lines.append("")
        lines.append("pairwise: jaccard (independent masks would give) / cosine")
        for i, a in enumerate(self.agent_names):
            for j in range(i + 1, len(self.agent_names)):
                b = self.agent_names[j]
                lines.append(
                    f"  {a} ~ {b}: jaccard {self.jaccard[i][j]:.4f} ({self.expected_jaccard[i][j]:.4f})"
                    f"  cosine {self.cosine[i][j]:+.4f}"
                )
        total = sum(self.histogram)
        lines.append("entries by number of agents that updated them (c):")
        lines.append("  " + "  ".join(f"c={c}: {n:,} ({n / total:.1%})" for c, n in enumerate(self.histogram)))
        lines.append(
            f"activity rule: {self.activity.rule}"
            + (f" (eps={self.activity.eps:g})" if self.activity.rule == "abs" else "")
            + f"; RAM+ r={self.r:g} alpha={self.alpha:g}"
        )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The whole report as plain data.

        Returns:
            A JSON-able dict (``json.dumps(..., allow_nan=False)`` works; ρ = +inf is the string ``"inf"``): agents,
            tensors, layers, pairwise, histogram, activity, r, alpha.
        """
        return {
            "agents": {n: self.agents[n].to_dict() for n in self.agent_names},
            "tensors": {k: {n: s.to_dict() for n, s in v.items()} for k, v in self.tensors.items()},
            "layers": {k: {n: s.to_dict() for n, s in v.items()} for k, v in self.layers().items()},
            "pairwise": {
                "agents": list(self.agent_names),
                "jaccard": self.jaccard,
                "expected_jaccard": self.expected_jaccard,
                "cosine": self.cosine,
            },
            "histogram": self.histogram,
            "activity": {"rule": self.activity.rule, "eps": self.activity.eps},
            "r": self.r,
            "alpha": self.alpha,
        }

    def plot(self, path: str) -> str:
        """Heatmaps of per-layer density and unique share per agent, saved to ``path`` (needs the ``plot`` extra).

        Args:
            path: the image file to write (its suffix picks the format: ``.png``, ``.pdf``, ``.svg``, ...).

        Returns:
            ``path``.

        Raises:
            ImportError: matplotlib is not installed.
        """
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError('report.plot needs matplotlib: pip install -e ".[plot]" (in the ram-live clone)') from exc
        layers = self.layers()
        names = list(layers)
        density = [[layers[layer][a].density for layer in names] for a in self.agent_names]
        # a layer the agent did not touch has no unique share: blank, not 0 (which would read "all shared")
        unique = [
            [layers[layer][a].unique_share if layers[layer][a].active else math.nan for layer in names]
            for a in self.agent_names
        ]
        width = max(6.0, 0.25 * len(names) + 2)
        fig, axes = plt.subplots(2, 1, figsize=(width, 1.2 * len(self.agent_names) * 2 + 2.5), constrained_layout=True)
        for ax, data, title in (
            (axes[0], density, "density (share of entries updated)"),
            (axes[1], unique, "unique share (of the agent's updated entries)"),
        ):
            image = ax.imshow(data, aspect="auto", vmin=0.0, vmax=1.0, cmap="viridis")
            ax.set_title(title)
            ax.set_yticks(range(len(self.agent_names)), labels=list(self.agent_names))
            ax.set_xticks(range(len(names)), labels=names, rotation=90, fontsize=7)
            fig.colorbar(image, ax=ax)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path


def _lambdas(active: int, unique: int, r: float, alpha: float) -> dict[str, float]:
    value = rho(unique, active)
    return {v: ram_lambda(value, v, r, alpha) for v in RAM_METHODS}


def _torch_counts(stream: DeltaStream, k: int) -> ProbeCounts:
    """One tensor's counts by torch ops, chunk by chunk (the Gram matrix from the raw task vectors, in float64:
    the products of float32 entries exact, a float32 matmul's rounding would depend on the CPU's kernels)."""
    counts = ProbeCounts.zeros(k)
    gram = torch.zeros(k, k, dtype=torch.float64, device=stream.device)

    def add_gram(deltas: torch.Tensor) -> None:
        wide = deltas.double()
        gram.add_(wide @ wide.T)

    stream.raw_hook = add_gram
    for _, _, deltas in stream:
        mask = F.activity_mask(deltas).to(deltas.dtype)  # deltas the stream thresholded by the activity rule
        counts.inter += (mask @ mask.T).cpu().long()  # float32 counts: exact below 2^24 entries a chunk
        a, u, h = F.ram_statistics(deltas)
        counts.active += a.cpu()
        counts.unique += u.cpu()
        counts.histogram += h.cpu()
    counts.gram += gram.cpu()
    return counts


def _native_counts(stream: DeltaStream, k: int, activity: Activity, workers: int) -> ProbeCounts | None:
    """One tensor's counts by the native kernel (see :mod:`ram_live.kernels.probe`), its ranges shared by
    ``workers`` threads; None where the kernel does not apply (the torch path runs)."""
    kernel = probe_native.kernel()
    if kernel is None or not probe_native.supports(stream.base, stream.tensors):
        return None
    eps = activity.threshold

    def job(worker: int, n_workers: int) -> tuple[ProbeCounts, int]:
        counts = ProbeCounts.zeros(k)
        bad = native_walk(
            stream,
            worker,
            n_workers,
            lambda start, end: kernel.probe(stream.base, stream.tensors, eps, start, end, counts),
        )
        return counts, bad

    results = in_native_workers(stream, workers, job)
    if any(bad for _, bad in results):
        for _ in stream:  # the torch path's check names the chunk's first non-finite input, as without the kernel
            pass
        stream.raise_nonfinite(0, stream.numel)
    return functools.reduce(ProbeCounts.add_, (counts for counts, _ in results))


#: The RAM options the probe reads (ρ and λ per variant need ``r``/``alpha``; counting needs ``eps``/``activity``).
PROBE_OPTIONS = ("r", "alpha", "eps", "activity")


def probe(
    models: Models,
    base: Model | None = None,
    *,
    config: RamConfig | None = None,
    device: str | torch.device | None = None,
    chunk_numel: int = DEFAULT_CHUNK_NUMEL,
    workers: int | None = None,
    **ram_options: Any,
) -> ProbeReport:
    """Statistics of the agents' task vectors against ``base`` (same inputs as :func:`ram_live.ram_merge`).
    On CPU, float32/bfloat16 inputs go through a native kernel (``workers`` threads, default as the merge's),
    other inputs through torch ops; both give the same counts.

    Args:
        config: a :class:`~ram_live.RamConfig`; the probe reads ``eps`` and ``activity`` (the activity rule) and
            its λ rule's ``r``, ``alpha`` where it has them (the λ it reports per method; else the defaults).
        ram_options: :data:`PROBE_OPTIONS` as keywords (``eps=0.0, r=0.2``), instead of ``config``.

    Returns:
        The :class:`ProbeReport`.

    Raises:
        ConfigError: an option that does not change a probe, ``config`` with keywords, or an invalid value.

    >>> report = probe({"coder": coder, "tools": tool_agent}, base=base_model)   # doctest: +SKIP
    >>> report.agents["coder"].rho, report.agents["coder"].lambdas["ram_plus"]    # doctest: +SKIP
    """
    unread = sorted(set(ram_options) - set(PROBE_OPTIONS))
    if unread:
        raise ConfigError(
            f"probe: option(s) {', '.join(map(repr, unread))} do not change a probe; it reads "
            f"{', '.join(PROBE_OPTIONS)} (or config=RamConfig(...))"
        )
    if config is not None and ram_options:
        raise ConfigError("probe: give config= or the options as keywords, not both")
    if config is not None and not isinstance(config, RamConfig):
        raise ConfigError(f"probe: config must be a RamConfig, got {type(config).__name__}")
    if config is None:
        lam = RhoClip(**{k: ram_options[k] for k in ("r", "alpha") if k in ram_options})
        config = RamConfig(lam=lam, **{k: ram_options[k] for k in ("eps", "activity") if k in ram_options})
    defaults = RhoClip()
    r, alpha = getattr(config.lam, "r", defaults.r), getattr(config.lam, "alpha", defaults.alpha)
    dev = check_run_options(device, chunk_numel, workers)
    rule = ram_activity(config)
    agents, base_src = input_sources(models, base)
    plan = build_plan(base_src, agents)
    reader = Reader(base_src, agents, dev)
    k = len(agents)
    names = reader.names
    totals = ProbeCounts.zeros(k)
    digest = inputs_digest()
    tensors: dict[str, dict[str, AgentStats]] = {}
    workspace: dict[Any, torch.Tensor] = {}
    device_probe = DeviceProbe(plan.merge, k)
    per_tensor: dict[str, tuple[list[int], list[int]]] = {}  # active and unique per agent
    numels: dict[str, int] = {}
    for index, key in enumerate(plan.merge):
        base_t, agent_ts, dev = reader.read(key)
        stream = DeltaStream(key, base_t, agent_ts, names, dev, chunk_numel, rule, workspace)
        digest_update(digest, stream)
        numels[key] = stream.numel
        if stream.device_eps(rule) is not None:  # counted on the device, read once after the loop
            device_probe.add(index, stream)
            continue
        counts = _native_counts(stream, k, rule, worker_count(workers, dev))
        counts = counts if counts is not None else _torch_counts(stream, k)
        totals.add_(counts)
        per_tensor[key] = (counts.active.tolist(), counts.unique.tolist())
    rows, on_device = device_probe.finish(lambda key: recheck(reader, key, rule, chunk_numel))
    per_tensor.update(rows)
    totals.add_(on_device)
    for key in plan.merge:
        active, unique = per_tensor[key]
        tensors[key] = {
            n: AgentStats(numels[key], a, u, _lambdas(a, u, r, alpha)) for n, a, u in zip(names, active, unique)
        }
    total = sum(next(iter(v.values())).total for v in tensors.values()) if tensors else 0
    per_agent: dict[str, AgentStats] = {}
    for n in names:
        a = sum(t[n].active for t in tensors.values())
        u = sum(t[n].unique for t in tensors.values())
        per_agent[n] = AgentStats(total, a, u, _lambdas(a, u, r, alpha))
    densities = [per_agent[n].density for n in names]
    jaccard = [[0.0] * k for _ in range(k)]
    expected = [[0.0] * k for _ in range(k)]
    cosine = [[0.0] * k for _ in range(k)]
    inter, dots = totals.inter, totals.gram
    for i in range(k):
        for j in range(k):
            union = float(inter[i, i] + inter[j, j] - inter[i, j])
            jaccard[i][j] = float(inter[i, j]) / union if union else 0.0
            pi, pj = densities[i], densities[j]
            denominator = pi + pj - pi * pj
            expected[i][j] = (pi * pj / denominator if denominator else 0.0) if i != j else (1.0 if pi else 0.0)
            norm = math.sqrt(float(dots[i, i]) * float(dots[j, j]))
            cosine[i][j] = float(dots[i, j]) / norm if norm else 0.0
    return ProbeReport(
        names,
        per_agent,
        tensors,
        jaccard,
        expected,
        cosine,
        totals.histogram.tolist(),
        rule,
        r,
        alpha,
        digest.hexdigest(),
    )
