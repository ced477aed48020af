"""TRL-style reward functions for the parallel search tests: importable on their own, as a spawned worker
unpickles them by module."""

from __future__ import annotations


def first_char(completions, reward_model, **kwargs) -> list[float]:
    """1 when the completion's first character starts the ground truth (a conversation's text is its content)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if t[:1] == r["ground_truth"][:1] else 0.0 for t, r in zip(texts, reward_model)]


def has_a(completions, **kwargs) -> list[float]:
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [0.5 * ("a" in t) for t in texts]
