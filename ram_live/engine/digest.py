"""The digest of a merge's inputs (:class:`InputsDigest`): what a :class:`~ram_live.types.RamStatistics`
``fingerprint`` is, so that counts reused with ``statistics=`` are checked against the inputs they were counted over
(a changed or swapped checkpoint changes some of them)."""

from __future__ import annotations

import ctypes
import hashlib
from typing import Any, Sequence

import torch
from torch import Tensor

from ..kernels.device.common import PLAIN_TENSORS
from ..kernels.device.edges import edge_rows, inputs_edges
from . import checks

__all__ = ["InputsDigest", "inputs_digest", "digest_update"]


class InputsDigest:
    """blake2b over the first and last 64 stored entries of every input of every tensor (per tensor: the heads of
    the base and each agent, then their tails), in the passes' order. Entries of device tensors are gathered on the
    device (a grouped pass: one launch for its tensors, :meth:`update_many`) and read once, at :meth:`hexdigest`:
    the digest costs no host sync per tensor.

    Example:
        >>> d = InputsDigest()
        >>> d.update([torch.zeros(3), torch.ones(3)])
        >>> len(d.hexdigest())
        32
    """

    def __init__(self) -> None:
        self._hash = hashlib.blake2b(digest_size=16)
        self._pending: list[Tensor] = []

    def update(self, tensors: Sequence[Tensor]) -> None:
        """Feed the edges of these flat tensors (base first, then each agent)."""
        parts = [edge_rows(t) for t in tensors]
        if len({p.device for p in parts}) > 1:
            parts = [p.cpu() for p in parts]
        gathered = torch.cat(parts, dim=1).view(-1)
        if checks.deferred_device(gathered.device):
            self._pending.append(gathered)
            return
        self._flush()
        self._hash.update(_host_bytes(gathered))

    def update_many(self, groups: Sequence[Sequence[Tensor]]) -> None:
        """:meth:`update` of each group in turn (a merged tensor's base and agents, each flattened), gathered by
        one ``torch.ops.ram_live.inputs_edges`` (one launch) where their device's checks are deferred."""
        if not groups:
            return
        at, width = groups[0][0].device, len(groups[0])
        if not checks.deferred_device(at) or any(len(g) != width or any(t.device != at for t in g) for g in groups):
            for group in groups:
                self.update([t.reshape(-1) for t in group])
            return
        self._pending.append(inputs_edges([t for group in groups for t in group], width))

    def _flush(self) -> None:
        if self._pending:
            devices = {p.device for p in self._pending}
            gathered = torch.cat(self._pending) if len(devices) == 1 else torch.cat([p.cpu() for p in self._pending])
            self._hash.update(_host_bytes(gathered))  # one device-to-host read
            self._pending = []

    def hexdigest(self) -> str:
        """The digest of everything fed so far."""
        self._flush()
        return self._hash.hexdigest()


def _host_bytes(data: Tensor) -> bytes:
    """The bytes of a flat uint8 tensor, read from the host's copy at C speed (a tensor subclass, e.g. a
    FakeTensor: through ``tolist``)."""
    host = data.cpu()
    if type(host) not in PLAIN_TENSORS or not host.is_contiguous():
        return bytes(host.tolist())
    return ctypes.string_at(host.data_ptr(), host.numel()) if host.numel() else b""


def inputs_digest() -> InputsDigest:
    """A fresh digest for :func:`digest_update` (what a :class:`RamStatistics` ``fingerprint`` is)."""
    return InputsDigest()


def digest_update(digest: InputsDigest, stream: Any) -> None:
    """Feed the first and last 64 stored entries of the base's and every agent's flat tensor of a
    :class:`~ram_live.engine.stream.DeltaStream` to ``digest``: two pages per input and tensor, read while the passes
    read them anyway."""
    digest.update([stream.base, *stream.tensors])
