"""Native CPU kernels: the one build module and loader (:mod:`.cc`: each part of a C source in ``ram_live/csrc``
compiled on its first call for this CPU's level, cached per machine, ``RAM_LIVE_NATIVE=0`` turning all off) and
a ``ctypes`` binding per merge-kernel family: :mod:`.ram` (RAM's merge and counts), :mod:`.importance`
(curvature-aware RAM), :mod:`.probe`; :mod:`.pool` is the thread pool they and the engine share. The store's own
native codecs (importance codes, snapshot capture, CRC-32) live with the store (``ram_live/store/native_*.py``)
and use :mod:`.cc` too. Nothing here imports the engine or a method.
"""
