"""Native CPU kernels: the one build module and loader (:mod:`.cc`: each part of a C source in ``ram_live/csrc``
compiled on its first call for this CPU's level, cached per machine, ``RAM_LIVE_NATIVE=0`` turning all off) and
a ``ctypes`` binding per family: :mod:`.ram` (RAM's merge and counts), :mod:`.importance` (curvature-aware RAM),
:mod:`.probe`, :mod:`.codes` (the store's importance codes), :mod:`.select` (snapshot capture), :mod:`.crc`
(CRC-32); :mod:`.pool` is the thread pool they and the engine share. Nothing here imports the engine or a method.
"""
