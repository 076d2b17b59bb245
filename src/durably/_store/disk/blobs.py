"""The files of a :class:`~durably.DiskStore` besides its databases.

Layout of a store directory::

    FORMAT            "durably-store <n>": the layout version
    journal.sqlite3   runs, steps, events, leases, key records (SQLite, WAL)
    cache/            the cache (diskcache: its index cache.db and value files)
    blobs/            large values the journals refer to (never evicted, like journals)
    tmp/              spill files of large values being written (removed once their
                      process is gone)
    damaged/          entries found damaged, kept for inspection; never read again

The diskcache :class:`Disk` used here (:func:`disk_class`) stores only byte strings and files
durably prepared, never unpickles what the index holds (a row that says "pickle" is reported
as garbage, not loaded), and never touches a file outside ``cache/`` whatever a row names.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import itertools
import json
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from durably._keys.layouts import check_mapped
from durably._keys.serde import Spilled, host_tag, open_regular, spill_bytes
from durably._store.integrity import (
    LARGE_HEADER,
    LARGE_MAGICS,
    SigningKey,
    check_large_header,
    large_header,
    read_large_header,
    scan,
)
from durably.exceptions import StoreError

__all__ = ["BLOB_REF", "FileValue", "Garbage", "LinkIn", "as_spilled", "blob_ref", "clean_tmp",
           "content_mac", "copy_with_header", "disk_class", "large_for_cache",
           "large_from_cache", "open_blob", "place", "same_content", "set_aside",
           "set_aside_before", "share_bits", "share_file", "subdir", "valid_blob_name"]

#: A journal value that lives in ``blobs/`` is stored as this prefix and a JSON reference.
BLOB_REF = b"DRBLOB1\n"
_BLOB_NAME = re.compile(r"[0-9a-f]{32}")
_VALUE_FILE = re.compile(r"[0-9a-f]{2}[/\\][0-9a-f]{2}[/\\][0-9a-f]{28}\.val")
_TEMP = re.compile(r"(?:spill|copy|hold)-(\d+)-([0-9a-f]{8})-")
_CHUNK = 8 << 20
_counter = itertools.count()


def share_bits(root: Path) -> int:
    """The group and other permission bits of the store directory: 0 for a private store
    (the default), else what everything durably creates inside it is given too."""
    try:
        return stat.S_IMODE(os.stat(root).st_mode) & 0o077
    except OSError:
        return 0


def subdir(root: Path, name: str) -> Path:
    """``root/name``, created as private as the store (or as shared, for a shared store)."""
    folder = root / name
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        if folder.is_symlink() or not folder.is_dir():
            from durably.exceptions import StoreError

            raise StoreError(
                f"refusing to use {folder}: it is a symbolic link or not a folder, and "
                "durably never reads or writes through links inside a store. Fix: remove it "
                "(durably creates it again), or move the store aside.") from None
        return folder
    bits = share_bits(root)
    if bits:
        os.chmod(folder, 0o700 | bits | (os.stat(root).st_mode & stat.S_ISGID))
    return folder


def share_file(root: Path, path: str | Path) -> None:
    """Give a file durably created the store's sharing (read/write for the group of a shared
    store); nothing for a private store, or a file another member created."""
    bits = share_bits(root) & 0o066
    if bits:
        with contextlib.suppress(OSError):
            os.chmod(path, 0o600 | bits)


def valid_blob_name(name: Any) -> bool:
    return isinstance(name, str) and _BLOB_NAME.fullmatch(name) is not None


class LinkIn:
    """A prepared file for the cache to take as a value (hard-linked, else copied)."""

    __slots__ = ("path", "size")

    def __init__(self, path: str, size: int) -> None:
        self.path = path
        self.size = size


class FileValue:
    """A cache value kept in a file: its bytes (a sealed value) or, for a large value, the
    open file (positioned after its magic)."""

    __slots__ = ("data", "file", "path")

    def __init__(self, path: str, data: bytes | None, file: IO[bytes] | None) -> None:
        self.path = path
        self.data = data
        self.file = file


class Garbage:
    """An index row that is not a durably value (what it held, and why it was refused)."""

    __slots__ = ("raw", "why")

    def __init__(self, why: str, raw: Any) -> None:
        self.why = why
        self.raw = raw

    def as_bytes(self) -> bytes:
        raw = self.raw
        if isinstance(raw, (bytes, bytearray, memoryview)):
            return bytes(raw)
        return repr(raw).encode()


def place(src: str, dest: str) -> None:
    """Put the file ``src`` at the new path ``dest``: a hard link (no copy, no space), else
    a copy; a partial copy is removed."""
    try:
        os.link(src, dest)
        return
    except FileNotFoundError:
        raise
    except OSError:
        pass  # another filesystem, or one without hard links: copy
    try:
        with open(src, "rb") as r, open(dest, "xb") as w:
            shutil.copyfileobj(r, w, _CHUNK)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(dest)
        raise


def copy_with_header(src: IO[bytes], dest: str, header: bytes) -> int:
    """Write ``header`` then the rest of ``src`` to a new file; returns the bytes written."""
    try:
        with open(dest, "xb") as w:
            w.write(header)
            size = len(header)
            while chunk := src.read(_CHUNK):
                w.write(chunk)
                size += len(chunk)
        return size
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(dest)
        raise


def _write_new(path: str, data: bytes) -> None:
    try:
        with open(path, "xb") as w:
            w.write(data)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)  # never leave a partial file taking the space a retry needs
        raise


def temp_name(folder: Path, kind: str) -> str:
    """A new temporary file name in ``folder`` that :func:`clean_tmp` recognises."""
    return str(folder / f"{kind}-{os.getpid()}-{host_tag()}-{os.urandom(8).hex()}.tmp")


def clean_tmp(folder: Path) -> int:
    """Remove the spill and copy files left by processes of this host that are gone."""
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    removed = 0
    mine = host_tag()
    for name in names:
        m = _TEMP.match(name)
        if m is None or m.group(2) != mine:
            continue
        pid = int(m.group(1))
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue  # alive (or reused: kept; it is only space)
        except ProcessLookupError:
            pass
        except OSError:
            continue
        with contextlib.suppress(OSError):
            os.unlink(folder / name)
            removed += 1
    return removed


def _safe_stem(stem: str) -> str:
    """The start of the name :func:`set_aside` keeps an entry under."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem)[:120] or "entry"


