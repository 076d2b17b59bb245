"""How a task's result is laid out when its task asks for more than a plain pickle.

A stored value is a pickle (:func:`durably._keys.serde.dumps`) unless its task says
otherwise; these layouts start with four bytes no pickle starts with (pickle has no opcode
``D``), so a value records its own layout and every reader tells them apart, whatever the
task that reads it says (a value written compressed loads for a task without ``compress=``,
and the other way round)::

    compressed (compress=)    b"DRZ1" | a zstandard frame of the pickle
    mapped (mmap=True)        b"DRM1" | total: u64 | meta length: u64 | xxh3-64(meta): u64
                              | meta: count: u32, then (offset: u64, length: u64) per array,
                                then the pickle of the value with each array replaced by
                                its number (a persistent id)
                              | each array as an ``.npy`` image (numpy's format 1.0 or 2.0
                                header, then its raw bytes), starting at a multiple of 64
                                bytes from the start of the value (integers little-endian)

A mapped value is always kept in a file (a store's large value: it starts 64 bytes into its
file, so every array's data is 64-byte aligned there too) and loaded as read-only
:class:`numpy.memmap` views of that file (``numpy.load(mmap_mode="r")``): a hit costs the
skeleton's unpickling, whatever the arrays' size. A store that hands back bytes rather than
a file (the memory store; PostgreSQL below 64 MiB) gets read-only arrays over those bytes,
with a one-time warning. What is checked when: :func:`check_mapped`.
"""

from __future__ import annotations

import io
import pickle
import struct
import warnings
from collections.abc import Callable
from typing import IO, Any

import xxhash

from durably._keys import serde as _serde
from durably.exceptions import DefinitionError, SerializationError

__all__ = ["MAPPED", "ZSTD", "Storage", "check_mapped", "compressed", "dumps_as", "loads_layout",
           "storage_for"]

ZSTD = _serde.LAYOUTS[0]
MAPPED = _serde.LAYOUTS[1]
_FIXED = struct.Struct("<4sQQQ")
_ENTRY = struct.Struct("<QQ")
_ALIGN = 64
#: the zstandard level of ``compress=True`` (zstandard's own default)
DEFAULT_LEVEL = 3
MAX_LEVEL = 22
INSTALL = "pip install 'durably[compress]'"


class Storage:
    """How a task's results are stored: ``mmap`` (arrays as memory-mappable ``.npy``
    images), ``level`` (zstandard level, None: not compressed)."""

    __slots__ = ("level", "mmap")

    def __init__(self, mmap: bool, level: int | None) -> None:
        self.mmap = mmap
        self.level = level

    def __repr__(self) -> str:
        return f"Storage(mmap={self.mmap}, level={self.level})"


_BY_LEVEL: dict[int, Storage] = {}


def zstandard() -> Any:
    """The zstandard module.

    Raises:
        ImportError: it is not installed (the message names the pip command; an ImportError,
            so a compressed cache entry met without it is kept, not discarded)."""
    try:
        import zstandard as zstd
    except ImportError:
        raise ImportError(
            f"compressed values need the zstandard package, which is not installed. Fix: "
            f"{INSTALL} (or pip install zstandard).") from None
    return zstd


def compression_level(compress: Any, where: str) -> int | None:
    """The zstandard level of a ``compress=`` option (None: not compressed).

    Raises:
        DefinitionError: not a bool or a level 1-22, or zstandard is not installed."""
    if compress is None or compress is False:
        return None
    if compress is True:
        level = DEFAULT_LEVEL
    elif isinstance(compress, int) and 1 <= compress <= MAX_LEVEL:
        level = compress
    else:
        raise DefinitionError(
            f"{where}(compress=...) takes True, False or a zstandard level from 1 (fastest) "
            f"to {MAX_LEVEL} (smallest), not {compress!r}. Fix: compress=True (level "
            f"{DEFAULT_LEVEL}).")
    try:
        zstandard()
    except ImportError:
        raise DefinitionError(
            f"{where}(compress={compress!r}) needs the zstandard package, which is not "
            f"installed. Fix: {INSTALL}.") from None
    return level


