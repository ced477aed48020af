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


class OutOfSpaceError(RamLiveError, OSError):
    """The disk (or quota) is full while an output is written; raised before the output is renamed into place,
    with the temporary files removed."""


class OutputExistsError(RamLiveError, FileExistsError):
    """Another process created the output while the merge ran; it is left as it is and the merge's result is
    removed."""


class InvalidStateError(RamLiveError, RuntimeError):
    """An object used out of order, or after an earlier failure left it unusable (a sink finished twice or
    before it began, a schedule whose ``attach`` failed): the message says what to call first."""


class SearchError(RamLiveError, RuntimeError):
    """A merge search could not score a candidate: the evaluation raised (the cause is chained) or returned
    something other than a finite number. ``candidate``: the ``{"method": ..., **options}`` at fault."""

    def __init__(self, message: str, *, candidate: dict | None = None) -> None:
        super().__init__(message)
        self.candidate = candidate


class EvaluationError(RamLiveError, RuntimeError):
    """A built-in evaluation (:mod:`ram_live.evaluate`) could not score a model: a reward function raised (the
    cause is chained), returned the wrong number of rewards, NaN or a non-number, or the model could not be
    loaded. ``function``: the reward function's name; ``index``: the prompt at fault (None when not one prompt)."""

    def __init__(self, message: str, *, function: str | None = None, index: int | None = None) -> None:
        super().__init__(message)
        self.function = function
        self.index = index


class RamLiveWarning(UserWarning):
    """Base class of the warnings ram_live gives about its inputs or results (a merge still ran)."""


class DeviceKernelWarning(RamLiveWarning):
    """Triton could not build one of ram_live's device kernels on this machine: its op runs its torch
    implementation instead (the same results, slower); ``ram_live.kernels.device.common.unbuilt_kernels()``
    names them."""


class UnchangedAgentWarning(RamLiveWarning):
    """An agent of a merge changed no entry of the base (density 0, ρ = +∞): it adds nothing to the generalist,
    which is the merge of the other agents (a GRPO run whose reward was always 0 never updates its weights).
    ``agents``: the names of those agents."""

    def __init__(self, message: str, *, agents: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.agents = agents


class MergeFailedWarning(RamLiveWarning):
    """A training callback's snapshot, merge, evaluation, search or save failed after training started; under
    ``on_error="warn"`` (the default) training goes on, the failure is counted (``ram/errors``) and the next merge
    tries again. ``step``, ``agent``, ``what`` (the job that failed) and ``error`` (its one line)."""

    def __init__(
        self, message: str, *, step: int | None = None, agent: str | None = None, what: str = "", error: str = ""
    ) -> None:
        super().__init__(message)
        self.step, self.agent, self.what, self.error = step, agent, what, error
