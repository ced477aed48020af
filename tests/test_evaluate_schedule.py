"""``SearchSetting(evaluate=rewards(...))`` in :class:`~ram_live.RAMSchedule` (what the TRL and Lightning callbacks
run): the training Llama itself is scored with each candidate swapped in, and put back bit for bit."""

from __future__ import annotations

import torch

from ram_live import RAMSchedule, merge
from ram_live.evaluate import rewards
from ram_live.training.search import SearchSetting
from ram_live.training.search_record import load_choice
from ram_live.store import SnapshotStore

import evaluate_helpers as h
from evaluate_helpers import ANSWERS, PROMPTS, length, starts_right


def _moved(m, seed: int):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_((torch.rand(p.shape, generator=g) < 0.3) * torch.randn(p.shape, generator=g) * 0.5)
    return m


def test_schedule_search_with_rewards(tmp_path):
    tok, store = h.tokenizer(), tmp_path / "store"
    a = h.model(0)
    sched_a = RAMSchedule(store, "a", durable=False)
    sched_a.attach(a)
    sched_a.snapshot(_moved(a, 1), 4)
    b = _moved(h.model(0), 2)
    before = {k: v.clone() for k, v in b.state_dict().items()}
    evaluate = rewards(
        [{"prompt": p, "answer": x} for p, x in zip(PROMPTS, ANSWERS)],
        [length, starts_right],
        tokenizer=tok,
        max_new_tokens=6,
    )
    sched = RAMSchedule(
        store,
        "b",
        merge_every=4,
        durable=False,
        search=SearchSetting(evaluate=evaluate, budget=3, space=["task_arithmetic"]),
    )
    sched.attach(h.model(0))
    metrics = sched.on_step(b, 4)
    assert all(torch.equal(before[k], v) for k, v in b.state_dict().items())  # swapped back
    rec = sched.last_result.extra["search"]
    winner = h.model(0)
    winner.load_state_dict(
        merge(SnapshotStore(store).latest_all(["a", "b"]), base=h.model(0).state_dict(), **load_choice(rec["file"]))
    )
    ids = [h.greedy(winner, tok, tok(p)["input_ids"], 6) for p in PROMPTS]
    texts = [tok.decode(i, skip_special_tokens=True) for i in ids]
    # length counts completion tokens (EOS included), starts_right looks at the text
    expected = sum(float(len(i)) + (1.0 if t.startswith(x[:1]) else 0.0) for i, t, x in zip(ids, texts, ANSWERS)) / len(
        PROMPTS
    )
    assert metrics["ram/search/best_score"] == expected and expected > 0