def set_aside_before(root: Path, stem: str) -> bool:
    """Whether :func:`set_aside` kept an entry of this ``stem`` already."""
    folder = root / "damaged"
    return folder.is_dir() and any(folder.glob(f"{glob.escape(_safe_stem(stem))}-*"))


def set_aside(root: Path, stem: str, *, path: str | None = None, data: bytes | None = None
              ) -> Path:
    """Keep a damaged entry in ``<root>/damaged/<stem>-<time>``: the file moved there, else
    the bytes written there. Returns where it is."""
    folder = subdir(root, "damaged")
    safe = _safe_stem(stem)
    dest = folder / (f"{safe}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
                     f"-{next(_counter)}")
    if path is not None:
        try:
            os.replace(path, dest)
            return dest
        except OSError:
            pass
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data if data is not None else b"")
    return dest


_DISK: Any = None


def disk_class() -> Any:
    """The diskcache ``Disk`` durably's caches use (defined on first use: diskcache is
    imported lazily)."""
    global _DISK
    if _DISK is not None:
        return _DISK
    import diskcache
    from diskcache.core import MODE_BINARY, MODE_RAW, UNKNOWN

    class DurablyDisk(diskcache.Disk):  # type: ignore[misc]
        """Byte strings and prepared files only; never unpickles, never strays."""

        def get(self, key: Any, raw: bool) -> Any:
            if raw:
                return super().get(key, raw)
            return "<a key durably did not write>"  # never unpickle what the index holds

        def _folders(self, full_path: str) -> None:
            """The two levels of folders of a value file, as shared as the cache."""
            folder = os.path.dirname(full_path)
            if os.path.isdir(folder):
                return
            os.makedirs(folder, exist_ok=True)
            cache = Path(self._directory)
            bits = share_bits(cache)
            if bits:
                for made in (folder, os.path.dirname(folder)):
                    with contextlib.suppress(OSError):
                        os.chmod(made, 0o700 | bits | (os.stat(cache).st_mode & stat.S_ISGID))

        def _in_folder(self, full_path: str, write: Callable[[], None]) -> None:
            """Make the value file's folders, then ``write``; again if the folder vanished in
            between (an older durably, or diskcache itself, removing empty folders)."""
            for attempt in range(3):
                try:
                    self._folders(full_path)
                    write()
                    return
                except FileNotFoundError:
                    if attempt == 2 or os.path.isdir(os.path.dirname(full_path)):
                        raise

        def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> Any:
            if isinstance(value, LinkIn):
                filename, full_path = self.filename(key, value)
                self._in_folder(full_path, lambda: place(value.path, full_path))
                return value.size, MODE_BINARY, filename, None
            if type(value) is bytes and len(value) >= self.min_file_size:
                filename, full_path = self.filename(key, value)
                self._in_folder(full_path, lambda: _write_new(full_path, value))
                share_file(Path(self._directory), full_path)
                return len(value), MODE_BINARY, filename, None
            if type(value) is not bytes:
                raise TypeError(f"durably's cache stores bytes, not {type(value).__name__}")
            return super().store(value, read, key)

        def fetch(self, mode: int, filename: Any, value: Any, read: bool) -> Any:
            if mode == MODE_RAW:
                if type(value) is bytes:
                    return value
                return Garbage(f"its index row holds a {type(value).__name__}, not bytes",
                               value)
            if mode == MODE_BINARY and isinstance(filename, str) \
                    and _VALUE_FILE.fullmatch(filename):
                path = os.path.join(self._directory, filename)
                try:
                    f = open_regular(path)  # (another OSError is a miss, as diskcache's)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.EINVAL):
                        raise
                    return Garbage(f"its file {path} is not a regular file (a link, a FIFO "
                                   "or a device: durably never reads through one)", value)
                head = f.read(4)
                if head in LARGE_MAGICS:
                    return FileValue(path, None, f)
                with f:
                    return FileValue(path, head + f.read(), None)
            return Garbage(f"its index row is not a value durably wrote (mode {mode!r}, "
                           f"file {filename!r})", value)

        def remove(self, file_path: Any) -> None:
            """Remove a value file, never its folders: diskcache's ``removedirs`` raced with
            another process's ``makedirs`` of the same folder (ENOENT mid-write). At most
            65,536 empty folders can stay behind."""
            if isinstance(file_path, str) and _VALUE_FILE.fullmatch(file_path):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self._directory, file_path))

    _DISK = DurablyDisk
    return _DISK


