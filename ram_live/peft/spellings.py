"""PEFT's ``add_weighted_adapter`` spellings (``combination_type=``, ``svd_rank=``, ``majority_sign_method=``,
``density=``, ``adapter_name=``) in :func:`ram_merge_adapters` / :func:`ram_merge_adapter_files`: taken where they
mean what ram_live's options mean, refused with the right option named where they do not.

ram_live always merges the adapters' ΔW = s·B·A (not the A and B factors separately) and re-factors the result by
SVD, which is what PEFT's ``*_svd`` combination types (and ``"svd"``) do.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..methods import RAM_METHODS

#: PEFT combination types that are ram_live's methods: ΔW-space merges re-factored by SVD
_SAME = {"svd": "task_arithmetic", "ties_svd": "ties", "dare_linear_svd": "dare_linear", "dare_ties_svd": "dare_ties"}
#: PEFT combination types that merge the A and B factors (or concatenate them): not ram_live's merges
_FACTORS = {
    "linear": "PEFT's 'linear' adds √w-weighted A and B factors, whose product is not Σ w·ΔW; "
    "method='task_arithmetic' is the weighted sum of the ΔW (PEFT's 'svd')",
    "cat": "PEFT's 'cat' concatenates the factors (Σ w·ΔW exactly, rank = the sum of the ranks): "
    "method='task_arithmetic' with rank= the sum of the adapters' ranks is the same ΔW",
    "ties": "PEFT's 'ties' trims and elects the A and B factors separately; method='ties' is TIES on the ΔW "
    "(PEFT's 'ties_svd')",
    "dare_linear": "PEFT's 'dare_linear' drops entries of the A and B factors; method='dare_linear' is DARE on "
    "the ΔW (PEFT's 'dare_linear_svd')",
    "dare_ties": "PEFT's 'dare_ties' works on the A and B factors; method='dare_ties' is DARE-TIES on the ΔW "
    "(PEFT's 'dare_ties_svd')",
    "magnitude_prune": "ram_live has no magnitude-prune method; method='task_arithmetic' with "
    "sparsify=TopK(density) keeps the top-density entries of each ΔW",
    "magnitude_prune_svd": "ram_live has no magnitude-prune method; method='task_arithmetic' with "
    "sparsify=TopK(density) keeps the top-density entries of each ΔW",
}
_SVD_DETAILS = ("svd_clamp", "svd_full_matrices", "svd_driver")


def peft_spellings(
    method: str, rank: int | None, options: dict[str, Any], *, method_given: bool, new_adapter: str | None = None
) -> tuple[str, int | None, dict[str, Any], str | None]:
    """``(method, rank, options, new_adapter)`` with PEFT's spellings in ``options`` turned into ram_live's.

    Example:
        >>> peft_spellings("ram_plus", None, {"combination_type": "ties_svd", "svd_rank": 8, "density": 0.3},
        ...                method_given=False)
        ('ties', 8, {'density': 0.3}, None)
    """
    opts = dict(options)
    if "combination_type" in opts:
        kind = opts.pop("combination_type")
        if kind in _FACTORS:
            raise ConfigError(f"combination_type={kind!r}: {_FACTORS[kind]}")
        if kind not in _SAME:
            raise ConfigError(
                f"combination_type={kind!r} is not one of PEFT's; ram_live takes method= "
                f"(e.g. 'ram_plus', 'ties', 'task_arithmetic')"
            )
        if method_given and method != _SAME[kind]:
            raise ConfigError(
                f"combination_type={kind!r} is method={_SAME[kind]!r}, but method={method!r} is given "
                "too: pass one of them"
            )
        method = _SAME[kind]
    if "svd_rank" in opts:
        svd_rank = opts.pop("svd_rank")
        if rank is not None and rank != svd_rank:
            raise ConfigError(f"svd_rank={svd_rank!r} is PEFT's name of rank=, and rank={rank!r} is given too")
        rank = svd_rank
    if "majority_sign_method" in opts:
        value = opts.pop("majority_sign_method")
        if "majority_sign" in opts and opts["majority_sign"] != value:
            raise ConfigError("majority_sign_method= is PEFT's name of majority_sign=; pass one of them")
        opts["majority_sign"] = value
    if "adapter_name" in opts:
        name = opts.pop("adapter_name")
        if new_adapter is None:
            raise ConfigError(
                "adapter_name= (PEFT's name of the new adapter) does not apply here: the merged "
                "adapter is written to out="
            )
        if new_adapter not in ("merged", name):
            raise ConfigError(
                f"adapter_name={name!r} is PEFT's name of new_adapter=, and new_adapter={new_adapter!r} is given too"
            )
        new_adapter = name
    details = [k for k in _SVD_DETAILS if k in opts]
    if details:
        raise ConfigError(
            f"{', '.join(details)}: PEFT's torch.linalg.svd settings have no counterpart; ram_live "
            "chooses the factorization with svd='exact'|'randomized' (and oversample=, niter=)"
        )
    if "density" in opts and method in RAM_METHODS:
        raise ConfigError(
            f"density= is TIES/DARE's option (PEFT's add_weighted_adapter takes it for those); for "
            f"{method} on LoRA deltas the fraction of each ΔW that counts as updated is "
            f"sparsify=TopK({opts['density']!r})"
        )
    return method, rank, opts, new_adapter
