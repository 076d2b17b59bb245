"""Results and arguments to bytes and back.

The standard pickle (protocol 5) is tried first because it is several times faster on plain
data; what it cannot pickle by reference (lambdas, local classes, functions of ``__main__`` in
a notebook) falls back to cloudpickle, which pickles them by value. Either output is read back
with :func:`pickle.load`.

Open files and streams are refused: cloudpickle would store a file opened for reading by its
content and give back an ``io.StringIO``, a different object that only looks like a success.

Large values are streamed: the pickler writes into a sink that keeps the output in memory up
to :data:`SPILL_BYTES`, then moves it to a file and streams the rest there (large ``bytes``
and buffers such as numpy arrays reach the sink as they are, never copied). :func:`dumps` then
returns a :class:`Spilled` handle instead of the bytes, and a store moves that file into
place; :func:`loads` reads it back with :func:`pickle.load`, which fills the value's buffers
straight from the file. So a 2 GB result is never held twice in memory.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import pickle
import stat
import sys
import tempfile
import threading
import types
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

import xxhash

from durably.exceptions import SerializationError, StoreError

__all__ = ["LAYOUTS", "SPILL_BYTES", "SentByReference", "Spilled", "Unreadable", "dumps",
           "host_tag", "loads", "locate_unpicklable", "new_sink", "set_spill_dir", "spill_bytes",
           "spill_stream"]

#: A pickle larger than this many bytes is streamed to a file instead of kept in memory.
SPILL_BYTES = 64 << 20
#: Bytes reserved at the start of a spill file for the store's header (see ``_seal``).
RESERVED = 64

_spill_dir: str | None = None


def set_spill_dir(path: str | os.PathLike[str] | None) -> None:
    """Where large pickles are streamed to: the ``tmp`` directory of the store in use (so a
    store adopts the file by renaming it), else the system's temporary directory."""
    global _spill_dir
    _spill_dir = None if path is None else os.fspath(path)


_HOST_TAG = ""


def host_tag() -> str:
    """8 hex characters naming this host in temporary file names (whose process is gone
    can only be told on the host that made them)."""
    global _HOST_TAG
    if not _HOST_TAG:
        import socket

        _HOST_TAG = xxhash.xxh3_64_hexdigest(socket.gethostname().encode())[:8]
    return _HOST_TAG


def _os_write(fd: int, data: Any) -> int:
    return os.write(fd, data)  # an indirection the fault-injection tests replace


def write_all(fd: int, data: Any) -> None:
    """Write a whole buffer to a file descriptor (a write may be partial)."""
    view = memoryview(data)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    while view.nbytes:
        n = _os_write(fd, view[: 1 << 30])
        view = view[n:]


