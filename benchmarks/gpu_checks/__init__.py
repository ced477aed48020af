"""The parts of ``benchmarks/gpu_check.py``: the check runner, the inputs, the comparisons, the merge checks and
the PEFT / distributed / pytest checks. The benchmarks run as scripts, so this folder's parent is on ``sys.path``."""
