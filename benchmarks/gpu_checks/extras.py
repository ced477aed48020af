"""The checks beyond the merge kernels: a PEFT adapter merge on the device, the distributed merge (NCCL on CUDA,
gloo on CPU) in spawned processes, and the test suite's ``cuda``-marked tests in a subprocess."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from gpu_checks import compare
from gpu_checks.runner import Outcome, Skip

__all__ = ["ROOT", "check_cuda_tests", "check_distributed", "check_peft"]

ROOT = Path(__file__).resolve().parents[2]
#: PEFT: the device's merged weights within this share of the largest |merged ΔW| of the CPU's (float32 LoRA
#: products summed in another order on the device: rounding only).
PEFT_RTOL = 1e-5
LLAMA = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def _peft_model() -> Any:
    """A tiny Llama (built from a config, nothing downloaded) with three LoRA adapters of random factors."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA)).eval()
    targets = ["q_proj", "v_proj", "up_proj"]
    model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False), adapter_name="code"
    )
    model.add_adapter("tool", LoraConfig(r=8, lora_alpha=8, target_modules=targets, init_lora_weights=False))
    model.add_adapter("memory", LoraConfig(r=4, lora_alpha=16, target_modules=targets[:2], init_lora_weights=False))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.mul_(0.3)
    return model.eval()


def check_peft(device: torch.device, out: Outcome) -> None:
    """``ram_merge_adapters`` on the device (a new adapter, and folded into the base) against the same on CPU."""
    import importlib.util

    missing = [m for m in ("peft", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise Skip(f"{' and '.join(missing)} not installed here (nothing is downloaded)")
    from ram_live.peft import ram_merge_adapters

    names = ["code", "tool", "memory"]
    cpu_model = _peft_model()
    base_sd = {k: v.clone() for k, v in cpu_model.get_base_model().state_dict().items()}
    dev_model = copy.deepcopy(cpu_model).to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        dev_model, rep = ram_merge_adapters(dev_model, names, "merged", return_info=True)
        out.result["adapter_seconds"] = time.perf_counter() - t0
        a_weights = [p for n, p in dev_model.named_parameters() if "lora_A.merged" in n]
        out.require(
            bool(a_weights) and all(p.device.type == device.type for p in a_weights),
            "the merged adapter's factors are not on the device",
        )
        out.result["refactor_max_error"] = rep.max_error
        out.require(rep.max_error == rep.max_error, "re-factorisation error is NaN")
        dev_plain, dev_rep = ram_merge_adapters(copy.deepcopy(dev_model), names, into_base=True, return_info=True)
        cpu_plain, cpu_rep = ram_merge_adapters(cpu_model, names, into_base=True, return_info=True)
    out.require(all(p.device.type == device.type for p in dev_plain.parameters()), "merged model left the device")
    out.result.update(lambdas=dev_rep.lambdas, active=dev_rep.active)
    out.require(dev_rep.active == cpu_rep.active, f"kept shares differ: {dev_rep.active} vs {cpu_rep.active}")
    out.require(dev_rep.lambdas == cpu_rep.lambdas, f"λ differ: {dev_rep.lambdas} vs {cpu_rep.lambdas}")
    dev_sd, cpu_sd = dev_plain.state_dict(), cpu_plain.state_dict()
    worst = 0.0
    for key, w in cpu_sd.items():
        if key in base_sd and not torch.equal(w, base_sd[key]):
            delta = (w - base_sd[key]).abs().max().item()
            worst = max(worst, (dev_sd[key].cpu() - w).abs().max().item() / max(delta, 1e-30))
    out.result["max_rel_diff"] = worst
    out.require(
        worst <= PEFT_RTOL, f"merged weights differ from the CPU's by {worst:.2e} of max |ΔW| (tolerance {PEFT_RTOL})"
    )
    untouched = [k for k in base_sd if k in dev_sd and torch.equal(cpu_sd[k], base_sd[k])]
    out.require(
        all(torch.equal(dev_sd[k].cpu(), base_sd[k]) for k in untouched),
        "a weight no adapter targets changed on the device",
    )


# ------------------------------------------------------------------------------------------------ distributed


def _inputs(folder: Path) -> list[str]:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(11)
    shapes = {
        "embed.weight": (256, 64),
        "layers.0.w": (64, 64),
        "layers.0.b": (64,),
        "layers.1.w": (96, 64),
        "head.weight": (32, 96),
    }
    base = {k: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for k, s in shapes.items()}
    save_file(base, str(folder / "base.safetensors"))
    paths = []
    for t, density in enumerate((0.05, 0.5, 0.6)):
        agent = {
            k: torch.where(
                torch.rand(v.shape, generator=g) < density,
                (v.float() + 0.01 * torch.randn(v.shape, generator=g)).to(torch.bfloat16),
                v,
            )
            for k, v in base.items()
        }
        paths.append(str(folder / f"a{t}.safetensors"))
        save_file(agent, paths[-1])
    return paths


def _rank(rank: int, world: int, store: str, backend: str, device_type: str, folder: str) -> None:
    """One rank: a split merge of the files in ``folder`` into ``folder/dist``."""
    import torch.distributed as dist

    from ram_live import merge

    if device_type == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        paths = [os.path.join(folder, f"a{t}.safetensors") for t in range(3)]
        merge(
            paths,
            base=os.path.join(folder, "base.safetensors"),
            method="ram_plus",
            out=os.path.join(folder, "dist"),
            process_group=True,
            max_shard_bytes=20_000,
            device=f"cuda:{rank}" if device_type == "cuda" else "cpu",
        )
        dist.barrier(device_ids=[rank]) if device_type == "cuda" else dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)  # gloo's static objects sometimes abort at interpreter teardown (tests/test_distributed.py)


def _spawn(world: int, backend: str, device_type: str, folder: Path, timeout: float) -> None:
    import torch.multiprocessing as mp

    ctx = mp.start_processes(
        _rank,
        args=(world, str(folder / "store"), backend, device_type, str(folder)),
        nprocs=world,
        start_method="spawn",
        join=False,
    )
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"world size {world} ({backend}) did not finish in {timeout:.0f} s")


