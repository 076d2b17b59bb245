"""Large values of a server-backed store, in object storage through :mod:`fsspec`.

A value larger than the store's inline limit is kept as a **blob**: a file named by the
SHA-256 of its bytes (content-addressed: the same value written twice is one blob), under a
prefix that fsspec opens (``s3://bucket/prefix`` through s3fs, a shared directory,
``memory://`` in tests). It is written before the row that names it, so a row never names a
blob that is not there; a blob no row names (its row's write failed, or the row was deleted)
is collected after a grace period (:meth:`Blobs.collect`).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import stat
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from durably._keys.serde import Spilled, spill_stream
from durably.exceptions import DefinitionError, StoreError

__all__ = ["Blobs", "blobs_from"]

#: bytes written to a blob file at a time (a value is never copied whole to write it)
_CHUNK = 8 << 20
#: the largest blob read into memory; larger ones are downloaded to a local spill file
_IN_MEMORY = 1 << 20
#: bytes of a part of a multipart upload (S3 takes 5 MiB and more; s3fs's default, 50 MiB,
#: held a part and its copy in memory per upload)
_PART = 8 << 20


class Blobs:
    """Content-addressed blobs under an fsspec URL.

    Args:
        url: Where blobs are kept: ``s3://bucket/prefix``, ``/shared/dir``,
            ``file:///shared/dir``, ``memory://name``.
        options: fsspec storage options (for S3: ``endpoint_url``, ``key``, ``secret``...).

    Raises:
        StoreError: fsspec cannot open the URL (its protocol's package is missing: the
            message names it).
        DefinitionError: a local path whose folder does not exist and cannot be made, as
            the folder it goes in does not exist either (a mistyped path). The blob store's
            folder itself is made, private (0700), at the first blob.

    Example:
        >>> blobs = Blobs("memory://durably-doctest")
        >>> name = blobs.put(b"x" * 10)
        >>> blobs.get(name)
        b'xxxxxxxxxx'
    """

    def __init__(self, url: str, options: dict[str, Any] | None = None) -> None:
        import fsspec

        self.url = url
        self.options = dict(options or {})
        try:
            fs, root = fsspec.core.url_to_fs(url, **self.options)
        except ImportError as exc:
            raise StoreError(
                f"the blob store {url!r} needs a package that is not installed ({exc}). Fix: "
                "pip install 'durably[s3]' for s3:// (s3fs), or the fsspec package of that "
                "protocol.") from exc
        except (ValueError, TypeError) as exc:
            raise DefinitionError(f"the blob store {url!r} cannot be opened: {exc}. Fix: an "
                                  "fsspec URL such as s3://bucket/prefix or /shared/dir.") from exc
        self.fs = fs
        self.root = root.rstrip("/") or root
        #: the folder of this store's blobs under ``root`` (its id, once the store is open):
        #: several stores may share one blob store, and each collects only its own
        self.scope = ""
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.local = protocol in ("file", "local")
        if self.local:
            # a mistyped path is an error, never a new tree of folders: the blob store's
            # own folder is made (private) when the first blob is written, not its parent
            parent = os.path.dirname(os.path.abspath(self.root))
            if not os.path.isdir(self.root) and not os.path.isdir(parent):
                raise DefinitionError(
                    f"the blob store {url!r} cannot be made: the folder it goes in, "
                    f"{parent}, does not exist. Fix: correct the path (DURABLY_BLOBS or "
                    f"blobs=...), or make that folder (mkdir -p {parent}); durably makes the "
                    "blob store's own folder.")

    def path(self, name: str) -> str:
        """Where the blob ``name`` (a SHA-256 in hex) is kept."""
        return posixpath.join(self.root, self.scope, name[:2], name)

    def put(self, data: bytes) -> str:
        """Keep ``data`` (unless a blob of the same bytes is there) and return its name. A
        :class:`~durably.store.LargeValue` is streamed from its file, a chunk at a time.

        Raises:
            StoreError: the blob cannot be written (the message names where and why).
        """
        spilled = data if isinstance(data, Spilled) else None
        path = "?"
        try:
            name = _sha256(data if spilled is None else spilled)
            path = self.path(name)
            # written even when a blob of that name is there: it may be damaged (same size,
            # other bytes: a check upstream found it so, and only writing it mends it), or
            # old enough to be collected before the row that now names it commits (a fresh
            # write is within the grace period)
            if self.local:
                bits = self._folders(posixpath.dirname(path))
                # a local or shared directory: written aside and renamed, so a crash never
                # leaves a partial file under the final name; readable by its owner only
                # (or as the blob store's folder is shared: its group's bits, see _folders)
                temp = f"{path}.{uuid.uuid4().hex}.tmp"
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                if bits & 0o066:
                    os.fchmod(fd, 0o600 | (bits & 0o066))
                with os.fdopen(fd, "wb") as f:
                    _copy(data, spilled, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(temp, path)
            elif spilled is None:  # object storage: an upload appears whole or not at all
                # (no folders made: a mistyped bucket is an error, never a new bucket)
                self.fs.pipe_file(path, data)
            else:  # a multipart upload, a part at a time, abandoned (never completed) on error
                f = self.fs.open(path, "wb", block_size=_PART)
                try:
                    _copy(data, spilled, f)
                except BaseException:
                    discard = getattr(f, "discard", None)
                    if callable(discard):
                        discard()
                    raise
                f.close()
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"a large value cannot be written to the blob store {self.url} "
                             f"({path}): {exc}. Fix: check that it exists and that this "
                             "process may write there (credentials, permissions, space).") from exc
        return name

    def _folders(self, folder: str) -> int:
        """Make ``folder`` (a blob's) and the folders above it up to the blob store's own:
        private (0700) as a DiskStore's, unless the blob store's folder is shared (its group
        or other bits, given to what is made in it, as a shared DiskStore's; the blob store's
        own folder, made here, is private). Returns those sharing bits.

        Raises:
            DefinitionError: the folder the blob store's own folder goes in is gone.
        """
        root = self.root
        if not os.path.isdir(root):
            try:
                os.mkdir(root, 0o700)
            except FileExistsError:
                pass
            except FileNotFoundError:
                raise DefinitionError(
                    f"the blob store {self.url!r} cannot be made: the folder it goes in, "
                    f"{os.path.dirname(os.path.abspath(root))}, does not exist. Fix: correct "
                    "the path (DURABLY_BLOBS or blobs=...), or make that folder.") from None
        try:
            bits = stat.S_IMODE(os.stat(root).st_mode) & 0o077
        except OSError:
            bits = 0
        made = []
        at = folder
        while at != root and len(at) > len(root) and not os.path.isdir(at):
            made.append(at)
            at = posixpath.dirname(at)
        for one in reversed(made):
            try:
                os.mkdir(one, 0o700)
            except FileExistsError:
                continue  # (another process made it)
            if bits:
                os.chmod(one, 0o700 | bits)
        return bits

    def get(self, name: str) -> bytes | None:
        """The bytes of blob ``name``, or None when it is missing. A blob larger than 1 MiB
        comes back as a :class:`~durably.store.LargeValue`: copied to a local spill file a
        chunk at a time (checked and unpickled from there: never held in memory whole).

        Raises:
            StoreError: it cannot be read (other than missing).
        """
        try:
            with self.fs.open(self.path(name), "rb") as f:
                size = int(getattr(f, "size", None) or self.fs.size(self.path(name)))
                if size <= _IN_MEMORY:
                    data: bytes = f.read()
                    return data
                return spill_stream(f, size, f"the large value {self.path(name)}")
        except FileNotFoundError:
            return None
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"a large value cannot be read from the blob store {self.url} "
                             f"({self.path(name)}): {exc}. Fix: check the credentials and "
                             "that the store is reachable.") from exc

    def listing(self) -> list[tuple[str, int, float]]:
        """Every file of this store's blobs: ``(name, bytes, modified)`` (seconds since the
        epoch); the name of a partial file a killed write left ends with ``.tmp``."""
        try:
            found = self.fs.find(posixpath.join(self.root, self.scope), detail=True)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise StoreError(f"the blob store {self.url} cannot be listed: {exc}. Fix: check "
                             "the credentials and that it is reachable.") from exc
        blobs = []
        for path, info in found.items():
            name = posixpath.basename(path)
            if len(name.partition(".")[0]) != 64:
                continue
            blobs.append((name, int(info.get("size") or 0), _modified(info)))
        return blobs

    def remove(self, names: Iterable[str]) -> None:
        """Delete these blobs and partial files (missing ones are skipped)."""
        for name in names:
            try:
                self.fs.rm_file(posixpath.join(self.root, self.scope, name[:2], name))
            except FileNotFoundError:
                continue

    def __repr__(self) -> str:
        return f"Blobs({self.url!r})"


def _sha256(data: bytes) -> str:
    """The name of a blob of these bytes (a LargeValue's read from its file)."""
    if not isinstance(data, Spilled):
        return hashlib.sha256(data).hexdigest()
    h = hashlib.sha256()
    for chunk in _chunks(data):
        h.update(chunk)
    return h.hexdigest()


def _copy(data: bytes, spilled: Spilled | None, to: Any) -> None:
    """Write ``data`` (a LargeValue: its file's bytes) to ``to``, a chunk at a time."""
    if spilled is None:
        view = memoryview(data)
        for at in range(0, len(view), _CHUNK):
            to.write(view[at:at + _CHUNK])
        return
    for chunk in _chunks(spilled):
        to.write(chunk)


def _chunks(spilled: Spilled) -> Iterator[bytes]:
    """The bytes of a LargeValue, read from its file a chunk at a time."""
    with spilled.open() as f:
        left = spilled.size
        while left:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                raise StoreError(f"the large value kept in {spilled.path} is cut short. Fix: "
                                 "check the disk it is on.")
            yield chunk
            left -= len(chunk)


def _modified(info: dict[str, Any]) -> float:
    for field in ("mtime", "LastModified", "created", "last_modified"):
        value = info.get(field)
        if value is None:
            continue
        if isinstance(value, (int, float)):
            return float(value)
        stamp = getattr(value, "timestamp", None)
        if callable(stamp):
            return float(stamp())
    return time.time()  # unknown: as if just written (kept for the grace period)


def blobs_from(blobs: str | Blobs | None, options: dict[str, Any] | None) -> Blobs | None:
    """The blob store given (``blobs=``), else ``$DURABLY_BLOBS`` (with
    ``$DURABLY_BLOBS_OPTIONS``, a JSON object of fsspec options), else None.

    Raises:
        DefinitionError: ``$DURABLY_BLOBS_OPTIONS`` is not a JSON object.
    """
    if isinstance(blobs, Blobs):
        return blobs
    if blobs is None:
        blobs = os.environ.get("DURABLY_BLOBS") or None
        if blobs is None:
            return None
        if options is None and os.environ.get("DURABLY_BLOBS_OPTIONS"):
            try:
                options = json.loads(os.environ["DURABLY_BLOBS_OPTIONS"])
            except ValueError as exc:
                raise DefinitionError(f"$DURABLY_BLOBS_OPTIONS is not JSON ({exc}). Fix: a "
                                      "JSON object, such as {\"endpoint_url\": "
                                      "\"http://localhost:9000\"}.") from exc
            if not isinstance(options, dict):
                raise DefinitionError("$DURABLY_BLOBS_OPTIONS must be a JSON object of "
                                      "fsspec options, such as {\"endpoint_url\": "
                                      "\"http://localhost:9000\"}.")
    if not isinstance(blobs, str):
        raise DefinitionError(f"blobs= takes an fsspec URL (str), got "
                              f"{type(blobs).__qualname__}. Fix: blobs=\"s3://bucket/prefix\".")
    return Blobs(blobs, options)
