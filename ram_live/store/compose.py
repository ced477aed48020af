"""One manifest composed from the parts every rank wrote (:func:`compose_manifest`); what makes it valid is
:mod:`.manifest`'s."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import StoreError
from .format import dtype_name
from .local import LocalModel


def compose_manifest(parts: Sequence[Mapping[str, Any]], local: LocalModel, extra: dict[str, Any]) -> dict[str, Any]:
    """One manifest from the parts of every rank: their files, and the pieces of every tensor (each piece's
    ``file`` set to its part's index). It is not checked here: writers check it before writing it.

    Args:
        parts: every rank's part, ``{"file": file entry, "pieces": key → pieces}`` (as ``write_base_part`` or a
            snapshot part gives it), in file order.
        local: the model as this rank holds it: its keys, tied names, global shapes and dtypes.
        extra: the manifest's head (format, version, fingerprints, ...), copied in first.

    Returns:
        The manifest: ``extra`` with ``keys``, ``aliases``, ``files`` and ``tensors``.

    Raises:
        StoreError: the parts' pieces do not cover every element of some tensor (a rank did not write).
        UnsupportedInputError: a tensor's dtype is not one the store can hold.
    """
    files: list[dict[str, Any]] = []
    tensors: dict[str, Any] = {
        k: {"shape": list(t.global_shape), "dtype": dtype_name(t.tensor.dtype, k), "buffer": t.is_buffer, "pieces": []}
        for k, t in local.tensors.items()
    }
    for part in parts:
        index = len(files)
        files.append(part["file"])
        for key, pieces in part["pieces"].items():
            for p in pieces:
                tensors[key]["pieces"].append({**p, "file": index})
    for key, entry in tensors.items():
        covered = sum(math.prod(p["shape"]) for p in entry["pieces"])
        if covered != math.prod(entry["shape"]):
            raise StoreError(
                f"tensor {key!r}: the ranks' pieces cover {covered} of {math.prod(entry['shape'])} "
                "elements (is every rank writing?)"
            )
    return {**extra, "keys": local.keys(), "aliases": local.aliases(), "files": files, "tensors": tensors}