# -- large values ----------------------------------------------------------------------------
def as_spilled(value: bytes) -> Spilled:
    """A large value as a file handle (plain bytes are written to a spill file)."""
    if isinstance(value, Spilled):
        return value
    return spill_bytes(value, "a large value")


def content_mac(value: Spilled, signer: SigningKey) -> bytes:
    """The HMAC of a large value's content (one pass over its file, once per key)."""
    mac = value.macs.get(signer.id)
    if mac is None:
        with open(value.path, "rb") as f:
            digest, mac, _ = scan(f, value.offset, signer)
        if digest != value.digest or mac is None:
            raise StoreError(f"the large value file {value.path} changed while it was being "
                             "stored. Fix: rerun.")
        value.macs[signer.id] = mac
    return mac


def large_from_cache(root: Path, found: FileValue, signer: SigningKey | None, context: bytes
                     ) -> tuple[Spilled | None, str]:
    """A large cache value checked end to end, or (None, why). The file is first pinned by a
    private hard link in ``tmp/``: another process overwriting the entry deletes the cache's
    name for it, and the journal may still need to link it (the pin goes with the handle)."""
    f = found.file
    assert f is not None
    path = found.path
    owned = False
    try:
        pin = temp_name(subdir(root, "tmp"), "hold")
        try:
            os.link(found.path, pin)
            if os.stat(pin).st_ino == os.fstat(f.fileno()).st_ino:
                path, owned = pin, True
            else:  # replaced in between: keep a copy of what was opened (below)
                os.unlink(pin)
        except FileNotFoundError:
            pass  # removed in between: keep a copy of what was opened (below)
        except OSError:
            pin = ""  # no hard links here: the cache's name it is
        if pin and not owned:
            # the cache's name is gone or names another file now, and the journal may need
            # to keep this value: a private copy, from the handle opened before
            f.seek(0)
            try:
                with open(pin, "xb") as w:
                    shutil.copyfileobj(f, w, _CHUNK)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(pin)
                raise
            path, owned = pin, True
        f.seek(0)
        head = f.read(LARGE_HEADER)
        # a mapped value (@task(mmap=True)) is checked without reading its arrays (see
        # check_mapped); with a key, every value is read end to end, its MAC checked
        mapped = check_mapped(f, LARGE_HEADER, None) if signer is None else None
        if mapped is None:
            digest, mac, size = scan(f, LARGE_HEADER, signer)
        else:
            fields = read_large_header(head)
            digest, mac = (fields[1] if fields is not None else b""), None
            size = os.fstat(f.fileno()).st_size - LARGE_HEADER
    except BaseException:
        f.close()
        if owned:
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise
    why = mapped or check_large_header(head, digest, mac, signer, context)
    if why:
        f.close()
        if owned:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return None, why

    def check(again: IO[bytes] | OSError) -> None:
        if isinstance(again, OSError):
            raise StoreError(f"the cache value file {path} cannot be read ({again}). Fix: "
                             "rerun (it will be recomputed).")
        if mapped is not None:
            if check_mapped(again, LARGE_HEADER, size):
                raise StoreError(f"the cache value file {path} changed after it was checked. "
                                 "Fix: rerun (it will be recomputed).")
        elif scan(again, LARGE_HEADER, None)[0] != digest:
            raise StoreError(f"the cache value file {path} changed after it was checked. "
                             "Fix: rerun (it will be recomputed).")

    value = Spilled(path, LARGE_HEADER, size, digest, file=f, check=check, owned=owned)
    if signer is not None and mac is not None:
        value.macs[signer.id] = mac
    return value, ""


