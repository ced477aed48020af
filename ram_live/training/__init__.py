"""The framework-free training loop pieces the callbacks share: :mod:`.schedule` (:class:`RAMSchedule`: snapshot
every n steps, merge every m, evaluate), :mod:`.search` (:class:`SearchSetting`: held-out selection at each merge)
and :mod:`.tensors` (the schedule's tensor plumbing). The integrations (Lightning, transformers/TRL, verl) import
these; nothing in the core imports them.
"""
