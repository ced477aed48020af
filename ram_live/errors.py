"""The library's error hierarchy: every error names the key and the agent at fault."""

from __future__ import annotations


class RamLiveError(Exception):
    """Base class of every error ram_live raises on purpose."""


class InputMismatchError(RamLiveError, ValueError):
    """Agents and base disagree: key sets, shapes, dtypes or non-float values."""

    def __init__(self, message: str, *, key: str | None = None, agent: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.agent = agent


class NonFiniteError(InputMismatchError):
    """An input holds NaN or Inf."""


class NoAgentsError(RamLiveError, ValueError):
    """`models` is empty."""


class ConfigError(RamLiveError, ValueError):
    """An unknown option, or an option with an invalid value."""


class UnknownMethodError(ConfigError):
    """A merge method name that is not in the registry."""


class MethodExistsError(RamLiveError, ValueError):
    """Registering a merge method under a name that is taken."""


class MissingBaseError(RamLiveError, TypeError):
    """The agents do not carry a base and none was passed."""


class UnsupportedInputError(RamLiveError, TypeError):
    """An input of a kind ram_live cannot read."""