def large_for_cache(root: Path, value: Spilled, signer: SigningKey | None, context: bytes,
                    temps: list[str]) -> LinkIn:
    """A file for the cache to link in: the spill file with its header written in the
    bytes reserved for it, or (when those are taken) a copy with this entry's header."""
    mac = content_mac(value, signer) if signer is not None else None
    header = large_header(value.digest, signer, context, mac)
    size = LARGE_HEADER + value.size
    if value.header_free and value.offset == LARGE_HEADER:
        with open(value.path, "r+b") as f:
            f.write(header)
        value.header_free = False
        share_file(root, value.path)
        return LinkIn(value.path, size)
    temp = temp_name(subdir(root, "tmp"), "copy")
    temps.append(temp)
    with value.open() as src:
        copy_with_header(src, temp, header)
    share_file(root, temp)
    return LinkIn(temp, size)


def same_content(value: Spilled, stored: Spilled, root: Path) -> bool:
    """Whether ``stored``, a value the journal keeps in ``blobs/``, holds the very bytes of
    ``value`` (compared byte for byte, not by digest alone), its file ending with them as
    its reference says: a journal can refer to it instead of keeping another copy."""
    if (stored.size != value.size or stored.digest != value.digest
            or os.path.dirname(stored.path) != str(root / "blobs")):
        return False
    try:
        with open(stored.path, "rb") as old, open(value.path, "rb") as new:
            if os.fstat(old.fileno()).st_size != stored.offset + stored.size:
                return False
            old.seek(stored.offset)
            new.seek(value.offset)
            left = value.size
            while left:
                n = min(left, _CHUNK)
                chunk = old.read(n)
                if len(chunk) != n or chunk != new.read(n):
                    return False
                left -= n
            return True
    except OSError:
        return False  # (missing, unreadable: another copy is written)


