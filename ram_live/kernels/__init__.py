"""Native CPU kernels' shared machinery: the one build module and loader (:mod:`.cc`: each part of a C source in
``ram_live/csrc`` compiled on its first call for this CPU's level, cached per machine, ``RAM_LIVE_NATIVE=0``
turning all off), what the kernels take (:mod:`.layout`), the one thread pool they and the engine share
(:mod:`.pool`) and the probe's binding (:mod:`.probe`). The bindings of RAM's merge kernels live in RAM's room
(``ram_live/methods/ram/native*.py``), the store's codecs with the store (``ram_live/store/native_*.py``); both
use :mod:`.cc`. Nothing here imports the engine or a method.
"""