def storage_for(mmap: Any, compress: Any, name: str) -> Storage | None:
    """The storage of a task's ``mmap=`` and ``compress=`` options; None when it gave
    neither (its store's ``compress=`` applies).

    Raises:
        DefinitionError: an option has the wrong type, both are asked for, or zstandard is
            not installed."""
    if not isinstance(mmap, bool):
        raise DefinitionError(f"@task(mmap=...) of {name!r} must be True or False, not {mmap!r}")
    level = compression_level(compress, f"@task of {name!r}: task")
    if mmap and level is not None:
        raise DefinitionError(
            f"@task of {name!r} asks for mmap=True and compress={compress!r}: a compressed "
            "array cannot be memory-mapped. Fix: choose one (mmap=True for large arrays read "
            "in part, compress= for values that shrink).")
    if not mmap and compress is None:
        return None
    return Storage(mmap, level)


def store_storage(level: int | None) -> Storage | None:
    """The storage of a store's ``compress=`` level (shared, one per level)."""
    if level is None:
        return None
    found = _BY_LEVEL.get(level)
    if found is None:
        found = _BY_LEVEL[level] = Storage(False, level)
    return found


def dumps_as(obj: Any, storage: Storage, *, what: str) -> bytes:
    """:func:`~durably._keys.serde.dumps` in the layout ``storage`` asks for.

    Raises:
        SerializationError: the value cannot be pickled.
        StoreError: a large value could not be written to its file (a full disk)."""
    if storage.mmap:
        return _dumps_mapped(obj, what)
    data = _serde.dumps(obj, what=what)
    if storage.level is None:
        return data
    return compressed(data, storage.level, what)


# -- compressed --------------------------------------------------------------------------------
def compressed(data: bytes, level: int, what: str) -> bytes:
    """``data`` (a pickle, or a :class:`Spilled` one) as a compressed value; a large one is
    streamed from its file to a new one (never held in memory)."""
    cctx = zstandard().ZstdCompressor(level=level)
    if not isinstance(data, _serde.Spilled):
        return ZSTD + bytes(cctx.compress(data))
    sink = _serde.new_sink(what)
    sink.write(ZSTD)
    try:
        with data.open() as f:
            cctx.copy_stream(f, sink, size=data.size)
    except BaseException:
        sink.reset()
        raise
    finally:
        data.discard()
    return sink.finish()


def _load_compressed(data: bytes, f: IO[bytes] | None) -> Any:
    """A compressed value: from the file ``f`` (positioned after its magic) or from bytes."""
    dctx = zstandard().ZstdDecompressor()
    if f is not None:
        with dctx.stream_reader(f, closefd=False) as reader:
            return pickle.load(reader)
    # (unpickled as it is decompressed: the decompressed pickle is never held whole beside
    # the value, which a compressible array would make twice its size)
    with dctx.stream_reader(memoryview(data)[len(ZSTD):]) as reader:
        return pickle.load(reader)


# -- mapped ------------------------------------------------------------------------------------
def _array_types() -> tuple[type, ...]:
    import numpy as np

    return (np.ndarray, np.memmap)


def _mapped_pickler(base: type) -> type:
    class _ArrayPickler(base):  # type: ignore[misc]
        """Pickles a value with each plain numpy array (no Python objects inside) replaced
        by its number in ``arrays``."""

        arrays: list[Any]
        types: tuple[type, ...]

        def persistent_id(self, obj: Any) -> Any:
            if type(obj) in self.types and not obj.dtype.hasobject:
                self.arrays.append(obj)
                return len(self.arrays) - 1
            return None

    return _ArrayPickler


_PLAIN_ARRAY_PICKLER: type | None = None


def _skeleton(obj: Any, what: str) -> tuple[bytes, list[Any]]:
    """The pickle of ``obj`` with its arrays left out, and the arrays."""
    global _PLAIN_ARRAY_PICKLER
    import sys

    types = _array_types() if "numpy" in sys.modules else ()
    if _PLAIN_ARRAY_PICKLER is None:
        _PLAIN_ARRAY_PICKLER = _mapped_pickler(pickle.Pickler)
    for cloud in (False, True):
        out = io.BytesIO()
        arrays: list[Any] = []
        pickler: Any
        if cloud:
            pickler = _mapped_pickler(_serde.pickler_class())(out, what)
        else:
            pickler = _PLAIN_ARRAY_PICKLER(out, protocol=5)
        pickler.arrays, pickler.types = arrays, types
        try:
            pickler.dump(obj)
            return out.getvalue(), arrays
        except Exception as exc:
            if cloud:
                if isinstance(exc, SerializationError):
                    raise
                raise SerializationError(
                    f"cannot store {what}: a value of type {type(obj).__module__}."
                    f"{type(obj).__qualname__} cannot be pickled ({exc}). Fix: return plain "
                    "data (arrays, lists, dicts, numbers).") from None
    raise AssertionError("unreachable")


