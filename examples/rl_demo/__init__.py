"""Modules of examples/rl_merge_demo.py (run as a script: ``examples/`` is on ``sys.path``)."""