def blob_ref(root: Path, value: Spilled, signer: SigningKey | None,
             placed: list[str] | None = None) -> bytes:
    """Keep a large value in ``blobs/`` under a new name (a hard link to its file, else a
    copy); the reference a journal stores instead of the value. ``placed``: the path of the
    file this call put in ``blobs/`` is appended to it.

    A value already in ``blobs/`` (a fork's copy of a step, a finished run's result stored
    again) gets a new name too, linked to the same file (no space): each name is referred to
    by the records written with it, so :meth:`DiskStore.collect_blobs` never removes a name
    that a write under way is about to refer to (a new name is younger than its grace, and a
    name removed before it was linked raises FileNotFoundError: never a reference to
    nothing)."""
    blobs = root / "blobs"
    name = uuid.uuid4().hex
    dest = str(subdir(root, "blobs") / name)
    place(value.path, dest)
    if placed is not None:
        placed.append(dest)
    if os.path.dirname(value.path) != str(blobs):
        share_file(root, blobs / name)
    mac = content_mac(value, signer) if signer is not None else None
    ref = {"blob": name, "offset": value.offset, "size": value.size,
           "xxh3": value.digest.hex(), "mac": None if mac is None else mac.hex()}
    return BLOB_REF + json.dumps(ref, sort_keys=True).encode()


def open_blob(root: Path, ref: bytes, signer: SigningKey | None, eager: bool,
              error: Callable[[str], Exception]) -> tuple[Spilled | None, str]:
    """The large value a journal reference names, checked end to end now (``eager``), or
    when it is loaded (a failure then raises ``error(why)``); or (None, why)."""
    try:
        info = json.loads(ref[len(BLOB_REF):])
        name, offset, size = info["blob"], int(info["offset"]), int(info["size"])
        digest = bytes.fromhex(info["xxh3"])
        mac = None if info.get("mac") is None else bytes.fromhex(info["mac"])
    except (ValueError, KeyError, TypeError):
        return None, "its reference to a large value is garbage"
    if not valid_blob_name(name) or offset < 0 or size < 0:
        return None, "its reference to a large value is garbage"
    path = str(root / "blobs" / name)

    def verify(f: IO[bytes]) -> str:
        try:
            mapped = check_mapped(f, offset, size) if signer is None else None
            if mapped is not None:  # (see large_from_cache)
                return f"its file {path} is damaged: {mapped}" if mapped else ""
            found, found_mac, n = scan(f, offset, signer)
        except OSError as exc:
            return f"its file {path} cannot be read ({exc})"
        if n != size or found != digest:
            return f"its file {path} is damaged or truncated (it fails its checksum)"
        if signer is not None and (mac is None or found_mac != mac):
            return f"its file {path} is not signed with this store's key"
        return ""

    def check(f: IO[bytes] | OSError) -> None:
        if isinstance(f, OSError):
            raise error(f"its file {path} is missing" if isinstance(f, FileNotFoundError)
                        else f"its file {path} cannot be read ({f})")
        why = verify(f)
        if why:
            raise error(why)

    if not eager:
        return Spilled(path, offset, size, digest, check=check), ""
    try:
        f = open_regular(path)  # (handed to the Spilled value)
    except OSError as exc:
        return None, (f"its file {path} is not a regular file (durably never reads through "
                      "a link, a FIFO or a device)" if exc.errno in (errno.ELOOP, errno.EINVAL)
                      else f"its file {path} is missing ({exc.strerror})")
    why = verify(f)
    if why:
        f.close()
        return None, why
    value = Spilled(path, offset, size, digest, file=f, check=check)
    if signer is not None and mac is not None:
        value.macs[signer.id] = mac
    return value, ""