def _image(array: Any) -> tuple[bytes, Any]:
    """The ``.npy`` header of ``array`` and its raw bytes (a flat uint8 view, or a copy for
    an array that is in neither C nor Fortran order)."""
    import numpy as np
    from numpy.lib import format as npy

    if array.flags.c_contiguous:
        body = array.reshape(-1)
    elif array.flags.f_contiguous:
        body = array.T.reshape(-1)
    else:
        array = np.ascontiguousarray(array)
        body = array.reshape(-1)
    out = io.BytesIO()
    header = npy.header_data_from_array_1_0(array)
    try:
        npy.write_array_header_1_0(out, header)
    except ValueError:  # (a header over 64 KiB: a very long structured dtype)
        npy.write_array_header_2_0(out, header)
    raw = body.view(np.uint8) if body.nbytes else b""
    return out.getvalue(), raw


def _pad(n: int) -> int:
    return -n % _ALIGN


def _dumps_mapped(obj: Any, what: str) -> bytes:
    skeleton, arrays = _skeleton(obj, what)
    images = [_image(a) for a in arrays]
    meta_len = 4 + _ENTRY.size * len(images) + len(skeleton)
    offset = _FIXED.size + meta_len
    offset += _pad(offset)
    table = []
    for header, raw in images:
        length = len(header) + len(raw)
        table.append((offset, length))
        offset += length + _pad(length)
    total = offset
    meta = b"".join([struct.pack("<I", len(images)), *(_ENTRY.pack(*t) for t in table),
                     skeleton])
    sink = _serde.new_sink(what, spill=True)
    try:
        sink.write(_FIXED.pack(MAPPED, total, meta_len, xxhash.xxh3_64_intdigest(meta)))
        sink.write(meta)
        at = _FIXED.size + meta_len
        for (start, length), (header, raw) in zip(table, images, strict=True):
            sink.write(bytes(start - at))
            sink.write(header)
            if len(raw):
                sink.write(raw)
            at = start + length
        sink.write(bytes(total - at))
    except BaseException:
        sink.reset()
        raise
    return sink.finish()


def _parse(read: Callable[[int, int], bytes], total_found: int
           ) -> tuple[bytes, list[tuple[Any, tuple[int, ...], bool, int]]]:
    """The skeleton of a mapped value and, per array, (dtype, shape, Fortran order, offset
    of its data from the start of the value). ``read(offset, n)`` reads the value;
    ``total_found``: the bytes there are.

    Raises:
        ValueError: the value is cut short or damaged (why)."""
    from numpy.lib import format as npy

    fixed = read(0, _FIXED.size)
    if len(fixed) < _FIXED.size or fixed[:4] != MAPPED:
        raise ValueError("its header is damaged")
    _, total, meta_len, check = _FIXED.unpack(fixed)
    if total != total_found:
        raise ValueError(f"it is {total_found:,} bytes long, not the {total:,} it was written "
                         "with (a truncated or damaged file)")
    meta = read(_FIXED.size, meta_len) if meta_len <= total else b""
    if len(meta) != meta_len or xxhash.xxh3_64_intdigest(meta) != check:
        raise ValueError("its description fails its checksum")
    (count,) = struct.unpack_from("<I", meta)
    arrays = []
    for i in range(count):
        start, length = _ENTRY.unpack_from(meta, 4 + i * _ENTRY.size)
        if start + length > total:
            raise ValueError(f"its array {i} lies past its end")
        head = io.BytesIO(read(start, min(length, 1 << 17)))
        try:
            version = npy.read_magic(head)
            shape, fortran, dtype = (npy.read_array_header_1_0(head) if version == (1, 0)
                                     else npy.read_array_header_2_0(head))
        except Exception as exc:  # noqa: BLE001 - numpy's ValueError, or anything a bad header raises
            raise ValueError(f"the .npy header of its array {i} is damaged ({exc})") from None
        size = dtype.itemsize
        for n in shape:
            size *= n
        if head.tell() + size != length:
            raise ValueError(f"its array {i} holds {length - head.tell():,} bytes, not the "
                             f"{size:,} its .npy header says")
        arrays.append((dtype, tuple(shape), bool(fortran), start + head.tell()))
    return meta[4 + count * _ENTRY.size:], arrays


