"""Task-vector snapshots of agents during training: a store on a (shared) file system, one folder per agent.

A snapshot keeps, per tensor, the agent's values at the positions where they differ from the base plus those
positions (int32 indices or a packed bitmask, whichever is smaller; all values when nearly everything changed),
in safetensors. Base + snapshot reconstructs the agent bit-exactly in its own dtype, and the size on disk is
proportional to what changed. Each snapshot has a JSON manifest, written last and atomically (temporary name,
then rename): readers trust only manifests, so a writer killed at any moment leaves no half snapshot visible.
Nothing is pickled: tensors are safetensors, everything else JSON.

Layout of a store folder::

    store.json                              {"format": "ram_live.store", "version": 2}
    _base/base.json                         the base's manifest (fingerprint, files, tensors, pieces)
    _base/base-<nonce>.p<rank>.safetensors  the base's tensors (dense)
    <agent>/<step:012d>.<run>.json          one manifest per snapshot of run <run> (<step:012d>.json: "legacy")
    <agent>/<step:012d>-<nonce>.p<rank>.safetensors

Each writer writes one run of its agent (:mod:`.runs`): a fresh run under a used name never replaces or removes
another run's snapshot, and "an agent's latest snapshot" is taken from its current (latest-started) run.

Manifests (format version 2) list every data file with its size and CRC-32; a reader checks a manifest in
full (:mod:`.manifest`) before it opens or deletes a file it names, and a file's CRC-32 before its first tensor
is used (:meth:`SnapshotStore.verify` checks everything at once). Version 1 manifests (no checksums) still
load, with an :class:`UnverifiedSnapshotWarning`. Files follow the umask.

Snapshots are :class:`~ram_live.io.sources.TensorSource` s that carry their base, so they merge straight away:

>>> store = SnapshotStore("runs/ram")                                       # doctest: +SKIP
>>> writer = store.writer("coder", base=model)        # at train start: a new run; persists (or checks) the base
>>> writer.snapshot(model, step=50)                    # every n steps: diff on the weights' device
>>> generalist = ram_merge(store.latest_all())         # any process: every agent's latest snapshot

Sharded models (DTensor parameters, e.g. Lightning's ``ModelParallelStrategy``) are stored as pieces: every rank
writes the boxes of the tensors it holds (replicas once), rank 0 writes the manifest. A reader assembles full
tensors from pieces of any layout, or reads only one box (:meth:`Snapshot.restrict`) to merge shard-wise
(``ram_merge(..., process_group=True)`` on those boxes).

The package, a module per job: :mod:`.format` (the on-disk format and names), :mod:`.manifest` (what a valid
manifest is), :mod:`.checksum` (CRC-32 over threads), :mod:`.datafiles` (data files written with their
checksum, opened and verified), :mod:`.files` (atomic writes, manifests read back, removals),
:mod:`.maintenance` (prune and gc removals), :mod:`.verify` (the store's check), :mod:`.runs` (runs listed),
:mod:`.collective` (collectives), :mod:`.local` (a process's part of a model), :mod:`.hashing` (fingerprints),
:mod:`.encoding` (change encodings), :mod:`.writer` (capture), :mod:`.committing` (part files written, the
ranks' parts gathered, manifests committed), :mod:`.reading` (the base and snapshots read back),
:mod:`.snapshot_store` (the store folder), :mod:`.shardwise` (shard-wise statistics), :mod:`.errors`.
The modules below :mod:`.snapshot_store` see the store only through the small protocols they declare
(:class:`.reading.StoreFolder`, :class:`.writer.SnapshotTarget`, :class:`.verify.CheckedStore`), so no module
of the package imports one above it. Names imported as ``X as X`` are public but, as before the split, outside
``__all__``.
"""

from __future__ import annotations

from .collective import Collective, LocalCollective, TorchCollective
from .collective import default_collective as default_collective
from .encoding import pack_bits as pack_bits
from .encoding import unpack_bits as unpack_bits
from .errors import (
    BaseMismatchError,
    CorruptSnapshotError,
    SnapshotNotFoundError,
    StoreError,
    StoreWarning,
    UnverifiedSnapshotWarning,
)
from .format import BASE_DIR as BASE_DIR
from .format import BASE_FORMAT as BASE_FORMAT
from .format import SNAPSHOT_FORMAT as SNAPSHOT_FORMAT
from .format import STORE_FORMAT as STORE_FORMAT
from .format import VERSION as VERSION
from .format import Box as Box
from .hashing import fingerprint
from .local import LocalModel, LocalTensor
from .reading import BoxSource as BoxSource
from .reading import Snapshot, SnapshotInfo, StoreBase
from .runs import RunInfo
from .shardwise import ram_statistics
from .snapshot_store import SnapshotStore
from .writer import Capture as Capture
from .verify import VerifyEntry as VerifyEntry
from .verify import VerifyReport
from .writer import SnapshotWriter

__all__ = [
    "BaseMismatchError",
    "Collective",
    "CorruptSnapshotError",
    "LocalCollective",
    "LocalModel",
    "LocalTensor",
    "RunInfo",
    "Snapshot",
    "SnapshotInfo",
    "SnapshotNotFoundError",
    "SnapshotStore",
    "SnapshotWriter",
    "StoreBase",
    "StoreError",
    "StoreWarning",
    "TorchCollective",
    "UnverifiedSnapshotWarning",
    "VerifyReport",
    "fingerprint",
    "ram_statistics",
]
