"""Run mergekit's own RAM merge, tensor by tensor, as an external oracle and speed baseline.

Run it with the benchmark-only env's python (``bash benchmarks/mergekit_env.sh`` builds it):

    benchmarks/.venv-mergekit/bin/python benchmarks/mergekit_ram_worker.py \
        --inputs DIR --out result.json [--variant ram|ramplus_tl] [--repeat 1] \
        [--save merged.safetensors] [--dtype auto|float32|bfloat16] \
        [--epsilon E] [--r R] [--alpha A]
    benchmarks/.venv-mergekit/bin/python benchmarks/mergekit_ram_worker.py --selftest

DIR holds ``base.safetensors`` and ``agent_0.safetensors`` .. ``agent_{K-1}.safetensors``, all with
the same keys and shapes. mergekit (LGPL-3.0) is only *called* here, never copied, and ram_live never
imports it: this file is meant to run in a subprocess under ``benchmarks/.venv-mergekit``.

How mergekit is called
----------------------
``mergekit.merge_methods.get(variant)`` returns the registered method object (``@merge_method``
turns ``merge`` / ``ramplus_tl_merge`` into a ``FunctionalGroupMergeMethod``). Its public,
stateless ``__call__(groups, *, parameters, dtype, out_dtype)`` is what mergekit's graph adapter
``ExecuteMergeMethodTask.execute`` ends up running (through ``_execute_resolved``) for every output
tensor. Per tensor key this worker builds ``TensorGroup.from_tensors([base, agent_0, ...],
base_index=0)`` and calls ``method([group], parameters=..., dtype=..., out_dtype=None)``.
``--path task`` instead builds mergekit's ``ExecuteMergeMethodTask`` and calls its
``execute(tensors={ModelReference: tensor})``, the exact per-tensor step of a ``mergekit-yaml`` run.
Only parameters given on the command line are passed; the others take mergekit's defaults
(reported in ``params_used``). Timing wraps only these calls (``time.perf_counter``, summed over
tensors; loading, group building and saving are excluded). With ``--repeat N`` the whole model is
merged N times and ``seconds`` is the fastest pass (``seconds_all`` lists them all).

What mergekit 0.1.5 computes (``mergekit/merge_methods/ram.py``, read from the installed source)
-------------------------------------------------------------------------------------------
0.1.5 is the first PyPI release with ``merge_methods/ram.py`` (0.1.4's wheel has no RAM method).
Both methods require a base (``InputContract(base=BasePolicy.REQUIRED)``); with no non-base
input they return the base tensor unchanged.

Shared helper ``_prepare_ram_vectors(tensors, base, epsilon)``:
  * ``task_vectors = stack([t - base for t in tensors])`` -> ``tv_flat`` of shape (K, numel):
    task vectors are computed in the *compute dtype* of the call (see "dtype" below).
  * ``nonzero_mask = tv_flat.abs() > epsilon``: absolute threshold, strict ``>``; epsilon is a
    Python float compared against a tensor of the compute dtype, so in bf16 it is effectively
    bf16(1e-5) and |tau| is the bf16-rounded difference.
  * ``contrib_counts = nonzero_mask.sum(dim=0)`` = c_i, the number of ACTIVE agents per element;
    ``overlap_mask = c_i > 1``, ``unique_mask = c_i == 1``.

``ram`` (parameter ``epsilon: float = 1e-5``; no other parameter, no global scale):
  ``tv_z = tv_flat * nonzero_mask`` (sub-threshold deltas zeroed, so they leave the sum as well
  as the count), then
  ``merged = sum_t( tv_z*unique_mask + tv_z*overlap_mask / contrib_counts.clamp(min=1) )``,
  ``result = base + merged``. Element-wise: c_i = 0 -> base; c_i = 1 -> base + tau of the one
  active agent; c_i >= 2 -> base + (1/c_i) * sum over ACTIVE agents only (each term divided by
  c_i before the sum). That is the project spec's Eq. 7 with lambda = 1.

``ramplus_tl`` (parameters ``r: float = 0.1``, ``alpha: float = 0.2``, ``epsilon: float = 1e-5``):
  per agent t and *per tensor* (tensor-local, not over the whole model):
  ``shared_counts = #(active & c >= 2)``, ``unique_counts = #(active & c == 1)``,
  ``rho = shared_counts / unique_counts.clamp(min=epsilon)`` (no unique entry -> rho =
  shared/1e-5, i.e. effectively +inf, clipped below), ``lambda = 1 + r * rho.clamp(0, alpha)``,
  so lambda <= 1 + 0.1*0.2 = 1.02 by default (the paper's RAM+ uses alpha = 2.0, i.e. up to 1.2).
  Unique elements get ``lambda_t * tau``, shared ones the same active-only mean as ``ram``.
  Note ``epsilon`` doubles as the zero-division guard in rho's denominator.

dtype: mergekit does NOT upcast on its own. ``MergeMethod.__call__`` aligns every input to
``dtype`` if given, else to ``torch.promote_types`` over the inputs (``promoted_dtype``), and the
YAML pipeline passes the config's ``dtype:`` (default None). So for bf16 checkpoints and default
settings the task vectors, masks and sums of ``ram`` are all bf16 and the result is bf16 (the
project spec requires float32 task vectors). ``ramplus_tl`` in bf16 promotes to float32 only after
the subtraction (``lambda_`` is a float32 tensor), so it returns float32 with bf16 task vectors.
``--dtype float32`` corresponds to ``dtype: float32`` in a mergekit config; ``auto`` (default here)
is mergekit's own default. ``out_dtype`` is left None: the merged tensor is returned and saved in
whatever dtype mergekit produced (``out_dtype`` in the JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Dict, List, Optional

import torch
from safetensors.torch import load_file, save_file

VARIANTS = ("ram", "ramplus_tl")
DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}


def load_inputs(inputs: Path):
    base_path = inputs / "base.safetensors"
    if not base_path.is_file():
        raise SystemExit(f"{base_path} not found")
    agents: List[Dict[str, torch.Tensor]] = []
    while (inputs / f"agent_{len(agents)}.safetensors").is_file():
        agents.append(load_file(str(inputs / f"agent_{len(agents)}.safetensors")))
    if not agents:
        raise SystemExit(f"no agent_0.safetensors in {inputs}")
    base = load_file(str(base_path))
    for k, agent in enumerate(agents):
        if agent.keys() != base.keys():
            raise SystemExit(f"agent_{k} keys differ from base keys")
        for key, t in agent.items():
            if t.shape != base[key].shape:
                raise SystemExit(f"agent_{k}[{key}] shape {tuple(t.shape)} != base {tuple(base[key].shape)}")
    return base, agents


def resolve_params(method, given: Dict[str, float]) -> Dict[str, float]:
    """mergekit's own parameter names and defaults, overridden by the ones given."""
    names = {p.name: p for p in method.spec.parameters}
    unknown = set(given) - set(names)
    if unknown:
        raise SystemExit(f"{method.spec.name} has no parameter(s) {sorted(unknown)}; it has {sorted(names)}")
    return {name: given.get(name, p.default) for name, p in names.items()}


