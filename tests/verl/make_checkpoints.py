"""Genuine verl checkpoints for the tests, written the way verl's FSDP2 actor writes them.

    torchrun --standalone --nproc-per-node 2 tests/verl/make_checkpoints.py BASE ROOT STORE REF

Each agent is the tiny Qwen2 base loaded in fp32 (verl's actor model_dtype), sharded with verl's own
``apply_fsdp2`` (mixed precision bf16 params / fp32 reduce, as verl configures it) on a 1-D ``fsdp`` mesh of the
gloo group, trained by AdamW steps whose gradients are masked to a few percent of the entries (sparse, RL-like
updates; the masks differ per agent), and saved by verl's ``FSDPCheckpointManager`` into
``ROOT/<agent>/global_step_<N>/actor``. ``coder`` keeps one checkpoint (``max_ckpt_to_keep=1``: each save deletes
the previous one) and runs the RAM checkpoint callback on rank 0 after each save, as verl's driver would. ``lora``
trains a PEFT LoRA adapter. ``REF`` receives the all-gathered fp32 weights (DTensor.full_tensor) of each save.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from types import SimpleNamespace

import torch
import torch.distributed as dist

AGENTS = {
    "coder": {"steps": 2, "keep": 1, "seed": 1, "density": 0.05, "callback": True},
    "tools": {"steps": 2, "keep": None, "seed": 2, "density": 0.05},
    "lora": {"steps": 1, "keep": None, "seed": 3, "lora": True},
}


def main(base: str, root: str, store: str, ref: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from omegaconf import OmegaConf
    from safetensors.torch import save_file
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.fsdp_utils import MixedPrecisionPolicy, apply_fsdp2

    torch.set_num_threads(1)
    # verl's create_device_mesh(world_size, fsdp_size=-1) is this mesh on the accelerator; on CPU it is built here
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fsdp",))
    tokenizer = AutoTokenizer.from_pretrained(base)
    for agent, spec in AGENTS.items():
        model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
        if spec.get("lora"):
            from peft import LoraConfig, TaskType, get_peft_model

            model.enable_input_require_grads()
            model = get_peft_model(
                model,
                LoraConfig(
                    task_type=TaskType.CAUSAL_LM, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], bias="none"
                ),
            )
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=True)
        apply_fsdp2(
            model,
            {"mesh": mesh, "mp_policy": mp, "offload_policy": None, "reshard_after_forward": True},
            OmegaConf.create({}),
        )
        params = [p for p in model.parameters() if p.requires_grad]
        optim = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
        manager = FSDPCheckpointManager(
            model,
            optim,
            None,
            processing_class=tokenizer,
            checkpoint_config=OmegaConf.create({"save_contents": ["model", "optimizer", "extra"]}),
        )
        callback = None
        if spec.get("callback") and rank == 0:  # the driver builds it at start-up, from the run's config
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback
            from verl_helpers import compose, run_overrides

            config = compose(
                run_overrides(base, os.path.join(root, agent), store, agent, "trainer.max_actor_ckpt_to_keep=1")
            )
            callback = build_checkpoint_callback(config)
        gen = torch.Generator().manual_seed(1000 + spec["seed"])
        for step in range(1, spec["steps"] + 1):
            ids = torch.randint(0, 250, (2, 24), generator=gen)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            if spec.get("density"):
                for name, p in model.named_parameters():
                    if p.grad is None:
                        continue
                    local = p.grad._local_tensor if hasattr(p.grad, "_local_tensor") else p.grad
                    g = torch.Generator().manual_seed(zlib.crc32(f"{spec['seed']}/{step}/{rank}/{name}".encode()))
                    local.mul_(torch.rand(local.shape, generator=g) < spec["density"])
            optim.step()
            optim.zero_grad(set_to_none=True)
            folder = os.path.join(root, agent, f"global_step_{step}", "actor")
            manager.save_checkpoint(folder, global_step=step, max_ckpt_to_keep=spec["keep"])
            full = {
                k: v.full_tensor().detach().clone() if hasattr(v, "full_tensor") else v.detach().clone()
                for k, v in model.state_dict().items()
            }
            if rank == 0:
                save_file(
                    {k: v.contiguous() for k, v in full.items()}, os.path.join(ref, f"{agent}_{step}.safetensors")
                )
            # Adam's second moments all-gathered, by parameter name: the reference of the stored importances
            moments = {
                n: (lambda v: v.full_tensor() if hasattr(v, "full_tensor") else v)(optim.state[p]["exp_avg_sq"])
                .detach()
                .clone()
                for n, p in model.named_parameters()
                if p in optim.state
            }
            if rank == 0:
                save_file(
                    {k: v.contiguous() for k, v in moments.items()},
                    os.path.join(ref, f"{agent}_{step}_exp_avg_sq.safetensors"),
                )
            dist.barrier()
            if callback is not None:
                trainer = SimpleNamespace(global_steps=step, total_training_steps=spec["steps"], logger=None)
                callback.on_save(
                    trainer=trainer,
                    global_step=step,
                    checkpoint_dir=os.path.join(root, agent, f"global_step_{step}"),
                    async_save=False,
                )
            dist.barrier()
        if callback is not None:
            with open(os.path.join(ref, f"{agent}_callback.json"), "w") as fh:
                json.dump(callback.history, fh)
        del model, optim, manager
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:5])
