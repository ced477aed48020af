"""The integration's logic, free of verl: verl checkpoints → snapshots, snapshots → merged Hugging Face folders.

:class:`RAMVerl` is what the checkpoint callback, the ``RayPPOTrainer`` mixin and the offline command share:

>>> opts = options_from_mapping({"store": "runs/ram", "agent": "coder", "base": "Qwen2.5-0.5B"})  # doctest: +SKIP
>>> ram = RAMVerl(opts)                                                                      # doctest: +SKIP
>>> ram.snapshot("checkpoints/p/e/global_step_20", step=20)      # one rank's shard file at a time     # doctest: +SKIP
>>> ram.merge(step=20)                                  # -> merged_dir/global_step_20      # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import Tensor

from ram_live import functional as F
from ram_live.api import ram_merge
from ram_live.errors import ConfigError, RamLiveError
from ram_live.methods import Activity
from ram_live.schedule_search import save_record, search_metrics
from ram_live.sources import SafetensorsSource
from ram_live.store import LocalTensor, SnapshotStore, ram_statistics

from .checkpoint import LORA_RE, ActorCheckpoint, hf_key
from .config import RAMVerlOptions
from .optim import rank_importance
from .pieces import BaseWriter, PieceWriter

__all__ = ["DTYPE_OF", "RAMVerl", "VerlIntegrationError", "load_evaluate", "resolve_base"]

log = logging.getLogger("ram_live.verl")

DTYPE_OF = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_VERL_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
                "fp16": torch.float16, "float16": torch.float16}
_SIDE_SKIP = (".safetensors", ".safetensors.index.json", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
_CHUNK = 1 << 22


class VerlIntegrationError(RamLiveError, ValueError):
    """A verl checkpoint or setting the integration cannot use (names the file or key at fault)."""


def resolve_base(path: str) -> Path:
    """A local Hugging Face folder for ``path``: the folder itself, or a hub id already in the local cache."""
    p = Path(os.path.expanduser(path))
    if p.is_dir():
        return p
    if "://" in path:  # hdfs://... : verl's own copy (the same cache its workers use)
        try:
            from verl.utils.fs import copy_to_local

            local = Path(copy_to_local(path))
            if local.is_dir():
                return local
        except Exception:
            pass
    elif path.count("/") == 1 and not p.exists():  # a hub id, as verl's model.path may be: cached, else fetched
        try:
            from huggingface_hub import snapshot_download

            patterns = ["*.safetensors", "*.safetensors.index.json", "*.json", "*.txt", "*.model", "*.tiktoken",
                        "*.jinja"]
            try:
                return Path(snapshot_download(path, local_files_only=True, allow_patterns=patterns))
            except Exception:
                return Path(snapshot_download(path, allow_patterns=patterns))
        except Exception:
            pass
    raise ConfigError(f"ram.base: {path!r} is not a local Hugging Face model folder (nor a cached hub model); set "
                      "+ram.base=<local folder of the base model>")


def load_evaluate(path: str) -> Callable[..., Mapping[str, Any]]:
    """``fn`` of ``"pkg.module.fn"`` or ``"pkg.module:fn"``."""
    module, _, name = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"ram.evaluate={path!r}: cannot load it ({exc})") from None
    if not callable(fn):
        raise ConfigError(f"ram.evaluate={path!r} is not callable")
    return fn


def _count_active(agent: Tensor, base: Tensor, eps: float) -> int:
    a, b = agent.reshape(-1), base.reshape(-1)
    n = 0
    for s in range(0, a.numel(), _CHUNK):
        d = a[s : s + _CHUNK].float() - b[s : s + _CHUNK].float()
        n += int(torch.count_nonzero(d.abs_() > eps))
    return n


class RAMVerl:
    """Snapshots of one agent from verl's checkpoints, and merges of the latest snapshot of every agent.

    ``options``: :class:`~ram_live.integrations.verl.config.RAMVerlOptions` (validated). ``master_dtype``: the
    dtype verl trains the actor in (``actor.fsdp_config.model_dtype``; fp32 by default), when known before the
    first checkpoint: the store's base is then prepared (set or checked) right away.
    """

    def __init__(self, options: RAMVerlOptions, *, master_dtype: torch.dtype | None = None) -> None:
        self.opts = options
        self.store = SnapshotStore(options.store, durable=options.durable)
        self.base_dir = resolve_base(options.base) if options.base else None
        self.evaluate = load_evaluate(options.evaluate) if options.evaluate else None
        self.fingerprint: str | None = None
        self.dtype: torch.dtype | None = None  # the store's (and every snapshot's) dtype
        self.history: list[dict[str, float]] = []
        self.saves = 0
        self.last_snapshot_step = -1
        self.last_merge_step = -1
        self._warned_importance = False  # a checkpoint without usable optimizer state: said once
        if options.weights != "master":
            self.prepare(DTYPE_OF[options.weights])
        elif master_dtype is not None:
            self.prepare(master_dtype)

    # ------------------------------------------------------------------------------------------- base

    def _base_source(self) -> SafetensorsSource:
        if self.base_dir is None:
            raise ConfigError("ram.base is not set and the store has no base yet: pass the base model's folder")
        try:
            return SafetensorsSource(self.base_dir, "base")
        except RamLiveError as exc:
            raise ConfigError(f"ram.base={str(self.base_dir)!r}: {exc}") from None

    def prepare(self, dtype: torch.dtype) -> str:
        """Set the store's base (the base model's weights cast to ``dtype``) or check it is the store's; once."""
        if self.fingerprint is not None:
            if dtype != self.dtype:
                raise VerlIntegrationError(
                    f"{self.opts.agent}: the checkpoint holds {dtype} weights, this run's snapshots are {self.dtype}")
            return self.fingerprint
        if self.base_dir is None and self.store.has_base():
            base = self.store.base_source()
            dtypes = {base.spec(k).dtype for k in base.keys() if base.spec(k).dtype.is_floating_point}
            if dtypes != {dtype}:
                raise VerlIntegrationError(f"{self.store.root}: the store's base is {sorted(map(str, dtypes))}, the "
                                           f"snapshots would be {dtype} (ram.weights={self.opts.weights!r})")
            self.fingerprint, self.dtype = base.fingerprint, dtype
            return base.fingerprint
        src = self._base_source()
        specs = {}
        for k in src.keys():
            s = src.spec(k)
            specs[k] = (tuple(s.shape), dtype if s.dtype.is_floating_point else s.dtype)
        writer = BaseWriter(self.store, specs)
        group: dict[str, LocalTensor] = {}
        size = 0
        for k in src.keys():
            t = src.get(k)
            t = t.to(specs[k][1]) if t.dtype != specs[k][1] else t
            group[k] = LocalTensor(t, tuple(t.shape), (0,) * t.dim(), True)
            size += t.numel() * t.element_size()
            if size >= self.opts.max_part_bytes:
                writer.add(group)
                group, size = {}, 0
        if group or not writer.parts:
            writer.add(group)
        self.fingerprint = writer.finish()
        self.dtype = dtype
        return self.fingerprint

    # ------------------------------------------------------------------------------------------- snapshots

    def snapshot(self, checkpoint_dir: str | os.PathLike[str], step: int, *,
                 extra: Mapping[str, Any] | None = None) -> dict[str, float]:
        """Snapshot the actor checkpoint in ``checkpoint_dir`` (``global_step_<N>`` or its ``actor`` folder) as this
        agent's snapshot at ``step``; returns the probe numbers of this agent (``ram/<agent>/...``)."""
        t0 = time.perf_counter()
        ckpt = ActorCheckpoint(checkpoint_dir)
        first = ckpt.shards(0)
        lora = self._is_lora(first)
        dtype = self._snapshot_dtype(first, lora)
        del first  # each rank's file is mapped while it is read, then let go
        fp = self.prepare(dtype)
        base = self.store.base_source()
        specs = {k: (tuple(base.spec(k).shape), base.spec(k).dtype) for k in base.keys()}
        writer = PieceWriter(self.store, self.opts.agent, step, specs, fp, activity=self.opts.snapshot_activity,
                             eps=self.opts.snapshot_eps)
        counts = {"numel": 0, "active": 0}
        try:
            if lora:
                info = self._snapshot_lora(ckpt, writer, base, specs, counts)
            else:
                info = self._snapshot_full(ckpt, writer, base, specs, counts)
            meta = {"verl": {"weights": self.opts.weights, "dtype": str(dtype).replace("torch.", ""),
                             "checkpoint": str(ckpt.path), "global_step": int(step),
                             "world_size": ckpt.world_size, **info}}
            snap = writer.commit(extra={**meta, **(extra or {})})
        except BaseException:
            writer.abort()
            raise
        if self.opts.keep is not None:
            self.store.prune(self.opts.keep, self.opts.agent)
        self.last_snapshot_step = step
        a = self.opts.agent
        total = counts["numel"] or 1
        metrics = {
            f"ram/{a}/snapshot_step": float(step),
            f"ram/{a}/changed": snap.changed / max(snap.numel, 1),
            f"ram/{a}/active": counts["active"] / total,
            f"ram/{a}/snapshot_mb": snap.bytes / 2**20,
            f"ram/{a}/snapshot_seconds": time.perf_counter() - t0,
        }
        log.info("ram_live: %s step %s: %.4f of %d entries changed (%.4f with |τ| > %g), %.1f MB in %.1f s",
                 a, step, metrics[f"ram/{a}/changed"], snap.numel, metrics[f"ram/{a}/active"], self.opts.eps,
                 metrics[f"ram/{a}/snapshot_mb"], metrics[f"ram/{a}/snapshot_seconds"])
        return metrics

    def _is_lora(self, first: Any) -> bool:
        has = any(LORA_RE.match(k) for k in first.state)
        if self.opts.lora == "auto":
            return has
        if self.opts.lora and not has:
            raise VerlIntegrationError("ram.lora=true, but the checkpoint holds no lora_A/lora_B tensor")
        return bool(self.opts.lora)

    def _snapshot_dtype(self, first: Any, lora: bool) -> torch.dtype:
        if self.opts.weights != "master":
            return DTYPE_OF[self.opts.weights]
        if lora:  # frozen base + ΔW: the base layers' dtype as trained
            for k, t in first.boxes.items():
                if not LORA_RE.match(k) and t.tensor.dtype.is_floating_point:
                    return t.tensor.dtype
            return self.dtype or torch.float32
        for t in first.boxes.values():
            if t.tensor.dtype.is_floating_point:
                return t.tensor.dtype
        raise VerlIntegrationError("the checkpoint holds no floating-point tensor")

    def _add(self, writer: PieceWriter, group: dict[str, LocalTensor], base_group: dict[str, LocalTensor],
             importance: dict[str, Tensor] | None = None) -> None:
        if group:
            writer.add(group, base_group, {k: importance[k] for k in group} if importance is not None else None)
            group.clear()
            base_group.clear()

    def _rank_importance(self, ckpt: ActorCheckpoint, shards: Any, rank: int, stored: list[bool]
                         ) -> dict[str, Tensor] | None:
        """This rank's exp_avg_sq boxes by checkpoint key (None: none; every rank alike, else an error)."""
        if self.opts.importance != "adam":
            return None
        keys = [k for k in shards.state if k not in shards.aliases]
        shapes = {k: tuple(shards.boxes[k].tensor.shape) for k in keys}
        imp, why = rank_importance(ckpt.path, ckpt.world_size, rank, keys, shapes,
                                   bias_correction=self.opts.importance_bias_correction)
        if rank > 0 and (imp is not None) != stored[0]:
            raise VerlIntegrationError(f"{ckpt.path}: rank {rank}'s optimizer state "
                                       f"{'maps' if imp is not None else f'does not map ({why})'}, rank 0's "
                                       f"{'does' if stored[0] else 'does not'}: the optimizer files disagree")
        if rank == 0:
            stored[:] = [imp is not None]
            if imp is None and not self._warned_importance:
                self._warned_importance = True
                log.warning("ram_live: %s: snapshots without importances (%s); merges fall back to plain RAM "
                            "(ram.importance=null silences this)", self.opts.agent, why)
        if imp is not None:
            for alias, target in shards.aliases.items():
                imp[alias] = imp[target]
        return imp

    def _box_pair(self, base: Any, key: str, t: LocalTensor, counts: dict[str, int]) -> tuple[LocalTensor, LocalTensor]:
        dtype = self.dtype if t.tensor.dtype.is_floating_point else t.tensor.dtype
        data = t.tensor if t.tensor.dtype == dtype else t.tensor.to(dtype)
        b = base.get_box(key, t.offsets, tuple(data.shape))
        if data.dtype.is_floating_point:
            counts["numel"] += data.numel()
            if self.opts.activity == "abs":
                counts["active"] += _count_active(data, b, self.opts.eps)
            else:
                counts["active"] += int(torch.count_nonzero(data != b))
        return (LocalTensor(data, t.global_shape, t.offsets, True), LocalTensor(b, t.global_shape, t.offsets, True))

    def _snapshot_full(self, ckpt: ActorCheckpoint, writer: PieceWriter, base: Any,
                       specs: Mapping[str, Any], counts: dict[str, int]) -> dict[str, Any]:
        group: dict[str, LocalTensor] = {}
        base_group: dict[str, LocalTensor] = {}
        size = 0
        stored = [False]
        for rank in range(ckpt.world_size):
            shards = ckpt.shards(rank)
            imp = self._rank_importance(ckpt, shards, rank, stored)
            imp_group: dict[str, Tensor] | None = {} if imp is not None else None
            names = {}
            for key in shards.boxes:
                name = hf_key(key)
                if name not in specs:
                    raise VerlIntegrationError(
                        f"{ckpt.files[rank]}: tensor {key!r} ({name!r}) is not in the base model {self.opts.base!r}: "
                        "was this run trained from another base?")
                names[key] = name
            for alias, target in shards.aliases.items():
                name = hf_key(alias)
                if name in specs:  # the base stores the tied copy too: snapshot it from the shared tensor
                    names[alias] = name
                    shards.boxes[alias] = shards.boxes[target]
            for key, t in shards.boxes.items():
                if not t.owner:
                    continue
                pair = self._box_pair(base, names[key], t, counts)
                group[names[key]], base_group[names[key]] = pair
                if imp_group is not None and imp is not None:
                    imp_group[names[key]] = imp[key]
                size += pair[0].tensor.numel() * pair[0].tensor.element_size()
                if size >= self.opts.max_part_bytes:
                    self._add(writer, group, base_group, imp_group)
                    size = 0
            self._add(writer, group, base_group, imp_group)  # one rank's boxes never share a part with the next's
            size = 0
            del shards  # let the rank's memory map go
        return {"lora": False}

    def _snapshot_lora(self, ckpt: ActorCheckpoint, writer: PieceWriter, base: Any,
                       specs: Mapping[str, Any], counts: dict[str, int]) -> dict[str, Any]:
        from safetensors.torch import save_file

        from ram_live.peft import lora_deltas

        factors: dict[str, Tensor] = {}
        for rank in range(ckpt.world_size):
            shards = ckpt.shards(rank)
            for key, t in shards.boxes.items():
                m = LORA_RE.match(key)
                if m is None or not t.owner:
                    continue
                module = hf_key(m.group("module"))
                name = f"base_model.model.{module}.{m.group('kind')}" + (".weight" if m.group("weight") else "")
                full = factors.get(name)
                if full is None:
                    full = factors[name] = torch.zeros(t.global_shape, dtype=torch.float32)
                full[tuple(slice(o, o + n) for o, n in zip(t.offsets, t.tensor.shape))] = t.tensor.float()
            del shards
        meta = dict(ckpt.lora_meta or {})
        r = int(meta.get("r") or self.opts.lora_rank or 0)
        alpha = meta.get("lora_alpha", self.opts.lora_alpha)
        if self.opts.lora_rank is not None:
            r = self.opts.lora_rank
        if self.opts.lora_alpha is not None:
            alpha = self.opts.lora_alpha
        if not r or alpha is None:
            raise VerlIntegrationError(
                f"{ckpt.path}: a LoRA checkpoint without lora_train_meta.json; set ram.lora_rank and ram.lora_alpha "
                "(or actor_rollout_ref.model.lora_rank/lora_alpha)")
        targets = sorted({n[len("base_model.model."):].rsplit(".lora_", 1)[0].split(".")[-1] for n in factors})
        with tempfile.TemporaryDirectory(prefix="ram_live_verl_lora_") as tmp:
            save_file({k: v.contiguous() for k, v in factors.items()}, os.path.join(tmp, "adapter_model.safetensors"))
            with open(os.path.join(tmp, "adapter_config.json"), "w") as fh:
                json.dump({"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": targets,
                           "use_rslora": False, "fan_in_fan_out": False, "bias": "none"}, fh)
            deltas = lora_deltas(tmp, "verl")
        del factors
        group: dict[str, LocalTensor] = {}
        base_group: dict[str, LocalTensor] = {}
        size = 0
        touched = set()
        for module, delta in deltas.items():
            key = f"{module}.weight"
            if key not in specs:
                raise VerlIntegrationError(f"{ckpt.path}: LoRA module {module!r} has no weight {key!r} in the base")
            shape, dtype = specs[key]
            if tuple(delta.shape) != tuple(shape):
                raise VerlIntegrationError(f"{ckpt.path}: ΔW of {module!r} is {list(delta.shape)}, the base weight "
                                           f"{list(shape)}")
            b = base.get_box(key, (0,) * len(shape), shape)
            agent = (b.float() + delta).to(dtype)
            t = LocalTensor(agent, tuple(shape), (0,) * len(shape), True)
            pair = self._box_pair(base, key, t, counts)
            group[key], base_group[key] = pair
            touched.add(key)
            size += agent.numel() * agent.element_size()
            if size >= self.opts.max_part_bytes:
                self._add(writer, group, base_group)
                size = 0
        self._add(writer, group, base_group)
        writer.add_unchanged([k for k in specs if k not in touched])
        counts["numel"] += sum(math.prod(specs[k][0]) for k in specs if k not in touched
                               and specs[k][1].is_floating_point)
        return {"lora": True, "lora_rank": r, "lora_alpha": alpha, "lora_modules": len(deltas)}

    # ------------------------------------------------------------------------------------------- merging

    def _out_dtype(self) -> torch.dtype | None:
        if self.opts.merged_dtype != "auto":
            return DTYPE_OF[self.opts.merged_dtype]
        if self.base_dir is not None:
            src = self._base_source()
            for k in src.keys():
                if src.spec(k).dtype.is_floating_point:
                    return src.spec(k).dtype
        return None

    def merge(self, step: int) -> dict[str, float]:
        """Merge the latest snapshot of every agent (``ram.agents``) into ``merged_dir/global_step_<step>`` (a Hugging
        Face folder: weights, the base's config and tokenizer, and ``ram_merge.json``), evaluate it, prune old merges;
        returns the ``ram/*`` metrics."""
        if not self.opts.merged_dir:
            raise ConfigError("ram.merged_dir is not set")
        t0 = time.perf_counter()
        root = Path(self.opts.merged_dir)
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"global_step_{step}"
        building = root / f".global_step_{step}.building-{uuid.uuid4().hex[:8]}"
        snaps = self.store.latest_all(self.opts.agents)
        if not snaps:
            raise VerlIntegrationError(f"{self.store.root}: no snapshot to merge")
        o = self.opts
        searched = result = None
        try:
            if o.search is not None:  # the merge ram_live.search picks (integrations/verl/search.py)
                from ram_live.api import merge as _merge

                from .search import search_merge

                searched, result = search_merge(self, snaps, step, root)
                _, info = _merge(snaps, out=building, dtype=self._out_dtype(), return_info=True, **result.best)
            else:
                _, info = ram_merge(snaps, out=building, dtype=self._out_dtype(), variant=o.variant, r=o.r,
                                    alpha=o.alpha, eps=o.eps, activity=o.activity, rho_scope=o.rho_scope,
                                    return_info=True)
            names = list(snaps)
            if info.statistics is not None and o.rho_scope == "global":
                active, unique = info.statistics.active.tolist(), info.statistics.unique.tolist()
                total = sum(snaps[names[0]].base_source().spec(k).numel for k in _merged_keys(snaps[names[0]]))
            else:
                stats = ram_statistics(next(iter(snaps.values())).base_source(), list(snaps.values()),
                                       Activity(o.activity, o.eps))  # type: ignore[arg-type]
                active, unique, total = stats["active"].tolist(), stats["unique"].tolist(), stats["total"]
            rho = {n: F.rho(float(u), float(a)) for n, a, u in zip(names, active, unique)}
            lambdas = {} if searched else {n: F.ram_lambda(rho[n], o.variant, o.r, o.alpha) for n in names}
            if info.lambdas is not None and o.rho_scope == "global":
                lambdas.update(info.lambdas)
            density = {n: a / total if total else 0.0 for n, a in zip(names, active)}
            if self.base_dir is not None:
                for f in self.base_dir.iterdir():
                    if f.is_file() and not f.name.endswith(_SIDE_SKIP):
                        shutil.copy2(f, building / f.name)
            record = {"step": step, "agents": {n: s.step for n, s in snaps.items()}, "variant": o.variant, "r": o.r,
                      "alpha": o.alpha, "eps": o.eps, "activity": o.activity, "rho_scope": o.rho_scope,
                      "lambda": lambdas, "rho": {n: (v if math.isfinite(v) else None) for n, v in rho.items()},
                      "density": density, "weights": o.weights, "store": str(self.store.root)}
            if searched is not None:
                record.update(variant=searched["best"]["method"], search=searched)
                save_record(building / "ram_search.json", searched, result, durable=False)
            (building / "ram_merge.json").write_text(json.dumps(record, indent=1))
            if final.exists():
                old = root / f".global_step_{step}.old-{uuid.uuid4().hex[:8]}"
                os.replace(final, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(building, final)
        finally:
            if building.exists():
                shutil.rmtree(building, ignore_errors=True)
        if o.keep_merged is not None:
            self._prune_merged(root, o.keep_merged)
        metrics: dict[str, float] = {"ram/agents": float(len(snaps)), "ram/merge_seconds": time.perf_counter() - t0}
        for n, s in snaps.items():
            metrics[f"ram/{n}/snapshot_step"] = float(s.step)
            metrics[f"ram/{n}/density"] = density[n]
            metrics[f"ram/{n}/rho"] = rho[n]
            if n in lambdas:
                metrics[f"ram/{n}/lambda"] = lambdas[n]
        if searched is not None:
            metrics.update(search_metrics(searched))
        if self.evaluate is not None:
            scores = self.evaluate(str(final), step=step) or {}
            for k, v in scores.items():
                metrics[k if k.startswith("ram/") else f"ram/{k}"] = _float(v)
        self.last_merge_step = step
        self.last_merged = final
        return metrics

    @staticmethod
    def _prune_merged(root: Path, keep: int) -> None:
        found = []
        for p in root.iterdir():
            if p.is_dir() and p.name.startswith("global_step_") and p.name[12:].isdigit():
                found.append((int(p.name[12:]), p))
        for _, p in sorted(found)[: max(0, len(found) - keep)]:
            shutil.rmtree(p, ignore_errors=True)

    # ------------------------------------------------------------------------------------------- the save event

    def should_snapshot(self, save_index: int) -> bool:
        return save_index % self.opts.snapshot_every == 0

    def should_merge(self, save_index: int, last: bool) -> bool:
        return self.opts.merge_every is not None and (save_index % self.opts.merge_every == 0 or last)

    def save_index(self, global_step: int) -> int:
        """Which save this is (1-based): from ``trainer.save_freq`` when known (the same after a resume)."""
        if self.opts.save_freq:
            return max(1, math.ceil(global_step / self.opts.save_freq))
        return self.saves

    def on_save(self, global_step: int, checkpoint_dir: str | os.PathLike[str], *, last: bool = False,
                log_fn: Callable[[dict[str, float], int], None] | None = None) -> dict[str, float]:
        """What a checkpoint save triggers: a snapshot and/or a merge when due; logs and returns the metrics."""
        self.saves += 1
        index = self.save_index(global_step)
        metrics: dict[str, float] = {}
        if global_step > self.last_snapshot_step and (self.should_snapshot(index) or last):
            metrics.update(self.snapshot(checkpoint_dir, global_step))
        if global_step > self.last_merge_step and self.should_merge(index, last):
            if self.last_snapshot_step != global_step:  # merge this step's weights, not an older snapshot's
                metrics.update(self.snapshot(checkpoint_dir, global_step))
            metrics.update(self.merge(global_step))
        if metrics:
            self.history.append({"step": float(global_step), **metrics})
            if log_fn is not None:
                log_fn(metrics, global_step)
        return metrics


def _merged_keys(snap: Any) -> list[str]:
    base = snap.base_source()
    aliases = base.aliases()
    return [k for k in base.keys() if k not in aliases and base.spec(k).dtype.is_floating_point]


def _float(value: Any) -> float:
    if isinstance(value, Tensor):
        return float(value.detach().float().mean().item())
    return float(value)