def open_regular(path: str) -> IO[bytes]:
    """Open a file of a store for reading: a regular file only, never through a symbolic
    link, never a FIFO or a device (one planted in the store would hang the read, or feed
    it for ever).

    Raises:
        OSError: it cannot be opened, or it is not a regular file (``ELOOP``: a link;
            ``EINVAL``: another kind of file).
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        if flags & getattr(os, "O_NONBLOCK", 0):  # (as a regular file reads: blocking)
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class Spilled(bytes):
    """A pickled value kept in a file rather than in memory (larger than SPILL_BYTES).

    Its bytes are a short description, never the pickle: stores that know the type (every
    durably store) keep the file; :func:`loads` reads the value from it.

    Attributes:
        path: The file (absolute).
        offset: Where the pickle starts in it (bytes).
        size: Length of the pickle (bytes); ``len()`` gives it too.
        digest: xxh3-128 of the pickle.
        header_free: Whether the reserved header bytes before ``offset`` are still unused.
        macs: Content MACs computed so far, by signing key id.
    """

    path: str
    offset: int
    size: int
    digest: bytes
    header_free: bool
    macs: dict[bytes, bytes]
    _file: IO[bytes] | None
    _check: Callable[[IO[bytes] | OSError], None] | None
    _owned: str | None
    #: another handle whose file this one describes a part of (kept alive with it: its
    #: owner deletes the file when dropped)
    keep: Spilled | None

    def __new__(cls, path: str, offset: int, size: int, digest: bytes, *, owned: bool = False,
                header_free: bool = False, file: IO[bytes] | None = None,
                check: Callable[[IO[bytes] | OSError], None] | None = None) -> Spilled:
        self = super().__new__(cls, f"<durably: {size}-byte pickle in {path}>".encode())
        self.path = path
        self.offset = offset
        self.size = size
        self.digest = digest
        self.header_free = header_free
        self.macs = {}
        self._file = file
        self._check = check
        self._owned = path if owned else None
        self.keep = None
        return self

    def __len__(self) -> int:
        return self.size

    def __reduce__(self) -> Any:
        raise TypeError("a durably Spilled value lives in a local file and cannot be pickled")

    def open(self) -> IO[bytes]:
        """The file, positioned at the pickle; checked first when it came from a store."""
        f, self._file = self._file, None
        if f is None or f.closed:
            try:
                f = open_regular(self.path)  # (the caller closes it)
            except OSError as exc:
                if self._check is not None:
                    self._check(exc)  # (says what it means for the store it came from)
                raise
            if self._check is not None:
                try:
                    self._check(f)
                except BaseException:
                    f.close()
                    raise
        f.seek(self.offset)
        return f

    def moved(self, path: str) -> None:
        """The file was renamed to ``path`` (by a store adopting it)."""
        if self._owned is not None:
            self._owned = None
        self.path = path

    def discard(self) -> None:
        """Close the file and delete it if nobody adopted it."""
        f, self._file = self._file, None
        if f is not None:
            f.close()
        owned, self._owned = self._owned, None
        if owned is not None:
            with contextlib.suppress(OSError):
                os.unlink(owned)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.discard()


class Unreadable(bytes):
    """A stored blob that failed its check: loading it raises the error it carries, so a
    damaged value is never unpickled and the failure names its run."""

    error: Exception

    def __new__(cls, error: Exception) -> Unreadable:
        self = super().__new__(cls, b"")
        self.error = error
        return self


# in-memory buffers are values (plain pickle stores them as they are), not OS handles
_IN_MEMORY = (io.BytesIO, io.StringIO)


_PICKLER: Any = None


def pickler_class() -> Any:
    """The cloudpickle-based pickler that refuses open files (cloudpickle is imported on
    first use: most values are stored with plain pickle)."""
    global _PICKLER
    if _PICKLER is None:
        import cloudpickle

        class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
            """cloudpickle, refusing open files and streams anywhere in the value."""

            def __init__(self, file: Any, what: str) -> None:
                super().__init__(file, protocol=5)
                self.what = what

            def reducer_override(self, obj: Any) -> Any:
                if isinstance(obj, io.IOBase) and not isinstance(obj, _IN_MEMORY):
                    t = type(obj)
                    name = getattr(obj, "name", None)
                    shown = f" {name!r}" if isinstance(name, (str, bytes, int)) else ""
                    raise SerializationError(
                        f"cannot store {self.what}: it holds an open file or stream "
                        f"({t.__module__}.{t.__qualname__}{shown}), which cannot be stored. "
                        "Fix: use its path (or the data read from it) instead of the open "
                        "file."
                    )
                return super().reducer_override(obj)

        _PICKLER = _Pickler
    return _PICKLER


if TYPE_CHECKING:
    class _Pickler(pickle.Pickler):
        """(for type checkers: the class :func:`pickler_class` returns)"""

        what: str

        def __init__(self, file: Any, what: str) -> None: ...

        def reducer_override(self, obj: Any) -> Any: ...
else:
    def __getattr__(name: str) -> Any:
        if name == "_Pickler":
            return pickler_class()
        raise AttributeError(f"module 'durably._keys.serde' has no attribute {name!r}")


class SentByReference:
    """A mixin for durably's objects another process finds by name (tasks, entrypoints):
    the pickler of what travels to a worker process asks each how it is sent."""

    __slots__ = ()

    def _reduce_for_worker(self, by_value: set[int]) -> Any:
        """How this object is sent to a worker: by name (its ``__reduce_ex__``), unless it
        sends itself by value; ``by_value`` holds the ids of the objects being sent by
        value already (a recursive task refers to itself by name)."""
        return self.__reduce_ex__(5)


class _Sink:
    """Where a pickler writes: memory up to the spill limit, then a file."""

    __slots__ = ("chunks", "fd", "hasher", "limit", "path", "size", "what")

    def __init__(self) -> None:
        self.chunks: list[Any] = []
        self.size = 0
        self.fd = -1
        self.path = ""
        self.hasher: Any = None
        self.limit = SPILL_BYTES
        self.what = ""

    def write(self, data: Any) -> int:
        n = len(data) if type(data) is bytes else memoryview(data).nbytes
        self.size += n
        if self.fd < 0:
            self.chunks.append(data)
            if self.size > self.limit:
                self._spill()
            return n
        self._stream(data)
        return n

    def _spill(self) -> None:
        folder = _spill_dir or tempfile.gettempdir()
        prefix = f"spill-{os.getpid()}-{host_tag()}-"
        try:
            try:
                os.makedirs(folder, mode=0o700, exist_ok=True)
            except FileNotFoundError:  # the store in use was removed: the system's tmp
                folder = tempfile.gettempdir()
            self.fd, self.path = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
        except OSError as exc:
            raise self._error(exc, folder) from None
        self.hasher = xxhash.xxh3_128()
        chunks, self.chunks = self.chunks, []
        self._stream(bytes(RESERVED), hash_it=False)
        for chunk in chunks:
            self._stream(chunk)

    def _stream(self, data: Any, hash_it: bool = True) -> None:
        if hash_it:
            self.hasher.update(data)
        try:
            write_all(self.fd, data)
        except OSError as exc:
            raise self._error(exc, self.path) from None

    def _error(self, exc: OSError, where: str) -> StoreError:
        size = self.size  # (before reset() forgets it)
        self.reset()
        full = getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        hint = ("the disk is full: free space (the value needs about "
                f"{size:,} bytes or more), then rerun; finished steps are kept."
                if full else "check the store's permissions, or set DURABLY_DIR.")
        return StoreError(
            f"cannot write {self.what} ({size:,} bytes so far) to {where}: "
            f"{exc.strerror or exc}. Nothing was stored. Fix: {hint}"
        )

    def reset(self) -> None:
        self.chunks = []
        self.size = 0
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        self.fd = -1
        self.path = ""
        self.hasher = None

    def finish(self) -> bytes:
        if self.fd < 0:
            chunks = self.chunks
            self.chunks = []
            self.size = 0
            if len(chunks) == 1 and type(chunks[0]) is bytes:
                return chunks[0]
            return b"".join(chunks)
        fd, path, size, digest = self.fd, self.path, self.size, self.hasher.digest()
        self.fd, self.path, self.hasher, self.size = -1, "", None, 0
        os.close(fd)
        return Spilled(os.path.abspath(path), RESERVED, size, digest, owned=True,
                       header_free=True)


class _Local(threading.local):
    sink: _Sink | None = None
    pickler: Any = None
    main: dict[str, str] | None = None  # (what the pickler was made for: _main_as_module)
    busy = False


_local = _Local()


def dumps(obj: Any, *, what: str) -> bytes:
    """Pickle ``obj``; ``what`` names it in the error ("the result of task 'x'").

    A pickle larger than :data:`SPILL_BYTES` comes back as a :class:`Spilled` file handle.

    Raises:
        SerializationError: neither pickle nor cloudpickle can serialize the value, or it
            holds an open file or stream.
        StoreError: a large value could not be written to its file (a full disk).

    Example:
        >>> from durably._keys.serde import dumps, loads
        >>> loads(dumps({"a": [1, 2]}, what="x"))
        {'a': [1, 2]}
    """
    local = _local
    if local.busy:  # a __reduce__ that pickles through durably: use a fresh sink
        return _dumps_fresh(obj, what)
    sink = local.sink
    main = _main_as_module()
    if sink is None or local.main is not main:
        sink = local.sink = _Sink()
        local.pickler, local.main = _plain_pickler(sink, main), main
    sink.limit = SPILL_BYTES
    sink.what = what
    local.busy = True
    try:
        pickler = local.pickler
        pickler.clear_memo()
        pickler.dump(obj)
        return sink.finish()
    except StoreError:
        local.sink = local.pickler = None
        raise
    except Exception:  # noqa: BLE001 - fall back to the slower, more capable pickler
        sink.reset()
        local.sink = local.pickler = None  # its state is unknown after a failure
    finally:
        if local.pickler is not None:
            local.pickler.clear_memo()  # never keep the value alive through the memo
        local.busy = False
    return _dumps_fresh(obj, what, cloud=True)


#: the names a script's module runs under: ``__main__``, and ``__mp_main__`` when
#: multiprocessing runs it again in a process it spawned
MAIN_MODULES = ("__main__", "__mp_main__")


_main_seen: list[Any] = [None, None]  # (the __main__ module looked at, what it ran as)


def _main_as_module() -> dict[str, str] | None:
    """When the script runs as a module (``python -m job``): its module names (``__main__``,
    ``__mp_main__``) and the name it is imported by; else None. (Looked at again only when
    ``__main__`` is another module: every executed step asks.)"""
    main = sys.modules.get("__main__")
    if main is _main_seen[0]:
        return _main_seen[1]  # type: ignore[no-any-return]
    found = {}
    for alias in MAIN_MODULES:
        spec = getattr(sys.modules.get(alias), "__spec__", None)
        name = getattr(spec, "name", None)
        # (not a package's __main__, `python -m app`: importing it runs the program)
        if isinstance(name, str) and name and name.rpartition(".")[2] not in MAIN_MODULES:
            found[alias] = name
    _main_seen[:] = [main, found or None]
    return found or None


def _attribute(root: Any, qualname: str) -> Any:
    """The object named ``qualname`` (dotted) in ``root``.

    Raises:
        AttributeError: there is none."""
    for part in qualname.split("."):
        root = getattr(root, part)
    return root


def main_global(module: str, qualname: str) -> Any:
    """What a class or function of a script run as ``python -m module`` is pickled as
    (:func:`dumps`): the object named ``qualname`` in ``module``, read from the script's
    ``__main__`` when this process runs that module as its script (not imported a second
    time), else from the module imported. So a value a task of ``python -m job`` returned
    loads in a process that imports ``job`` (the task's identity is ``job:task`` in both,
    and they share its cache entries), and in a later ``python -m job``.

    Raises:
        ImportError: the module cannot be imported, or it is a package's ``__main__``
            (importing it would run the program).
        AttributeError: it defines no such name.

    Example:
        >>> main_global("collections", "OrderedDict.fromkeys").__qualname__
        'OrderedDict.fromkeys'
    """
    found: Any = None
    for alias in MAIN_MODULES:
        main = sys.modules.get(alias)
        if getattr(getattr(main, "__spec__", None), "name", None) == module:
            found = main
            break
    if found is None:
        if module.rpartition(".")[2] == "__main__":
            raise ImportError(f"{module} is a program (a package's __main__): durably does "
                              "not import it to load a value, which would run it")
        import importlib

        found = importlib.import_module(module)
    return _attribute(found, qualname)


def _found_in(module: Any, qualname: str, obj: Any) -> bool:
    """Whether ``module`` holds ``obj`` under ``qualname`` (what plain pickle checks before it
    pickles an object by its name: code run with ``exec`` in a namespace of its own says
    ``__main__`` without being there)."""
    try:
        return _attribute(module, qualname) is obj
    except Exception:  # noqa: BLE001 - not there, or a failing __getattr__
        return False


class _MainPickler(pickle.Pickler):
    """Plain pickle, naming the classes and functions of a script run as ``python -m job``
    by :func:`main_global` of ``job`` (``reducer_override`` is not called for ints, floats,
    strings, bytes and plain containers: a large array or list costs no more)."""

    def __init__(self, file: Any, main: dict[str, str]) -> None:
        super().__init__(file, protocol=5)
        self.main = main

    def reducer_override(self, o: Any) -> Any:
        if isinstance(o, (type, types.FunctionType)):
            alias = getattr(o, "__module__", None) or ""
            module = self.main.get(alias)
            qualname = getattr(o, "__qualname__", "")
            if module is not None and isinstance(qualname, str) and (
                    "<" not in qualname and _found_in(sys.modules.get(alias), qualname, o)):
                return main_global, (module, qualname)
        return NotImplemented


def _plain_pickler(sink: _Sink, main: dict[str, str] | None) -> pickle.Pickler:
    """The pickler :func:`dumps` tries first: plain pickle, or under ``python -m job``
    (``main``, see :func:`_main_as_module`) one that names the script's classes and
    functions by ``job`` (:class:`_MainPickler`)."""
    if main is None:
        return pickle.Pickler(sink, protocol=5)
    return _MainPickler(sink, main)


def _dumps_fresh(obj: Any, what: str, cloud: bool = False) -> bytes:
    sink = _Sink()
    sink.what = what
    if not cloud:
        try:
            _plain_pickler(sink, _main_as_module()).dump(obj)
            return sink.finish()
        except StoreError:
            raise
        except Exception:  # noqa: BLE001 - fall back to cloudpickle
            sink.reset()
    try:
        pickler_class()(sink, what).dump(obj)
        return sink.finish()
    except StoreError:
        sink.reset()
        raise
    except SerializationError as exc:  # (an open file): where it is in the value
        sink.reset()
        head = f"cannot store {what}"
        text = str(exc)
        if text.startswith(head):
            raise SerializationError(f"{head}{_at(what, obj)}{text[len(head):]}") from None
        raise
    except Exception as exc:  # noqa: BLE001 - any failure: report it as ours
        sink.reset()
        at = _at(what, obj)
        # (the part at fault, when it is found: not the container around it)
        what_type = "that part" if at else (
            f"a value of type {type(obj).__module__}.{type(obj).__qualname__}")
        raise SerializationError(
            f"cannot store {what}{at}: {what_type} cannot be pickled ({exc}). Fix: return "
            "plain data "
            "(a list instead of a generator, a path instead of an open file, no locks or "
            "connections)."
        ) from None


#: the words a value is named by in the path :func:`dumps` reports (from its ``what``)
_ROOTS = ("result", "arguments", "argument", "payload", "answer", "state", "input", "update",
          "event", "graph")


def _at(what: str, obj: Any) -> str:
    """`` (at result['conn'])``: where in ``obj`` the part that cannot be pickled is, named
    after ``what`` ("the result of task 'f'": ``result``); "" when it is ``obj`` itself."""
    root = next((w for w in what.replace("'", " ").split() if w in _ROOTS), "value")
    where = locate_unpicklable(root, obj)
    return "" if where is None else f" (at {where})"


class _Discard:
    """A file that forgets what is written to it (the pickles of :func:`locate_unpicklable`)."""

    def write(self, data: Any) -> int:
        return len(data) if type(data) is bytes else memoryview(data).nbytes


def _pickles(value: Any) -> None:
    """Pickle ``value`` as :func:`dumps` would at worst (cloudpickle, refusing open files),
    writing nothing.

    Raises:
        Exception: it cannot be pickled."""
    pickler_class()(_Discard(), "").dump(value)


def locate_unpicklable(name: str, value: Any, limit: int = 10_000,
                       pickles: Callable[[Any], object] = _pickles) -> str | None:
    """Where in a value the part that cannot be pickled sits, as Python would write it
    (``result['conn']``, ``rows[3].lock``): the path to the first part ``pickles`` raises on,
    searched depth first through lists, tuples, dicts, sets and objects' attributes,
    checking at most ``limit`` parts (see ``_hashing.locate_part``). None when the value
    itself is that part, or when nothing is found. Only for an error message, after a
    failure: it pickles the parts again.

    Args:
        name: What the value is called (the start of the path).
        value: The value that failed to pickle.
        limit: The most parts pickled in the search.
        pickles: Pickles one part, raising when it cannot (by default as :func:`dumps`
            does at worst: cloudpickle, refusing open files).

    Example:
        >>> import threading
        >>> locate_unpicklable("result", {"n": 1, "conn": threading.Lock()})
        "result['conn']"
    """
    from durably._keys.hashing import locate_part  # (the search digest errors use too)

    return locate_part(name, value, pickles, limit)


def spill_bytes(data: bytes, what: str) -> Spilled:
    """A pickle given as bytes, moved to a spill file (for stores that keep large values in
    files)."""
    sink = _Sink()
    sink.what = what
    sink.limit = -1
    sink.write(data)
    spilled = sink.finish()
    assert isinstance(spilled, Spilled)
    return spilled


def spill_stream(file: IO[bytes], size: int, what: str, head: bytes = b"") -> Spilled:
    """``head`` then ``size`` bytes read from ``file`` (from where it is), copied to a spill
    file a chunk at a time: a large value moved without being held in memory.

    Raises:
        StoreError: ``file`` ends before ``size`` bytes, or the spill file cannot be written.
    """
    sink = _Sink()
    sink.what = what
    sink.limit = -1
    try:
        if head:
            sink.write(head)
        left = size
        while left:
            chunk = file.read(min(8 << 20, left))
            if not chunk:
                raise StoreError(f"{what} is cut short ({size - left:,} of {size:,} bytes). "
                                 "Fix: check where it is kept.")
            sink.write(chunk)
            left -= len(chunk)
        spilled = sink.finish()
    except BaseException:
        sink.reset()
        raise
    assert isinstance(spilled, Spilled)
    return spilled


def new_sink(what: str, spill: bool = False) -> _Sink:
    """A sink for a value ``what`` names: in memory up to :data:`SPILL_BYTES`, then a file
    (``spill``: a file from the first byte). ``finish()`` gives the value, as :func:`dumps`."""
    sink = _Sink()
    sink.what = what
    if spill:
        sink.limit = -1
    return sink


#: the first bytes of a value stored in another layout than a plain pickle (compressed,
#: mapped: see :mod:`durably._keys.layouts`); no pickle starts with them
LAYOUTS = (b"DRZ1", b"DRM1")


def loads(data: bytes) -> Any:
    """Unpickle what :func:`dumps` wrote (bytes, or a :class:`Spilled` file), by this
    release or an older one (whose modules had other names: see :mod:`durably._keys.moved`),
    or a value of another layout (compressed, mapped: :mod:`durably._keys.layouts`).

    Raises:
        CorruptJournalError: ``data`` is a stored blob that failed its check.
    """
    if type(data) is bytes:
        try:
            return pickle.loads(data)
        except pickle.UnpicklingError:
            if data[:4] not in LAYOUTS:
                raise
        from durably._keys.layouts import loads_layout

        return loads_layout(data)
    if isinstance(data, Spilled):
        with data.open() as f:
            if f.read(4) in LAYOUTS:
                from durably._keys.layouts import loads_layout

                return loads_layout(data, f)
            f.seek(data.offset)
            return pickle.load(f)
    if isinstance(data, Unreadable):
        raise data.error
    if bytes(data[:4]) in LAYOUTS:
        from durably._keys.layouts import loads_layout

        return loads_layout(data)
    return pickle.loads(data)