def merge_model(
    base, agents, variant: str, given: Dict[str, float], dtype_name: str, path: str = "method", repeat: int = 1
):
    """Merge every tensor with mergekit; return (merged, seconds_per_pass, params_used)."""
    from mergekit import merge_methods
    from mergekit.merge_methods.base import TensorGroup

    method = merge_methods.get(variant)
    params_used = resolve_params(method, given)
    dtype = DTYPES[dtype_name]
    keys = sorted(base)

    if path == "method":
        groups = {
            key: TensorGroup.from_tensors([base[key]] + [a[key] for a in agents], base_index=0, name=key)
            for key in keys
        }

        def run_one(key):
            (out,) = method([groups[key]], parameters=given, dtype=dtype)
            return out
    elif path == "task":
        from mergekit.architecture import WeightInfo
        from mergekit.common import ImmutableMap, ModelReference
        from mergekit.merge_methods.task_adapter import ExecuteMergeMethodTask, TensorDictWrapper

        refs = [
            ModelReference.model_validate({"model": {"path": name}})
            for name in ["base"] + [f"agent_{k}" for k in range(len(agents))]
        ]
        tasks, tensors = {}, {}
        for key in keys:
            tasks[key] = ExecuteMergeMethodTask(
                method_name=variant,
                gather_tensors=TensorDictWrapper(tensors=ImmutableMap(data={})),
                model_order=tuple(refs),
                base_model=refs[0],
                output_weight=WeightInfo(name=key),
                # The YAML pipeline resolves defaults before building this task; do the same.
                parameters=ImmutableMap(data=dict(params_used)),
                input_parameters=ImmutableMap(data={ref: ImmutableMap(data={}) for ref in refs}),
                dtype=None if dtype is None else dtype_name,
            )
            tensors[key] = dict(zip(refs, [base[key]] + [a[key] for a in agents]))

        def run_one(key):
            return tasks[key].execute(tensors=tensors[key])
    else:
        raise SystemExit(f"unknown --path {path}")

    seconds_all = []
    merged: Dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        for _ in range(max(1, repeat)):
            total = 0.0
            for key in keys:
                t0 = time.perf_counter()
                out = run_one(key)
                total += time.perf_counter() - t0
                merged[key] = out
            seconds_all.append(total)
    return merged, seconds_all, params_used