def check_distributed(device: torch.device, out: Outcome, timeout: float) -> None:
    """The split merge under torch.distributed (NCCL on CUDA, gloo on CPU), world size 1 and, with two GPUs, 2:
    bit-equal to the single-process merge on the same device, within the tolerance of the CPU's."""
    from safetensors.torch import load_file

    from ram_live import merge

    cuda = device.type == "cuda"
    backend = "nccl" if cuda else "gloo"
    worlds = [1] + ([2] if cuda and torch.cuda.device_count() >= 2 else [])
    out.result.update(backend=backend, worlds=worlds)
    for world in worlds:
        with tempfile.TemporaryDirectory(prefix="gpu_check_dist_") as tmp:
            folder = Path(tmp)
            paths = _inputs(folder)
            t0 = time.perf_counter()
            _spawn(world, backend, device.type, folder, timeout)
            out.result[f"world{world}_seconds"] = time.perf_counter() - t0
            got: dict[str, torch.Tensor] = {}
            for shard in sorted((folder / "dist").glob("*.safetensors")):
                got.update(load_file(str(shard)))
            base = str(folder / "base.safetensors")
            single = {k: v.cpu() for k, v in merge(paths, base=base, method="ram_plus", device=device).items()}
            on_cpu = merge(paths, base=base, method="ram_plus", device="cpu")
        out.require(sorted(got) == sorted(single), f"world {world}: keys differ from the single-process merge")
        differ = sum(int(compare.ulp_distance(got[k], single[k]).max() > 0) for k in single if k in got)
        out.require(differ == 0, f"world {world}: {differ} tensors differ from the single-process merge on {device}")
        worst = max(int(compare.ulp_distance(single[k], on_cpu[k]).max()) for k in on_cpu)
        out.result[f"world{world}_vs_cpu_max_ulp"] = worst
        out.require(worst <= compare.TOLERANCE_ULP, f"{worst} ULP from the CPU merge")


# ------------------------------------------------------------------------------------------------ pytest -m cuda


#: The ``cuda``-marked tests a first run must see (about a minute with Triton's builds cold): every baseline
#: kernel's options in bfloat16 against the CPU's bits (``dtype0``; float16 and float32 are the same kernels with
#: other loads, left to ``pytest -m cuda``), TIES' thresholds, DARE's masks, a module merged on the device, and a
#: PEFT merge that stays there.
CUDA_TESTS = (
    "tests/test_methods_baseline_device_cuda.py",
    "tests/test_engine_grouped_cuda.py",
    "tests/test_api.py::test_cuda_module_merges_on_cuda",
    "tests/test_peft.py::test_cuda_merge_stays_on_the_device",
)
CUDA_DESELECTED = "not dtype1 and not dtype2"


def check_cuda_tests(device: torch.device, out: Outcome, timeout: float) -> None:
    """The first run's share of ``pytest -m cuda`` (:data:`CUDA_TESTS`), in a subprocess: every selected test
    must pass (none skipped on a CUDA host)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        raise Skip("skipped-no-device: the cuda-marked tests need a CUDA device")
    files = [t for t in CUDA_TESTS if (ROOT / t.split("::")[0]).exists()]
    out.result["files"] = files
    if not files:
        raise Skip("none of the first run's cuda-marked tests is in this tree")
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-k", CUDA_DESELECTED, "-q", "-p", "no:cacheprovider"]
    cmd += ["-rs", "-x", *files]
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        out.result["tail"] = (
            ((exc.stdout or b"")[-3000:]).decode(errors="replace")
            if isinstance(exc.stdout, bytes)
            else (exc.stdout or "")[-3000:]
        )
        out.require(False, f"pytest -m cuda did not finish in {timeout:.0f} s")
        return
    tail = (proc.stdout + proc.stderr)[-3000:]
    counts = {w: int(n) for n, w in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", tail)}
    out.result.update(returncode=proc.returncode, counts=counts, tail=tail)
    out.require(proc.returncode == 0, f"pytest -m cuda exited {proc.returncode}")
    out.require(counts.get("passed", 0) > 0, "no cuda-marked test passed")
    out.require(counts.get("skipped", 0) == 0, f"{counts.get('skipped')} cuda-marked tests skipped on a CUDA host")
