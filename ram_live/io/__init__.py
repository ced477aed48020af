"""Where tensors come from and where a merge goes: :mod:`.sources` (modules, state dicts, safetensors files, HF
folders), :mod:`.sinks` (a new module, in place, a state dict, safetensors), :mod:`.safetensors_io` (the mmap reader
and streaming shard writer) with :mod:`.st_header` (headers checked as the safetensors library checks them),
:mod:`.outputs` (atomic, space-reserving writes), :mod:`.memory` (output buffers on huge pages), :mod:`.dtensor`
and :mod:`.distributed` (DTensor shards and torch.distributed). Nothing here imports the engine or a method.
"""
