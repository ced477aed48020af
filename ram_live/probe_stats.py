"""The probe's counts of one agent (:class:`AgentStats`), and the layer a tensor belongs to (:func:`layer_of`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from .methods.ram.lambdas import rho


@dataclass
class AgentStats:
    """Counts of one agent over a set of entries (the whole model, or one tensor)."""

    total: int
    active: int
    unique: int
    lambdas: dict[str, float] = field(default_factory=dict)

    @property
    def shared(self) -> int:
        return self.active - self.unique

    @property
    def density(self) -> float:
        return self.active / self.total if self.total else 0.0

    @property
    def unique_share(self) -> float:
        """Of this agent's active entries, the share no other agent touched."""
        return self.unique / self.active if self.active else 0.0

    @property
    def shared_share(self) -> float:
        return self.shared / self.active if self.active else 0.0

    @property
    def rho(self) -> float:
        return rho(self.unique, self.active)

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "active": self.active,
            "density": self.density,
            "unique": self.unique,
            "shared": self.shared,
            "unique_share": self.unique_share,
            "shared_share": self.shared_share,
            "rho": json_float(self.rho),
            "lambda": {k: json_float(v) for k, v in self.lambdas.items()},
        }


def json_float(x: float) -> float | str | None:
    if math.isnan(x):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def rho_text(rho: float) -> str:
    return "inf" if rho == float("inf") else f"{rho:.3f}"


def layer_of(key: str) -> str:
    """The layer a tensor belongs to: up to its first numeric path component, else its module path."""
    match = re.match(r"^(.*?\.\d+)\.", key)
    if match:
        return match.group(1)
    return key.rsplit(".", 1)[0] if "." in key else key