def run(args) -> dict:
    base, agents = load_inputs(Path(args.inputs))
    given = {k: v for k, v in (("epsilon", args.epsilon), ("r", args.r), ("alpha", args.alpha)) if v is not None}
    merged, seconds_all, params_used = merge_model(
        base, agents, args.variant, given, args.dtype, path=args.path, repeat=args.repeat
    )
    result = {
        "mergekit_version": version("mergekit"),
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "variant": args.variant,
        "path": args.path,
        "compute_dtype": args.dtype
        if args.dtype != "auto"
        else "auto (promoted input dtype: "
        + ",".join(sorted({str(t.dtype).replace("torch.", "") for t in base.values()}))
        + ")",
        "out_dtype": sorted({str(t.dtype).replace("torch.", "") for t in merged.values()}),
        "seconds": min(seconds_all),
        "seconds_all": seconds_all,
        "repeat": len(seconds_all),
        "n_agents": len(agents),
        "n_tensors": len(base),
        "n_params": int(sum(t.numel() for t in base.values())),
        "params_used": params_used,
    }
    if args.save:
        save_file({k: v.contiguous() for k, v in merged.items()}, args.save)
        result["saved"] = str(args.save)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


# --------------------------------------------------------------------------- selftest


def _write_case(d: Path, base: Dict[str, torch.Tensor], agents: List[Dict[str, torch.Tensor]]):
    d.mkdir(parents=True, exist_ok=True)
    save_file(base, str(d / "base.safetensors"))
    for k, a in enumerate(agents):
        save_file(a, str(d / f"agent_{k}.safetensors"))


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def selftest(root: Path) -> bool:
    """Build tiny bf16 cases under root, run the worker on them, check hand-computed answers."""
    g = torch.Generator().manual_seed(0)
    shapes = {"w": (64, 64), "b": (128,)}
    K = 3
    ok = True
    report = []

    def check(name, cond, detail):
        nonlocal ok
        ok &= bool(cond)
        report.append(f"[{'PASS' if cond else 'FAIL'}] {name}: {detail}")

    def rand_base():
        return {k: (torch.randn(s, generator=g) * 0.05).to(torch.bfloat16) for k, s in shapes.items()}

    def delta_like(t, scale=0.01):
        return (torch.randn(t.shape, generator=g) * scale).to(torch.float32)

    def run_case(d, variant, dtype, path="method", **p):
        ns = argparse.Namespace(
            inputs=str(d),
            out=str(d / f"{variant}-{dtype}-{path}.json"),
            variant=variant,
            repeat=1,
            save=str(d / f"{variant}-{dtype}-{path}.safetensors"),
            dtype=dtype,
            path=path,
            epsilon=p.get("epsilon"),
            r=p.get("r"),
            alpha=p.get("alpha"),
        )
        res = run(ns)
        return load_file(ns.save), res

    # Case A: random dense deltas, 3 agents, shapes (64,64) and (128,): a plain end-to-end run.
    base = rand_base()
    agents = [{k: (v.float() + delta_like(v)).to(torch.bfloat16) for k, v in base.items()} for _ in range(K)]
    _write_case(root / "random", base, agents)
    for variant in VARIANTS:
        for dtype in ("auto", "float32"):
            out, res = run_case(root / "random", variant, dtype)
            check(
                f"random {variant} dtype={dtype}",
                all(out[k].shape == base[k].shape for k in base),
                f"n_tensors={res['n_tensors']} n_params={res['n_params']} out_dtype={res['out_dtype']} "
                f"seconds={res['seconds']:.6f} params={res['params_used']}",
            )
    # The graph-adapter path must agree with the direct call.
    a, _ = run_case(root / "random", "ram", "auto", path="task")
    b, _ = run_case(root / "random", "ram", "auto", path="method")
    check(
        "random ram: ExecuteMergeMethodTask.execute == method call",
        all(torch.equal(a[k], b[k]) for k in base),
        "bit-identical",
    )

    # Case B: disjoint sparse deltas -> base + sum of deltas (each agent's own value where it moved).
    base = rand_base()
    agents, expected = [], {k: v.clone() for k, v in base.items()}
    for key, v in base.items():
        perm = torch.randperm(v.numel(), generator=g)
        n = v.numel() // 10  # 10 % of entries per agent, disjoint
        for t in range(K):
            if len(agents) <= t:
                agents.append({})
            idx = perm[t * n : (t + 1) * n]
            a = v.clone().flatten()
            a[idx] = (a[idx].float() + delta_like(a[idx], 0.02)).to(torch.bfloat16)
            agents[t][key] = a.view_as(v)
            e = expected[key].flatten()
            e[idx] = a[idx]
            expected[key] = e.view_as(v)
    _write_case(root / "disjoint", base, agents)
    exp_sum = {k: base[k].float() + sum(a[k].float() - base[k].float() for a in agents) for k in base}
    for variant in VARIANTS:
        for dtype in ("auto", "float32"):
            out, _ = run_case(root / "disjoint", variant, dtype)
            d = max(_maxdiff(out[k], exp_sum[k]) for k in base)
            n_off = sum(int((out[k].float() != exp_sum[k]).sum()) for k in base)
            if dtype == "float32":
                check(
                    f"disjoint {variant} dtype={dtype} == base + sum(deltas)",
                    d == 0.0,
                    f"max|diff|={d:.3g}, mismatching elements={n_off}",
                )
            else:
                # bf16 arithmetic: tau = bf16(a - b) and b + tau may each round.
                check(
                    f"disjoint {variant} dtype={dtype} ~= base + sum(deltas) (bf16 rounding)",
                    d <= 2**-7 * max(float(base[k].abs().max()) for k in base) * 4,
                    f"max|diff|={d:.3g}, mismatching elements={n_off} of {sum(v.numel() for v in base.values())}",
                )

    # Case C: identical deltas in all agents -> base + delta (mean over active agents, not K*delta).
    base = rand_base()
    one = {k: (v.float() + delta_like(v)).to(torch.bfloat16) for k, v in base.items()}
    _write_case(root / "identical", base, [one] * K)
    for variant in VARIANTS:
        for dtype in ("auto", "float32"):
            out, _ = run_case(root / "identical", variant, dtype)
            d = max(_maxdiff(out[k], one[k]) for k in base)
            n_off = sum(int((out[k].float() != one[k].float()).sum()) for k in base)
            label = "==" if dtype == "float32" else "~= (bf16 rounding)"
            check(
                f"identical {variant} dtype={dtype} {label} base + delta",
                d == 0.0 if dtype == "float32" else d < 1e-2,
                f"max|diff|={d:.3g}, mismatching elements={n_off}",
            )

    # Case D: an element moved by 2 of 3 agents -> mean over the 2 active ones, not /3;
    # and a sub-epsilon move on a tiny weight is dropped from sum and count.
    base = {"w": torch.zeros(8, dtype=torch.bfloat16)}
    base["w"][4:] = 1.0
    a0 = base["w"].clone()
    a1 = base["w"].clone()
    a2 = base["w"].clone()
    # shared by 2 -> 0.375
    a0[0] = 0.5
    a1[0] = 0.25
    # third is sub-epsilon -> still 0.375
    a0[1] = 0.5
    a1[1] = 0.25
    a2[1] = 4e-6
    a2[2] = 4e-6  # only sub-epsilon move -> stays 0
    a2[3] = 2e-5  # above epsilon, unique -> 2e-5 (bf16)
    # shared by 3 -> 1 + (0.5+0.5-0.5)/3
    a0[4] = 1.5
    a1[4] = 1.5
    a2[4] = 0.5
    _write_case(root / "active", base, [{"w": a0}, {"w": a1}, {"w": a2}])
    exp = torch.tensor([0.375, 0.375, 0.0, float(a2[3]), 1 + 0.5 / 3, 1, 1, 1])
    for dtype in ("auto", "float32"):
        out, _ = run_case(root / "active", "ram", dtype)
        got = out["w"].float()
        check(
            f"active-only mean + sub-epsilon drop, ram dtype={dtype}",
            torch.allclose(got, exp, rtol=1e-2, atol=0) and got[2] == 0,
            f"got {[round(x, 6) for x in got.tolist()]} expected {[round(x, 6) for x in exp.tolist()]}",
        )

    # Case E: ramplus_tl's lambda, per tensor: agent 0 has 10 unique + 10 shared entries (rho = 1,
    # clipped to alpha = 0.2 -> lambda = 1.02); agent 1 only shared (rho -> inf -> 1.02);
    # agent 2 only unique (rho = 0 -> lambda = 1).
    base = {"w": torch.zeros(40, dtype=torch.bfloat16)}
    a0 = base["w"].clone()
    a1 = base["w"].clone()
    a2 = base["w"].clone()
    a0[0:10] = 0.5
    a0[10:20] = 0.25
    a1[10:20] = 0.75
    a2[20:30] = 0.125
    _write_case(root / "lambda", base, [{"w": a0}, {"w": a1}, {"w": a2}])
    out, res = run_case(root / "lambda", "ramplus_tl", "float32")
    got = out["w"]
    check(
        "ramplus_tl lambda (defaults r=0.1, alpha=0.2)",
        torch.allclose(got[0:10], torch.full((10,), 0.5 * 1.02))
        and torch.allclose(got[10:20], torch.full((10,), 0.5))
        and torch.allclose(got[20:30], torch.full((10,), 0.125))
        and bool((got[30:] == 0).all()),
        f"unique(agent0, rho=1)={float(got[0]):.6f} shared={float(got[10]):.6f} "
        f"unique(agent2, rho=0)={float(got[20]):.6f} params={res['params_used']}",
    )
    out, res = run_case(root / "lambda", "ramplus_tl", "float32", r=0.1, alpha=2.0)
    check(
        "ramplus_tl lambda with paper alpha=2.0",
        torch.allclose(out["w"][0:10], torch.full((10,), 0.5 * 1.1)),
        f"unique(agent0, rho=1)={float(out['w'][0]):.6f} (expected {0.5 * 1.1})",
    )

    print("\n".join(report))
    print(
        f"selftest: {sum(line.startswith('[PASS') for line in report)} passed, "
        f"{sum(line.startswith('[FAIL') for line in report)} failed"
    )
    return ok


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", help="dir with base.safetensors and agent_{k}.safetensors")
    ap.add_argument("--out", help="result JSON path")
    ap.add_argument("--variant", choices=VARIANTS, default="ram")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--save", help="save merged tensors to this .safetensors file")
    ap.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="auto",
        help="mergekit compute dtype; auto = mergekit's default (promoted input dtype)",
    )
    ap.add_argument(
        "--path",
        choices=("method", "task"),
        default="method",
        help="call the merge method directly, or through ExecuteMergeMethodTask.execute",
    )
    ap.add_argument("--epsilon", type=float, help="mergekit epsilon (default: mergekit's, 1e-5)")
    ap.add_argument("--r", type=float, help="ramplus_tl r (default: mergekit's, 0.1)")
    ap.add_argument("--alpha", type=float, help="ramplus_tl alpha (default: mergekit's, 0.2)")
    ap.add_argument(
        "--selftest",
        action="store_true",
        help="build tiny bf16 inputs (under --inputs if given, else a temp dir) and check known answers",
    )
    args = ap.parse_args(argv)

    if args.selftest:
        if args.inputs:
            return 0 if selftest(Path(args.inputs)) else 1
        with tempfile.TemporaryDirectory() as d:
            return 0 if selftest(Path(d)) else 1
    if not args.inputs or not args.out:
        ap.error("--inputs and --out are required (or use --selftest)")
    if args.variant == "ram" and (args.r is not None or args.alpha is not None):
        ap.error("--r/--alpha apply to ramplus_tl only")
    result = run(args)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
