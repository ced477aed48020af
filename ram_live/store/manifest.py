"""What a valid manifest is, checked in full before any file it names is opened or deleted.

A snapshot manifest (format ``ram_live.snapshot``, version 1, 2 or 3) is an object with

* ``agent``, ``step``: those of its file name (``<agent>/<step:012d>.<run>.json``);
* ``run`` and ``run_started`` (a finite time): the run of its file name; absent in the legacy run's
  (``<agent>/<step:012d>.json``, written before stores knew runs);
* ``files``: a list of ``{"name", "bytes", "crc32"}``; each name a plain data file name of this very step
  (``<step:012d>-<nonce>.p<rank>.safetensors``: no folder, no ``..``, nothing of another step or agent), no
  name twice, ``bytes`` >= 8, ``crc32`` 8 lowercase hex digits (version 2: required; version 1 has none);
* ``tensors``: key -> ``{"shape", "dtype", "buffer", "pieces"}``; the pieces' boxes (``offsets`` + ``shape``,
  inside the tensor) tile the tensor exactly: disjoint, their sizes adding up to the tensor's (so no tensor
  has no pieces unless it is empty); each piece names a file by index, an ``encoding`` and a ``count`` of
  changed entries: ``none`` (count 0, no data), ``dense`` (0 <= count <= n; ``values``), ``indices`` and
  ``bitmask`` (0 <= count <= n; ``values`` and ``positions``), never the same (file, tensor name) twice;
* ``keys`` (every name, no duplicates) = the tensors and the ``aliases`` (tied name -> tensor);
* version 3 only, ``importance`` = ``{"encoding": "log8", "steps_per_octave": 8}`` (:mod:`.importance_codes`): then
  every stored piece (encoding other than ``none``) of a floating non-buffer tensor, and no other piece, has
  ``importance`` (a U8 tensor of ``count`` entries, ``n`` for ``dense``) and ``importance_max`` (finite, >= 0);
* ``stats`` equal to what the tensors and files add up to (numel, changed, bytes, dense_bytes), ``activity``
  ``{"rule": "changed"}`` or ``{"rule": "abs", "eps": e >= 0}``, and ``base_fingerprint``.

A base manifest (``ram_live.base``) has ``fingerprint``, ``files`` named ``base-<nonce>.p<rank>.safetensors``
and tensors whose pieces are dense ``values``. The tensors inside the files are checked against these
requirements when the files are opened (:mod:`.datafiles`), their bytes against ``crc32`` before first use.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from .errors import CorruptSnapshotError, StoreError
from .format import (
    BASE_FORMAT,
    DTYPES,
    READ_VERSIONS,
    SNAPSHOT_FORMAT,
    ST_DTYPES,
    LEGACY_RUN,
    data_step,
    intersect,
    is_base_data,
)

ENCODINGS = ("none", "indices", "bitmask", "dense")
_CRC_RE = re.compile(r"^[0-9a-f]{8}$")
_MAX_DIMS = 64
_MAX_NAME = 4096
_SNAPSHOT_PIECE = {
    "offsets",
    "shape",
    "encoding",
    "count",
    "file",
    "values",
    "positions",
    "importance",
    "importance_max",
}
_FLOATS = frozenset({"float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"})
_BASE_PIECE = {"offsets", "shape", "file", "values"}


@dataclass
class FileEntry:
    """One data file of a checked manifest, and what must be inside it: tensor name -> (safetensors dtypes
    allowed, exact shape or None, number of elements)."""

    name: str
    bytes: int
    crc32: str | None
    needs: dict[str, tuple[frozenset[str], tuple[int, ...] | None, int]] = field(default_factory=dict)


@dataclass
class Checked:
    """A manifest that passed :func:`check_snapshot` / :func:`check_base`."""

    version: int
    files: list[FileEntry]

    @property
    def checksummed(self) -> bool:
        return all(f.crc32 is not None for f in self.files)


class _Ctx:
    def __init__(self, agent: str | None, step: int | None) -> None:
        self.agent, self.step = agent, step
        self.importance = False  # version 3 snapshots with an "importance" head: every stored parameter piece has them
        self.where = "the store's base manifest" if agent is None else f"agent {agent!r} step {step}: manifest"

    def fail(self, message: str, file: str | None = None) -> NoReturn:
        raise CorruptSnapshotError(f"{self.where}: {message}", agent=self.agent, step=self.step, file=file)


def _is_int(v: Any) -> bool:
    return type(v) is int


def _int(v: Any, ctx: _Ctx, what: str, lo: int = 0, hi: int = 2**62) -> int:
    if not _is_int(v) or not lo <= v <= hi:
        ctx.fail(f"{what} must be an integer in [{lo}, {hi}], got {v!r:.80}")
    return v


def _dict(v: Any, ctx: _Ctx, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        ctx.fail(f"{what} must be an object, got {type(v).__name__}")
    return v


def _list(v: Any, ctx: _Ctx, what: str) -> list[Any]:
    if not isinstance(v, list):
        ctx.fail(f"{what} must be a list, got {type(v).__name__}")
    return v


def _name(v: Any, ctx: _Ctx, what: str) -> str:
    if not isinstance(v, str) or not 0 < len(v) <= _MAX_NAME:
        ctx.fail(f"{what} must be a non-empty string, got {v!r:.80}")
    return v


def _dims(v: Any, ctx: _Ctx, what: str, n: int | None = None) -> tuple[int, ...]:
    dims = _list(v, ctx, what)
    if len(dims) > _MAX_DIMS or (n is not None and len(dims) != n):
        ctx.fail(f"{what} must have {n if n is not None else f'at most {_MAX_DIMS}'} entries, got {len(dims)}")
    return tuple(_int(d, ctx, what) for d in dims)


def _version(m: dict[str, Any], fmt: str, ctx: _Ctx) -> int:
    if m.get("format") != fmt:
        ctx.fail(f"not a {fmt} manifest (format {m.get('format')!r:.80})")
    version = m.get("version")
    if _is_int(version) and version > max(READ_VERSIONS):
        raise StoreError(f"{ctx.where}: format version {version} is newer than this ram_live's (upgrade it)")
    if version not in READ_VERSIONS or not _is_int(version):
        ctx.fail(f"unknown format version {version!r:.80}")
    return version


def _files(m: dict[str, Any], ctx: _Ctx, version: int, valid: Callable[[str], bool]) -> list[FileEntry]:
    out: list[FileEntry] = []
    seen: set[str] = set()
    for i, f in enumerate(_list(m.get("files"), ctx, "files")):
        f = _dict(f, ctx, f"files[{i}]")
        if not set(f) <= {"name", "bytes", "crc32"}:
            ctx.fail(f"files[{i}] has unknown fields {sorted(set(f) - {'name', 'bytes', 'crc32'})}")
        name = f.get("name")
        if not isinstance(name, str) or not valid(name):
            ctx.fail(
                f"files[{i}]: {name!r:.120} is not a data file name of this "
                f"{'base' if ctx.agent is None else 'snapshot'} (a plain name of the store's own pattern)"
            )
        if name in seen:
            ctx.fail(f"files[{i}]: {name} is listed twice", file=name)
        seen.add(name)
        size = _int(f.get("bytes"), ctx, f"files[{i}].bytes", lo=8)
        crc = f.get("crc32")
        if crc is None and version >= 2:
            ctx.fail(f"files[{i}] ({name}) has no crc32 (version {version} manifests checksum every file)", file=name)
        if crc is not None and (not isinstance(crc, str) or not _CRC_RE.match(crc)):
            ctx.fail(f"files[{i}] ({name}): crc32 must be 8 lowercase hex digits, got {crc!r:.80}", file=name)
        out.append(FileEntry(name, size, crc))
    return out


def _disjoint(boxes: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> bool:
    """No two boxes of non-zero size overlap (a sweep along the dimension with the most distinct offsets)."""
    boxes = [b for b in boxes if math.prod(b[1]) > 0]
    if len(boxes) < 2:
        return True
    if not boxes[0][0]:
        return False  # two boxes of a 0-dim tensor
    d = max(range(len(boxes[0][0])), key=lambda i: len({b[0][i] for b in boxes}))
    active: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for b in sorted(boxes, key=lambda b: b[0][d]):
        active = [a for a in active if a[0][d] + a[1][d] > b[0][d]]
        if any(intersect(a, b) is not None for a in active):
            return False
        active.append(b)
    return True


def _pieces(key: str, entry: dict[str, Any], files: list[FileEntry], ctx: _Ctx, snapshot: bool) -> int:
    """Checks a tensor's pieces; records what they need in their files; returns their changed count."""
    shape = _dims(entry.get("shape"), ctx, f"tensor {key!r} shape")
    dtype = entry.get("dtype")
    if not isinstance(dtype, str) or dtype not in DTYPES or dtype not in ST_DTYPES:
        ctx.fail(f"tensor {key!r}: unknown dtype {dtype!r:.80}")
    st_dtype = frozenset({ST_DTYPES[dtype]})
    allowed = {"shape", "dtype", "buffer", "pieces"}
    if not set(entry) <= allowed or "buffer" in entry and not isinstance(entry["buffer"], bool):
        ctx.fail(f"tensor {key!r}: unknown fields or a non-boolean buffer ({sorted(entry)})")
    boxes = []
    changed = 0
    for i, p in enumerate(_list(entry.get("pieces"), ctx, f"tensor {key!r} pieces")):
        what = f"tensor {key!r} piece {i}"
        p = _dict(p, ctx, what)
        fields = _SNAPSHOT_PIECE if snapshot else _BASE_PIECE
        if not set(p) <= fields:
            ctx.fail(f"{what} has unknown fields {sorted(set(p) - fields)}")
        offsets = _dims(p.get("offsets"), ctx, f"{what} offsets", len(shape))
        box = _dims(p.get("shape"), ctx, f"{what} shape", len(shape))
        if any(o + s > n for o, s, n in zip(offsets, box, shape)):
            ctx.fail(f"{what}: box {list(offsets)} + {list(box)} is outside the tensor's shape {list(shape)}")
        boxes.append((offsets, box))
        n = math.prod(box)
        index = (
            _int(p.get("file"), ctx, f"{what} file", hi=max(0, len(files) - 1))
            if files
            else ctx.fail(f"{what} names file {p.get('file')!r:.20} but the manifest lists no file")
        )
        needs = files[index].needs

        def need(name_key: str, dtypes: frozenset[str], exact: tuple[int, ...] | None, numel: int) -> None:
            name = _name(p.get(name_key), ctx, f"{what} {name_key}")
            if name in needs:
                ctx.fail(f"{what}: tensor {name!r} of file {files[index].name} is named twice", files[index].name)
            needs[name] = (dtypes, exact, numel)

        if not snapshot:
            need("values", st_dtype, box, n)
            continue
        encoding = p.get("encoding")
        if encoding not in ENCODINGS:
            ctx.fail(f"{what}: unknown encoding {encoding!r:.80}")
        count = _int(p.get("count"), ctx, f"{what} count", hi=0 if encoding == "none" else n)
        changed += count
        has = {"values": encoding != "none", "positions": encoding in ("indices", "bitmask")}
        for name_key, wanted in has.items():
            if (name_key in p) != wanted:
                ctx.fail(f"{what}: encoding {encoding!r} {'needs' if wanted else 'has no'} {name_key!r}")
        stores = encoding != "none" and not entry.get("buffer") and dtype in _FLOATS
        if ("importance" in p) != (stores and ctx.importance) or ("importance_max" in p) != ("importance" in p):
            ctx.fail(
                f"{what}: {'needs' if stores and ctx.importance else 'has no'} 'importance' and "
                "'importance_max' (a snapshot with importances has them on every stored piece of a floating "
                "parameter, and only there)"
            )
        if "importance" in p:
            top = p["importance_max"]
            if type(top) not in (int, float) or not 0 <= top < math.inf:
                ctx.fail(f"{what}: importance_max must be a finite number >= 0, got {top!r:.40}")
            need("importance", frozenset({"U8"}), None, n if encoding == "dense" else count)
        if encoding == "dense":
            need("values", st_dtype, None, n)
        elif encoding == "indices":
            need("values", st_dtype, None, count)
            need("positions", frozenset({"I32", "I64"}), None, count)
        elif encoding == "bitmask":
            need("values", st_dtype, None, count)
            need("positions", frozenset({"U8"}), None, (n + 7) // 8)
    covered = sum(math.prod(b) for _, b in boxes)
    if covered != math.prod(shape) or not _disjoint(boxes):
        ctx.fail(
            f"tensor {key!r}: its pieces do not tile the tensor {list(shape)} exactly (they cover {covered} "
            f"of {math.prod(shape)} entries{', overlapping' if covered == math.prod(shape) else ''})"
        )
    return changed


def _table(m: dict[str, Any], files: list[FileEntry], ctx: _Ctx, snapshot: bool) -> tuple[int, int, int]:
    """Checks tensors, keys and aliases; returns (numel, changed, dense bytes) of the tensors."""
    tensors = _dict(m.get("tensors"), ctx, "tensors")
    numel = changed = dense = 0
    for key, entry in tensors.items():
        _name(key, ctx, "a tensor key")
        changed += _pieces(key, _dict(entry, ctx, f"tensor {key!r}"), files, ctx, snapshot)
        n = math.prod(entry["shape"])
        numel += n
        dense += n * DTYPES[entry["dtype"]].itemsize
    aliases = _dict(m.get("aliases", {}), ctx, "aliases")
    for alias, target in aliases.items():
        if alias in tensors or not isinstance(target, str) or target not in tensors:
            ctx.fail(f"alias {alias!r} -> {target!r:.80} must be a name that is not a tensor, of a tensor")
    if "keys" in m:
        keys = _list(m["keys"], ctx, "keys")
        if (
            not all(isinstance(k, str) for k in keys)
            or len(set(keys)) != len(keys)
            or set(keys) != set(tensors) | set(aliases)
        ):
            ctx.fail("keys must list every tensor and alias once")
    return numel, changed, dense


def check_snapshot(m: Any, agent: str, step: int, run: str = LEGACY_RUN) -> Checked:
    """Checks a snapshot manifest read from ``<agent>/<step:012d>.<run>.json`` (the legacy run's:
    ``<step:012d>.json``; :class:`CorruptSnapshotError` naming agent, step and what is wrong; :class:`StoreError`
    for a newer format version).

    Example:
        >>> check_snapshot(json.load(open("runs/ram/coder/000000000050.json")), "coder", 50)  # doctest: +SKIP
    """
    ctx = _Ctx(agent, step)
    m = _dict(m, ctx, "the manifest")
    version = _version(m, SNAPSHOT_FORMAT, ctx)
    if m.get("agent") != agent or m.get("step") != step or not _is_int(m.get("step")):
        ctx.fail(f"it says agent {m.get('agent')!r:.80} step {m.get('step')!r:.20}")
    if m.get("run", LEGACY_RUN) != run or ("run" in m) == (run == LEGACY_RUN):
        ctx.fail(f"it says run {m.get('run', LEGACY_RUN)!r:.80}, its file name run {run!r}")
    started = m.get("run_started")
    if "run" in m and (type(started) not in (int, float) or not math.isfinite(started)):
        ctx.fail(f"run_started must be a finite number, got {started!r:.40}")
    _name(m.get("base_fingerprint"), ctx, "base_fingerprint")
    if "importance" in m:
        if version < 3 or m["importance"] != {"encoding": "log8", "steps_per_octave": 8}:
            ctx.fail(
                f"importance must be {{'encoding': 'log8', 'steps_per_octave': 8}} in a version 3 manifest, "
                f"got {m['importance']!r:.80} (version {version})"
            )
        ctx.importance = True
    files = _files(m, ctx, version, lambda name: data_step(name) == step)
    numel, changed, dense = _table(m, files, ctx, snapshot=True)
    stats = _dict(m.get("stats"), ctx, "stats")
    want = {"numel": numel, "changed": changed, "bytes": sum(f.bytes for f in files), "dense_bytes": dense}
    for k, v in want.items():
        if stats.get(k) != v or not _is_int(stats.get(k)):
            ctx.fail(f"stats.{k} is {stats.get(k)!r:.40}, the tensors and files add up to {v}")
    activity = _dict(m.get("activity"), ctx, "activity")
    eps = activity.get("eps")
    if not (
        activity == {"rule": "changed"}
        or (
            set(activity) == {"rule", "eps"}
            and activity["rule"] == "abs"
            and type(eps) in (int, float)
            and 0 <= eps < math.inf
        )
    ):
        ctx.fail(f"activity must be {{'rule': 'changed'}} or {{'rule': 'abs', 'eps': e >= 0}}, got {activity!r:.80}")
    if m.get("epoch") is not None:
        _int(m["epoch"], ctx, "epoch", lo=-(2**62))
    if m.get("dtype") is not None and (not isinstance(m["dtype"], str) or m["dtype"] not in DTYPES):
        ctx.fail(f"unknown dtype {m['dtype']!r:.80}")
    if "parts" in m and m["parts"] != len(files):
        ctx.fail(f"parts is {m['parts']!r:.20}, but {len(files)} files are listed")
    if "extra" in m:
        _dict(m["extra"], ctx, "extra")
    return Checked(version, files)


def check_base(m: Any) -> Checked:
    """Checks the store's base manifest (``_base/base.json``); see :func:`check_snapshot`."""
    ctx = _Ctx(None, None)
    m = _dict(m, ctx, "the manifest")
    version = _version(m, BASE_FORMAT, ctx)
    _name(m.get("fingerprint"), ctx, "fingerprint")
    files = _files(m, ctx, version, is_base_data)
    _table(m, files, ctx, snapshot=False)
    return Checked(version, files)
