"""Helpers of the adversarial tests: safetensors files written byte by byte, and what safetensors reads."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch


def raw_file(path: Path, header: bytes | str | Any, data: bytes = b"", length: int | None = None) -> Path:
    """A safetensors-shaped file: 8-byte length (``length`` or the header's), header bytes, data."""
    if not isinstance(header, (bytes, str)):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode()
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)
    return path


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def safe_read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]] | None:
    """(tensors, metadata) as ``safetensors.safe_open`` reads them, or None where it refuses the file."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    except Exception:  # safetensors raises SafetensorError, OSError, ValueError... the reason does not matter
        return None


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes (NaN payloads included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))
