"""The built-in method families, registered by importing them: the registry imports this module when it is first
asked (:func:`~ram_live.methods.registry.get_method` and friends). Python's import lock runs it once; a thread that
asks while another imports it waits until every family is registered."""

from . import dare, linear, task_arithmetic, ties  # noqa: F401 - importing a family registers it
from .ram import method  # noqa: F401