def _file_reader(f: IO[bytes], base: int) -> Callable[[int, int], bytes]:
    def read(offset: int, n: int) -> bytes:
        f.seek(base + offset)
        return f.read(n)

    return read


def check_mapped(f: IO[bytes], offset: int, size: int | None) -> str | None:
    """The check of a mapped value at ``offset`` in the file ``f`` when it is read: None when
    the value there is not mapped (check it end to end), "" when it is sound, else why not.

    Its whole content was hashed as it was written (the xxh3-128 of its file's header or of
    its journal reference); reading it checks what is cheap and what loading depends on,
    without reading its arrays: the file holds exactly the bytes it was written with (a
    truncated or extended file is refused), its description (the arrays' places and the
    pickle around them) passes its checksum, and each array's ``.npy`` header is sound and
    matches its length. A bit flipped inside an array's data is not noticed on a hit (it is by
    a check that reads everything: a signed store's hits do, see the integrity docs).
    ``size``: the value's length when the store recorded it (else the file's rest)."""
    f.seek(offset)
    if f.read(4) != MAPPED:
        return None
    import os

    found = os.fstat(f.fileno()).st_size - offset
    if size is not None and size != found:
        return (f"its file holds {found:,} bytes, not the {size:,} it was written with "
                "(truncated or damaged)")
    try:
        _parse(_file_reader(f, offset), found)
    except ValueError as exc:
        return str(exc)
    return ""


_warned_unmapped = [False]


def _load_mapped(data: bytes, f: IO[bytes] | None) -> Any:
    """A mapped value: memory maps of the file ``f`` (a :class:`Spilled` value's), else
    read-only views of the bytes ``data``."""
    import numpy as np

    if f is not None:
        assert isinstance(data, _serde.Spilled)
        skeleton, found = _parse(_file_reader(f, data.offset), data.size)
        arrays = [
            np.memmap(f, dtype=dtype, mode="r", offset=data.offset + at, shape=shape,
                      order="F" if fortran else "C")
            if dtype.itemsize and 0 not in shape else _empty(np, dtype, shape, fortran)
            for dtype, shape, fortran, at in found]
    else:
        if not _warned_unmapped[0]:
            _warned_unmapped[0] = True
            warnings.warn(
                "durably: a result stored with @task(mmap=True) came from a store that hands "
                "values back as bytes, not files (the memory store; PostgreSQL below 64 MiB): "
                "its arrays are read-only views of those bytes in memory, not memory maps. "
                "Fix, for arrays larger than memory: use a DiskStore.", stacklevel=4)
        view = memoryview(data)
        skeleton, found = _parse(lambda at, n: bytes(view[at:at + n]), len(data))
        arrays = []
        for dtype, shape, fortran, at in found:
            count = 1
            for n in shape:
                count *= n
            arrays.append(np.frombuffer(data, dtype=dtype, count=count, offset=at).reshape(
                shape, order="F" if fortran else "C") if count and dtype.itemsize
                else _empty(np, dtype, shape, fortran))
    unpickler = pickle.Unpickler(io.BytesIO(skeleton))
    unpickler.persistent_load = arrays.__getitem__  # type: ignore[method-assign]
    return unpickler.load()


def _empty(np: Any, dtype: Any, shape: tuple[int, ...], fortran: bool) -> Any:
    a = np.empty(shape, dtype=dtype, order="F" if fortran else "C")
    a.flags.writeable = False
    return a


def loads_layout(data: bytes, f: IO[bytes] | None = None) -> Any:
    """The value of a compressed or mapped value (see the module): ``f``, the open file of a
    :class:`Spilled` ``data`` (positioned anywhere), else ``data``'s bytes.

    Raises:
        ValueError: ``data`` is neither (a plain pickle is read by ``pickle.loads``), or it
            is a mapped value that is damaged.
        ImportError: a compressed value, and zstandard is not installed."""
    if f is not None:
        assert isinstance(data, _serde.Spilled)
        f.seek(data.offset)
        magic = f.read(4)
    else:
        magic = bytes(data[:4])
    if magic == ZSTD:
        return _load_compressed(data, f)
    if magic == MAPPED:
        return _load_mapped(data, f)
    raise ValueError("not a compressed or mapped value")
