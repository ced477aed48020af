"""A LoRA (PEFT) agent's schedule, for :class:`~ram_live.integrations.transformers.RAMTrainerCallback`: its
snapshots are the trained adapter's A and B factors (a store whose base is all zeros, so a snapshot is the adapter
itself: adapter-sized on disk), its merges are :mod:`ram_live.peft`'s ΔW-space merge of every agent's latest
adapter, re-factored into a new adapter (or folded into the base weights with ``into_base=True``), and its
generalist is swapped into the live ``PeftModel`` for evaluation and saved as a PEFT folder (or a model folder).
The snapshots' metadata and the checks against the store's other agents are :mod:`._lora_store`'s.

Every agent of one store must train an adapter of the same target modules and ranks on the same base model (its
fingerprint is kept with every snapshot); anything else is an error naming the agent and the module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError, RamLiveError
from ..peft.factors import AdapterSet, Factor, weight_key
from ..peft.merging import finish_report, merge_in_delta_space, merge_into_base, prepare_merge
from ..peft.refactoring import Refactored, make_refactorer
from ..peft.report import AdapterMergeReport
from ..peft.sparsify import RelativeThreshold, TopK, sparsify_rule
from ..peft.svd_options import SvdOptions
from ..store import BaseMismatchError, LocalModel, fingerprint
from ..training.failures import agreeing
from ..training.schedule import MergeResult, RAMSchedule
from ..training.tensors import _open_latest, swap_tensors
from ._common import place_new
from ._lora_store import EXTRA_KEY, adapter_set, base_state, check_store, snapshot_meta

__all__ = ["LoraMergeResult", "LoraSchedule", "is_peft_model", "lora_options"]


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a PEFT ``PeftModel`` (checked without importing ``peft``)."""
    return hasattr(model, "peft_config") and hasattr(model, "base_model") and hasattr(model, "active_adapter")


def lora_options(sparsify: Any, into_base: Any, svd_options: Any, variant: str) -> dict[str, Any]:
    """The LoRA options checked (a :class:`ConfigError` naming the option), as JSON-able values: ``sparsify``
    (``"auto"``, None, ``"topk"``, ``"relative"``, ``[kind, value]``), ``into_base``, ``svd_options`` (a dict)."""
    if isinstance(sparsify, list):  # the JSON form of ("topk", density), as a checkpoint's arguments hold it
        sparsify = tuple(sparsify)
    rule = sparsify_rule(sparsify, variant)
    if not isinstance(into_base, bool):
        raise ConfigError(f"into_base must be a bool, got {into_base!r}")
    if isinstance(svd_options, Mapping):
        svd_options = SvdOptions.of(None, where="svd_options", **svd_options)
    svd = SvdOptions.of(svd_options, where="RAMTrainerCallback")
    spelled = (
        ["topk", rule.density]
        if isinstance(rule, TopK)
        else ["relative", rule.threshold]
        if isinstance(rule, RelativeThreshold)
        else None
    )
    return {
        "sparsify": "auto" if sparsify == "auto" else spelled,
        "into_base": into_base,
        "svd_options": dataclasses.asdict(svd),
    }


@dataclass
class LoraMergeResult(MergeResult):
    """A LoRA merge: ``tensors`` are the new adapter's factors (``<module>.lora_A`` [k, in], ``<module>.lora_B``
    [out, k], scaling 1), or with ``into_base`` the merged base weights (``<module>.weight``);
    ``adapters`` the merged adapters, ``factors`` the re-factored modules, ``report`` the adapter merge's."""

    adapters: AdapterSet | None = None
    factors: dict[str, Refactored] = dataclasses.field(default_factory=dict)
    report: AdapterMergeReport | None = None

    def metrics(self, prefix: str = "ram/") -> dict[str, float]:
        """The probe numbers, and ``refactor_error`` (‖ΔW* − B'A'‖ / ‖ΔW*‖ over the adapter) if re-factored."""
        out = super().metrics(prefix)
        if self.factors and self.report is not None:
            out[f"{prefix}refactor_error"] = self.report.error
        return out


