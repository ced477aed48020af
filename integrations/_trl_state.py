"""The transformers/TRL callback's checkpoint state (an ``ExportableState``): what it writes into every checkpoint's
``trainer_state.json`` (``stateful_callbacks``) and how a resumed run finds it again, by the callback's state key."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["CallbackState"]

#: the live callback of each state key: transformers rebuilds a callback from its JSON args on resume
_LIVE: "weakref.WeakValueDictionary[str, CallbackState]" = weakref.WeakValueDictionary()


class CallbackState:
    """The ``ExportableState`` side of ``RAMTrainerCallback``: its JSON constructor arguments (``_args``), the
    schedule's state, ``history`` and the saved generalists (``saved``), under :attr:`state_key`.

    The class that mixes it in sets ``agent``, ``schedule``, ``saved``, ``_args`` and ``_restored``, and calls
    :meth:`_register_live` at the end of its ``__init__``.
    """

    agent: str
    base: Any
    evaluate: Any
    trainer: Any
    schedule: Any
    saved: list[str]
    _args: dict[str, Any]
    _restored: dict[str, Any] | None

    @property
    def state_key(self) -> str:
        """``agent@store``, the store path resolved: ``run/store`` and its absolute path are the same store."""
        return f"{self.agent}@{Path(self._args['store']).expanduser().resolve()}"

    def _register_live(self, from_checkpoint: bool) -> None:
        """Record this callback as the live one of its state key; one rebuilt by transformers from its checkpoint
        args (``from_checkpoint``, ``restore_callback_states_from_checkpoint``) takes the objects JSON cannot hold
        (``base``, ``evaluate``, the trainer, the schedule's ``evaluate`` and ``search``) from the one it replaces."""
        key = self.state_key
        live: Any = _LIVE.get(key)
        if from_checkpoint and live is not None:
            self.base, self.evaluate, self.trainer = live.base, live.evaluate, live.trainer
            self.schedule.evaluate, self.schedule.search = live.schedule.evaluate, live.schedule.search
        _LIVE[key] = self

    def state(self) -> dict[str, Any]:
        """``ExportableState``: the JSON constructor arguments and the schedule's state, ``history`` and the saved
        generalists, under this callback's :attr:`state_key`."""
        return {
            "args": {**self._args, "_from_checkpoint": True},
            "attributes": {
                "ram_state": {
                    "key": self.state_key,
                    "schedule": self.schedule.state_dict(),
                    "history": self.schedule.history,
                    "saved": list(self.saved),
                }
            },
        }

    @property
    def ram_state(self) -> dict[str, Any] | None:
        return self._restored

    @ram_state.setter
    def ram_state(self, value: dict[str, Any]) -> None:  # set by transformers' _load_callback_state
        self._load(value)

    def _load(self, value: Mapping[str, Any]) -> None:
        self.schedule.load_state_dict(value["schedule"])
        self.schedule.history[:] = [dict(h) for h in value.get("history", [])]
        self.saved = list(value.get("saved", []))
        self._restored = dict(value)

    def _find_state(self, state: Any) -> Mapping[str, Any] | None:
        """This callback's entry of the resumed checkpoint's ``stateful_callbacks`` (matched by state key)."""
        entries = (state.stateful_callbacks or {}).get(type(self).__name__)
        for entry in entries if isinstance(entries, list) else [entries] if entries else []:
            saved = (entry.get("attributes") or {}).get("ram_state")
            if saved and saved.get("key") == self.state_key:
                return saved
        return None
