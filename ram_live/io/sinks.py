"""Where a merge goes: a new module, the base module in place, a state dict, or safetensors on disk.

The engine asks a sink for the destination tensor of each merged key (allocated in the base's dtype, on the
base's device) and writes into it chunk by chunk; buffers and non-float tensors are copied from the base;
tied keys are aliased. File sinks write to a temporary name and rename on success, so a failed merge leaves
nothing behind.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Mapping, Protocol

import torch
from torch import Tensor, nn

from .outputs import (
    clean_stale,
    lock,
    locked_temp_folder,
    make_folders,
    output_target as _output_target,
    publish_folder,
    remove_created,
    rename_output,
    unlock,
)
from .dtensor import local_tensor
from ..errors import ConfigError, InvalidStateError
from ..option_checks import shown
from .memory import advise_hugepages, empty
from .safetensors_io import SafetensorsWriter
from .structure import state_tensors, structure_copy
from ..types import Plan, TensorSpec

__all__ = ["Sink", "ModuleSink", "StateDictSink", "SafetensorsSink"]

#: Huge-page advice on merge outputs unless ``RAM_LIVE_HUGEPAGES=1``: it did not speed up the median merge and
#: made some 2–4 × slower (memory compaction; see :mod:`ram_live.io.memory`).
MERGE_HUGEPAGES = False


class Sink(Protocol):
    """Where merged tensors go. A sink may set ``revisable = True`` when its destinations are fresh tensors that
    stay in memory until :meth:`finish` and may be written again: then RAM+ reads its inputs once (see
    :func:`ram_live.engine.run.run_merge`). A sink class sets ``holds_outputs = True`` (in its own body: a subclass
    does not inherit it) when its destinations are the outputs themselves, kept in memory, and ``commit`` reads none
    of their values: then a device merge may write many of them in one launch after they are all taken (see
    :mod:`ram_live.engine.grouped`)."""

    def begin(self, plan: "Plan", specs: Mapping[str, TensorSpec]) -> None: ...

    def destination(self, key: str, spec: TensorSpec) -> Tensor: ...

    def commit(self, key: str) -> None: ...

    def copy_from_base(self, key: str, tensor: Tensor) -> None: ...

    def alias(self, alias: str, canonical: str) -> None: ...

    def finish(self) -> Any: ...

    def abort(self) -> None: ...


class ModuleSink:
    """A module of the base's structure. ``inplace=True`` writes into the base's own parameters; otherwise a
    structural copy is made whose parameters are fresh, uninitialised tensors (no copy of the base's weights)
    and whose buffers are copies of the base's."""

    def __init__(self, base: nn.Module, inplace: bool = False) -> None:
        self.base = base
        self.inplace = inplace
        self.module: nn.Module | None = None
        self._tensors: dict[str, Tensor] = {}

    holds_outputs = True

    def begin(self, plan: "Plan", specs: Mapping[str, TensorSpec]) -> None:
        if self.inplace:
            self.module = self.base
        else:
            memo: dict[int, Any] = {}
            for p in self.base.parameters(recurse=True):
                memo[id(p)] = nn.Parameter(
                    advise_hugepages(torch.empty_like(p), MERGE_HUGEPAGES), requires_grad=p.requires_grad
                )
            self.module = structure_copy(self.base, memo)
        self._tensors = state_tensors(self.module)[0]

    @property
    def revisable(self) -> bool:
        return not self.inplace

    def destination(self, key: str, spec: TensorSpec) -> Tensor:
        return local_tensor(self._tensors[key].detach())

    def commit(self, key: str) -> None:
        pass

    def copy_from_base(self, key: str, tensor: Tensor) -> None:
        target = local_tensor(self._tensors[key].detach())
        if not self.inplace and target.data_ptr() != tensor.data_ptr():
            target.copy_(tensor)

    def alias(self, alias: str, canonical: str) -> None:
        # the structure copy keeps a tie of one Parameter under two names; two Parameters on one storage (tied by
        # address) become two tensors, and only the canonical one was written
        target = local_tensor(self._tensors[alias].detach())
        source = local_tensor(self._tensors[canonical].detach())
        if target.data_ptr() != source.data_ptr():
            target.copy_(source)

    def finish(self) -> nn.Module:
        if self.module is None:
            raise InvalidStateError("ModuleSink.finish() before begin(), or after abort(): no merged module")
        return self.module

    def abort(self) -> None:
        self.module = None


class StateDictSink:
    """A new state dict with the base's keys, dtypes and devices (or ``device``/``dtype`` when given)."""

    revisable = True
    holds_outputs = True

    def __init__(self, device: torch.device | None = None, dtype: torch.dtype | None = None) -> None:
        self.device = device
        self.dtype = dtype
        self.out: dict[str, Tensor] = {}

    def begin(self, plan: "Plan", specs: Mapping[str, TensorSpec]) -> None:
        self.order = plan.keys

    def _dtype(self, dtype: torch.dtype) -> torch.dtype:
        return self.dtype if self.dtype is not None and dtype.is_floating_point else dtype

    def destination(self, key: str, spec: TensorSpec) -> Tensor:
        t = empty(
            spec.shape, dtype=self._dtype(spec.dtype), device=self.device or spec.device, hugepages=MERGE_HUGEPAGES
        )
        self.out[key] = t
        return t

    def commit(self, key: str) -> None:
        pass

    def copy_from_base(self, key: str, tensor: Tensor) -> None:
        self.out[key] = tensor.to(device=self.device or tensor.device, dtype=self._dtype(tensor.dtype), copy=True)

    def alias(self, alias: str, canonical: str) -> None:
        self.out[alias] = self.out[canonical]

    def finish(self) -> dict[str, Tensor]:
        return {k: self.out[k] for k in self.order}

    def abort(self) -> None:
        self.out.clear()


class SafetensorsSink:
    """Safetensors on disk: a single file when ``path`` ends in ``.safetensors``, else a folder of shards of at
    most ``max_shard_bytes`` with a ``model.safetensors.index.json`` (Hugging Face layout), plus the base
    folder's non-weight files (config, tokenizer) when ``copy_from`` is given and ``files`` (name → content:
    a live model's config, ``ram_merge.json``; the caller may add to :attr:`files` until :meth:`finish`) written
    over them; a single file holds the weights only. Tied aliases are not stored
    (as ``save_pretrained`` does). Headers are laid out first and tensors are written straight into the
    memory-mapped files, whose pages are released after each tensor; everything goes to a temporary path that is
    renamed on success. A symlink as ``path`` is followed: the output is written where it points. A failed merge
    also removes the folders the sink created for the output (empty ones only). Each file's bytes are reserved
    before it is written (a full disk is an :class:`OutOfSpaceError` before the rename, never a SIGBUS); the
    temporary folder is locked while the merge runs, and stale ones of killed merges into the same output are
    removed by the next (see :func:`ram_live.io.outputs.clean_stale`); the rename never replaces an output another
    process created meanwhile (:class:`OutputExistsError`)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_shard_bytes: int = 5 * 2**30,
        copy_from: Path | None = None,
        dtype: torch.dtype | None = None,
        metadata: dict[str, str] | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int) or max_shard_bytes < 1:
            raise ConfigError(f"max_shard_bytes must be a positive integer (bytes), got {shown(max_shard_bytes)}")
        self.path = Path(path)
        self.files: dict[str, bytes] = dict(files or {})
        self.single = self.path.suffix == ".safetensors"
        self._target = _output_target(self.path, self.single)
        self.max_shard_bytes = max_shard_bytes
        self.copy_from = copy_from
        self.dtype = dtype
        self.metadata = {"format": "pt", **(metadata or {})}
        self._tmp: Path | None = None
        self._writers: list[SafetensorsWriter] = []
        self._writer_of: dict[str, SafetensorsWriter] = {}
        self._files: list[str] = []
        self._created: list[Path] = []
        self._lock: int | None = None
        self._existed = self._target.exists()  # an empty output folder given by the user: replaced at the end

    def _dtype(self, dtype: torch.dtype) -> torch.dtype:
        return self.dtype if self.dtype is not None and dtype.is_floating_point else dtype

    def begin(self, plan: "Plan", specs: Mapping[str, TensorSpec]) -> None:
        self._created = make_folders(self._target.parent)
        clean_stale(self._target.parent, self._target.name)
        self._tmp, self._lock = locked_temp_folder(self._target.parent, self._target.name)
        shards: list[dict[str, tuple[torch.dtype, tuple[int, ...]]]] = [{}]
        size = 0
        for key in plan.merge + plan.copy:
            dtype = self._dtype(specs[key].dtype)
            nbytes = specs[key].numel * dtype.itemsize
            if shards[-1] and not self.single and size + nbytes > self.max_shard_bytes:
                shards.append({})
                size = 0
            shards[-1][key] = (dtype, specs[key].shape)
            size += nbytes
        n = len(shards)
        for i, shard in enumerate(shards):
            name = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            writer = SafetensorsWriter(self._tmp / name, shard, self.metadata, self._label(name))
            self._writers.append(writer)
            self._files.append(name)
            self._writer_of.update(dict.fromkeys(shard, writer))

    def _label(self, name: str) -> str:
        return str(self.path) if self.single else f"{self.path} ({name})"

    def destination(self, key: str, spec: TensorSpec) -> Tensor:
        return self._writer_of[key].view(key)

    def commit(self, key: str) -> None:
        self._writer_of[key].done(key)

    def release_range(self, key: str, start: int, stop: int) -> None:
        """Flat entries ``[start, stop)`` of ``key`` are written: their pages may leave resident memory."""
        self._writer_of[key].done(key, start, stop)

    def copy_from_base(self, key: str, tensor: Tensor) -> None:
        self._writer_of[key].view(key).copy_(tensor)
        self.commit(key)

    def alias(self, alias: str, canonical: str) -> None:
        pass

    def finish(self) -> Path:
        tmp = self._folder("finish")
        try:
            total = 0
            for writer in self._writers:
                writer.close()
                total += sum(e - b for b, e in writer.offsets.values())
            if self.single:
                self._rename(tmp / self._files[0])
            else:
                self._publish({k: w.path.name for k, w in self._writer_of.items()}, total)
            self._created = []  # they hold the output now
            return self.path
        finally:
            self.abort()

    def _publish(self, weight_map: Mapping[str, str], total: int) -> None:
        """Index, side files and the final rename of the temporary folder (:func:`~.outputs.publish_folder`)."""
        tmp = self._folder("publish")
        publish_folder(
            tmp,
            self._target,
            self.path,
            weight_map,
            total,
            self.copy_from,
            replace_empty=self._existed,
            files=self.files,
        )

    def _rename(self, source: Path) -> None:
        """The final rename, never over something another process created meanwhile."""
        rename_output(source, self._target, self.path)

    def _folder(self, doing: str) -> Path:
        """The temporary output folder (:class:`InvalidStateError` before ``begin``, or after ``finish``/``abort``)."""
        if self._tmp is None:
            raise InvalidStateError(
                f"{type(self).__name__} for {self.path}: cannot {doing} before begin(), or after "
                "finish() or abort() (one merge per begin)"
            )
        return self._tmp

    def abort(self) -> None:
        for writer in self._writers:
            writer.close()
        self._writers.clear()
        if self._tmp is not None and self._tmp.exists():
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp = None
        unlock(self._lock)
        self._lock = None
        self._remove_created()

    def _remove_created(self) -> None:
        """Remove the folders :meth:`begin` created for the output, deepest first, while they are empty."""
        remove_created(self._created)
        self._created = []


class DistributedSafetensorsSink(SafetensorsSink):
    """:class:`SafetensorsSink` for a merge split over ranks: every rank computes the same global shard layout,
    writes its own shards into one temporary folder, and rank 0 writes the index and renames the folder."""

    def distribute(self, dist: Any, plan: "Plan", owner: Mapping[str, int], specs: Mapping[str, TensorSpec]) -> None:
        if self.single:
            raise ConfigError("a merge split over ranks writes a folder: pass out= a folder, not a .safetensors file")
        self.dist = dist
        shards: list[tuple[int, dict[str, tuple[torch.dtype, tuple[int, ...]]]]] = []
        for rank in range(dist.world):
            size, current = 0, {}
            for key in (k for k in plan.merge + plan.copy if owner[k] == rank):
                dtype = self._dtype(specs[key].dtype)
                nbytes = specs[key].numel * dtype.itemsize
                if current and size + nbytes > self.max_shard_bytes:
                    shards.append((rank, current))
                    size, current = 0, {}
                current[key] = (dtype, specs[key].shape)
                size += nbytes
            if current:
                shards.append((rank, current))
        n = len(shards)
        self._layout = [
            (rank, f"model-{i + 1:05d}-of-{n:05d}.safetensors", shard) for i, (rank, shard) in enumerate(shards)
        ]
        self._tmp = self._target.parent / f".{self._target.name}.tmp-{dist.shared_token().zfill(14)}"
        if dist.rank == 0:
            self._created = make_folders(self._target.parent)
            clean_stale(self._target.parent, self._target.name)
            self._tmp.mkdir()
        dist.barrier()
        self._lock = lock(self._tmp)  # every rank: the folder's writers are alive while any rank runs

    def begin(self, plan: "Plan", specs: Mapping[str, TensorSpec]) -> None:
        for rank, name, shard in self._layout:
            if rank == self.dist.rank:
                writer = SafetensorsWriter(self._tmp / name, shard, self.metadata, self._label(name))
                self._writers.append(writer)
                self._writer_of.update(dict.fromkeys(shard, writer))

    def finish(self) -> Path:
        self._folder("finish")
        for writer in self._writers:
            writer.close()
        self.dist.barrier()
        if self.dist.rank == 0:
            weight_map = {k: name for _, name, shard in self._layout for k in shard}
            total = sum(_nbytes(dtype, shape) for _, _, shard in self._layout for dtype, shape in shard.values())
            self._publish(weight_map, total)  # on failure abort() removes the temporary folder
        self._writers.clear()
        self._tmp = None
        unlock(self._lock)
        self._lock = None
        self._created = []
        self.dist.barrier()
        return self.path

    def abort(self) -> None:
        for writer in self._writers:
            writer.close()
        self._writers.clear()
        if getattr(self, "dist", None) is not None and self.dist.rank == 0 and self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp = None
        unlock(self._lock)
        self._lock = None
        self._remove_created()


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    n = dtype.itemsize
    for s in shape:
        n *= s
    return n