class LoraSchedule(RAMSchedule):
    """:class:`~ram_live.RAMSchedule` for a ``PeftModel`` whose active LoRA adapter is trained.

    Args:
        store, agent, **options: as :class:`~ram_live.RAMSchedule` (``snapshot_activity="abs"`` is refused: a
            threshold on A/B entries is not one on ΔW); ``search``: each merge the one the adapter search picks
            (:mod:`._lora_search`: its activity rule and, re-factored, its rank searched).
        sparsify: the activity rule for the dense ΔW, as in :func:`ram_live.peft.ram_merge_adapters`
            (``"auto"``: ``TopK(0.5)`` for the RAM family; ``TopK(d)``, ``RelativeThreshold(t)``, None, ...);
            with a rule, ``eps`` is 0 unless ``ram`` sets it.
        into_base: fold the merged ΔW* into the base weights instead of re-factoring it into an adapter.
        svd_options: the re-factorisation's :class:`~ram_live.peft.SvdOptions` (default rank: the adapters').
    """

    def __init__(
        self,
        store: Any,
        agent: str,
        *,
        sparsify: Any = "auto",
        into_base: bool = False,
        svd_options: SvdOptions | Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(store, agent, **options)
        self._init_lora(lora_options(sparsify, into_base, svd_options, self.ram.method))

    @classmethod
    def adopt(
        cls, schedule: RAMSchedule, options: Mapping[str, Any], state: Mapping[str, Any] | None = None
    ) -> "LoraSchedule":
        """This schedule's options, counters and history as a LoRA schedule (``options``: :func:`lora_options`;
        ``state``: a :meth:`state_dict` to load, e.g. the one a checkpoint restored into ``schedule``)."""
        new = cls.__new__(cls)
        new.__dict__.update(schedule.__dict__)
        new._init_lora(options)
        if state is not None:
            new.load_state_dict(state)
        return new

    def _init_lora(self, options: Mapping[str, Any]) -> None:
        who = f"RAMTrainerCallback({self.agent!r})"
        if self.search is not None and options["into_base"]:
            from ._lora_search import check_into_base_space

            check_into_base_space(self.search, who)
        if self.snapshot_activity != "changed":
            raise ConfigError(
                f"{who}: snapshot_activity='abs' would threshold the A/B factors, not ΔW; LoRA runs "
                "snapshot losslessly and pick the active ΔW entries with sparsify="
            )
        sparsify = options["sparsify"]
        self.sparsify = tuple(sparsify) if isinstance(sparsify, list) else sparsify
        self.into_base = bool(options["into_base"])
        self.svd_options = SvdOptions(**options["svd_options"])
        self.importance_from = None  # the ΔW-space merge weighs no importances
        self.importance = None
        self.adapter: str | None = None
        self.model_fingerprint: str | None = None  # of the base model the adapter is trained on
        self._factors: dict[str, Factor] = {}
        self._layers: dict[str, Any] = {}
        self._meta: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------- set-up

    def attach(self, model: Any, base: Any = None, *, collective: Any = None) -> str:
        """Read the live adapter's factors (the model's active adapter), fingerprint its base model, check both
        against the store's other agents and take the all-zero base. Returns the store base's fingerprint."""
        from ..peft.live import active_adapter, read_live, tuner_of

        who = f"RAMTrainerCallback({self.agent!r})"
        if base is not None:
            raise ConfigError(f"{who}: base= is for full-model runs; a LoRA run's base is its PeftModel's base model")
        try:
            adapter = active_adapter(model)
            factors = read_live(model, [adapter]).factors[adapter]
        except RamLiveError as exc:  # the adapter's own errors (DoRA, bias, layer types), with the agent named
            exc.args = (f"agent {self.agent!r}: {exc.args[0]}", *exc.args[1:])
            raise
        _, root = tuner_of(model)
        self.adapter, self._factors = adapter, factors
        self._layers = {m: root.get_submodule(m) for m in factors}
        live = self._live()
        if LocalModel.from_obj(live).sharded:
            raise ConfigError(f"{who}: sharded (DTensor) LoRA factors are not supported")
        fp = fingerprint(base_state(root))
        if self.model_fingerprint is not None and fp != self.model_fingerprint:
            raise BaseMismatchError(
                f"{who}: the PeftModel's base model ({fp}) is not the one this run was trained "
                f"on ({self.model_fingerprint})"
            )
        self.model_fingerprint = fp
        self._meta = snapshot_meta(adapter, fp, factors, model.peft_config[adapter])
        check_store(self.store, self.agent, live, fp)
        rank = self.svd_options.rank or max(f.rank for f in factors.values())
        small = min(factors, key=lambda m: factors[m].rank)
        if not self.into_base and rank > factors[small].rank:
            raise ConfigError(
                f"{who}: the merged adapter's rank {rank} exceeds the live adapter's rank "
                f"{factors[small].rank} at module {small!r}, so it could not be swapped in for the "
                "evaluation: use one rank for every module, svd_options=SvdOptions(rank=...) or "
                "into_base=True"
            )
        return super().attach(live, base={k: torch.zeros_like(v) for k, v in live.items()}, collective=collective)

    def _live(self) -> dict[str, Tensor]:
        """The live factors by store key (``<module>.lora_A`` / ``.lora_B``; the parameters, not copies)."""
        out = {}
        for m, f in sorted(self._factors.items()):
            out[f"{m}.lora_A"], out[f"{m}.lora_B"] = f.A, f.B
        return out

    # ------------------------------------------------------------------------------------------- actions

    def snapshot(
        self,
        model: Any,
        step: int,
        epoch: int | None = None,
        extra: Mapping[str, Any] | None = None,
        importance: Mapping[str, Any] | None = None,
    ) -> Any:
        """Write the live adapter's A and B factors (``model``: the PeftModel; its factors are read live), with the
        scalings, config and base-model fingerprint in the manifest's ``extra["peft"]``."""
        self._require()
        return super().snapshot(self._live(), step, epoch, extra={**(extra or {}), EXTRA_KEY: self._meta})

    def merge(
        self,
        model: Any,
        step: int,
        epoch: int | None = None,
        evaluate: Callable[[Any], Mapping[str, Any]] | None = None,
    ) -> LoraMergeResult:
        """Merge the latest adapter of every agent in ΔW space (:mod:`ram_live.peft`, this run's included; taken
        now if its latest snapshot is older), re-factored into a new adapter or, ``into_base``, folded into the
        base weights of the targeted modules."""
        self._require()
        if self.snapshot_before_merge and self.last_snapshot_step < step:
            self.snapshot(model, step, epoch)
        if self.async_write:
            with agreeing(self.collective, "writing its snapshot"):  # rank 0's background write; a barrier too
                self.flush()
        t0 = time.perf_counter()
        picks, sources = _open_latest(self, LocalModel.from_obj(self._live(), name=self.agent), step)
        adapters = adapter_set(self.store, picks, sources, self._meta, self.model_fingerprint, sorted(self._factors))
        searched = None
        if self.search is not None:  # the merge the adapter search picks (._lora_search)
            from ._lora_search import lora_search

            fallback = evaluate or self.evaluate
            tensors, info, factors, report, searched = lora_search(self, model, adapters, step, fallback)
            variant = str(searched["best"]["method"])
        else:
            method, options = self.ram.flat()  # the keywords that differ from the defaults (eps: 0 with a rule)
            tensors, info, factors, report = self.merge_with(adapters, method, options, self.sparsify, self.svd_options)
            variant = self.ram.method
        names = list(picks)
        lambdas = dict(info.lambdas or ({n: 1.0 for n in names} if variant == "ram" else {}))
        self.last_merge_step = step
        self.merges += 1
        result = LoraMergeResult(
            step,
            tensors,
            picks,
            lambdas,
            dict(info.rho or {}),
            dict(report.active),
            time.perf_counter() - t0,
            variant,
            adapters=adapters,
            factors=factors,
            report=report,
        )
        if searched is not None:
            result.extra["search"] = self.last_search = searched
        return result

    def merge_with(
        self, adapters: AdapterSet, method: str, options: Mapping[str, Any], sparsify: Any, svd: SvdOptions
    ) -> tuple[dict[str, Tensor], Any, dict[str, Refactored], AdapterMergeReport]:
        """``adapters`` merged by ``method`` with ``options`` in ΔW space, as :func:`ram_live.peft.ram_merge_adapters`
        merges: re-factored with ``svd`` (the tensors: ``<module>.lora_A`` / ``.lora_B``), or, ``into_base``, folded
        into the live base weights (``<module>.weight``). Returns the tensors, the MergeInfo, the re-factored
        modules and the report."""
        prep = prepare_merge(adapters, method, options, sparsify)
        report = AdapterMergeReport(adapters.names, "base weights" if self.into_base else "adapter")
        factors: dict[str, Refactored] = {}
        with torch.no_grad():
            if self.into_base:
                base = {weight_key(m): self._layers[m].get_base_layer().weight for m in adapters.order}
                tensors, info = merge_into_base(
                    base,
                    prep,
                    inplace=False,
                    out=None,
                    device=None,
                    dtype=None,
                    max_shard_bytes=0,
                    chunk_numel=self.chunk_numel,
                )
            else:
                refactorer = make_refactorer(adapters, report, svd)
                device = next(iter(self._factors.values())).B.device  # the training device (the store's: cpu)
                info = merge_in_delta_space(adapters, prep, refactorer, device=device, chunk_numel=self.chunk_numel)
                factors = refactorer.factors
                tensors = {}
                for m, f in factors.items():
                    tensors[f"{m}.lora_A"], tensors[f"{m}.lora_B"] = f.A, f.B
            finish_report(prep, info, report, warn_dense=True)
        return tensors, info, factors, report

    # ------------------------------------------------------------------------------------------- the generalist

    @contextlib.contextmanager
    def swapped(self, model: Any, result: MergeResult) -> Iterator[Any]:
        """Within the block the live PeftModel computes the generalist: the merged adapter's factors (zero-padded
        to the live rank) with scaling 1 in the live adapter, or, ``into_base``, the merged base weights and a zero
        ``lora_B``; afterwards its own tensors and scalings, bit-exactly."""
        live: dict[str, Tensor] = {}
        values: dict[str, Tensor] = {}
        scalings: dict[str, float] = {}
        for m, f in sorted(self._factors.items()):
            if self.into_base:
                weight = self._layers[m].get_base_layer().weight
                live[f"{m}.weight"], values[f"{m}.weight"] = weight, result.tensors[weight_key(m)].to(weight.dtype)
                live[f"{m}.lora_B"], values[f"{m}.lora_B"] = f.B, torch.zeros_like(f.B)
                continue
            a, b = result.tensors[f"{m}.lora_A"], result.tensors[f"{m}.lora_B"]
            pad = f.rank - a.shape[0]
            if pad < 0:  # a searched rank above the live one: B'A' folded into the base weight for the block
                weight = self._layers[m].get_base_layer().weight
                dense = Factor(a, b, 1.0, f.kind, f.transpose).delta(weight.device)
                live[f"{m}.weight"], values[f"{m}.weight"] = weight, (weight.double() + dense).to(weight.dtype)
                live[f"{m}.lora_B"], values[f"{m}.lora_B"] = f.B, torch.zeros_like(f.B)
                continue
            live[f"{m}.lora_A"], values[f"{m}.lora_A"] = f.A, torch.nn.functional.pad(a, (0, 0, 0, pad)).to(f.A)
            live[f"{m}.lora_B"], values[f"{m}.lora_B"] = f.B, torch.nn.functional.pad(b, (0, pad)).to(f.B)
            scalings[m] = 1.0
        local = LocalModel.from_obj(live, name=self.agent)
        own = {m: self._layers[m].scaling[self.adapter] for m in scalings}
        swap_tensors(local, values)
        for m, s in scalings.items():
            self._layers[m].scaling[self.adapter] = s
        try:
            yield model
        finally:
            swap_tensors(local, values)
            for m, s in own.items():
                self._layers[m].scaling[self.adapter] = s

    def save(self, model: Any, result: LoraMergeResult, folder: Path, processor: Any = None) -> Path:
        """``folder/step-<N>``: the merged adapter as a PEFT folder (``adapter_model.safetensors`` +
        ``adapter_config.json``: ``PeftModel.from_pretrained(base_model, path)``), or with ``into_base`` the base
        model with the merged weights (``save_pretrained``: ``AutoModelForCausalLM.from_pretrained(path)``), with
        ``processor`` saved alongside; written under a temporary name, then renamed to the first free name
        (``step-<N>-v1``, ... when taken: nothing is ever replaced)."""
        from ..peft.live import tuner_of
        from ..peft.merge_files import _write_adapter_folder

        folder.mkdir(parents=True, exist_ok=True)
        stem = f"step-{result.step}"
        tmp = folder / f".tmp-{stem}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            if self.into_base:
                _, root = tuner_of(model)
                state = base_state(root)
                state.update({k: v.to(state[k].dtype) for k, v in result.tensors.items()})
                root.save_pretrained(tmp, state_dict={k: v.detach() for k, v in state.items()}, safe_serialization=True)
            else:
                assert result.adapters is not None
                _write_adapter_folder(tmp, result.adapters, result.factors, None)
            if processor is not None and hasattr(processor, "save_pretrained"):
                processor.save_pretrained(tmp)
            return place_new(tmp, folder, stem)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # ------------------------------------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """:meth:`RAMSchedule.state_dict` and ``lora``: the adapter's name and its base model's fingerprint."""
        return {**super().state_dict(), "lora": {"adapter": self.adapter, "base_fingerprint": self.model_fingerprint}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        lora = state.get("lora") or {}
        self.model_fingerprint = lora.get("base_fingerprint", self.model_fingerprint)
