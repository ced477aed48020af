"""Evaluation that comes with the library: the RL run's reward functions (:func:`rewards`) or lm-eval-harness
tasks (:func:`lm_eval`) as the ``evaluate(model) -> float`` that :func:`ram_live.search`, ``SearchSetting`` and
``ram-live search`` take. See ``docs/evaluate.md``.

>>> evaluate = rewards("held_out.jsonl", [correct], tokenizer=tok, max_new_tokens=128)   # doctest: +SKIP
>>> evaluate = rewards("val.parquet", compute_score(fn), tokenizer=tok, samples=8, metric="pass@1")  # doctest: +SKIP
>>> result = ram_live.search(agents, base=base, evaluate=evaluate)                     # doctest: +SKIP
"""

from ..errors import EvaluationError
from .adapters import compute_score
from .generation import GenerationSettings
from .harness import LmEval, lm_eval
from .prompts import Prompts, load_prompts
from .rewards import Rewards, rewards
from .samples import pass_at_k
from .vllm_engine import VLLMGenerate

__all__ = [
    "rewards",
    "Rewards",
    "lm_eval",
    "LmEval",
    "compute_score",
    "load_prompts",
    "Prompts",
    "GenerationSettings",
    "EvaluationError",
    "pass_at_k",
    "VLLMGenerate",
]
