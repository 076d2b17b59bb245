"""Integrity of what a store keeps: checksums, signatures and signing keys.

Every value a :class:`~durably.DiskStore` writes and will later unpickle (cache values, and
the journal's step results, run arguments, run results and event payloads) is *sealed*: a
header that lets the store tell a value it wrote from a damaged or foreign one *before* any
byte of it reaches :mod:`pickle`.

Formats (integers little-endian)::

    inline, checksum only   b"DRB1" | xxh3-64(payload): u64 | payload
    inline, signed          b"DRS1" (keyed BLAKE2b-256) or b"DRS2" (HMAC-SHA256)
                            | xxh3-64(payload): u64 | key id: 8 | MAC: 32 | payload
    large file (a 64-byte header, then the pickle)
                            b"DRL1" (checksum) or b"DRL2" (signed)
                            | xxh3-128(content): 16 | key id: 8 | MAC: 32 | 4 zero bytes

The MAC of an inline value covers a *context* (what the slot is: the cache key, or the run and
step) and the payload, so a signed value moved to another slot is rejected too. The MAC of a
large file covers the context and the HMAC-SHA256 of its content (one pass over the file).
Keyed BLAKE2b is used below 1 KiB (cheapest for tiny values), HMAC-SHA256 above (faster per
byte where the CPU has SHA extensions: ``benchmarks/bench_signing.py``). The key id (8 bytes
of a hash of the key) tells "signed with another key" apart from "tampered with".

A large file's content is hashed as it is written and checked end to end when it is read,
with one exception: a value laid out for memory mapping (``@task(mmap=True)``) in a store
without a key is checked on a read without its arrays being read (its length, the checksum
of its description, each array's ``.npy`` header: :func:`durably._keys.layouts.check_mapped`),
so that a hit on gigabytes of arrays costs milliseconds; with a key it is read and its
signature checked like any other.

Keys come from ``DiskStore(key=...)``, ``durably.configure(key=...)``, ``$DURABLY_KEY`` or
the file named by ``$DURABLY_KEY_FILE``, in that order. A key is at least 16 bytes; it is
hashed to the 32-byte working key, so any length works.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import xxhash

from durably.exceptions import DefinitionError, StoreError

__all__ = [
    "LARGE_HEADER",
    "SigningKey",
    "env_key",
    "key_differs",
    "key_from",
    "check_private",
    "key_from_file",
    "large_header",
    "open_plain",
    "open_seal",
    "read_large_header",
    "scan",
    "seal",
    "unseal",
]

MIN_KEY_BYTES = 16
_HMAC_FROM = 1024  # payloads this large are signed with HMAC-SHA256, smaller with BLAKE2b
_CHUNK = 8 << 20  # bytes read at a time when a large file is checked

_PLAIN = struct.Struct("<4sQ")
_SIGNED = struct.Struct("<4sQ8s32s")
_LARGE = struct.Struct("<4s16s8s32s4x")
LARGE_HEADER = _LARGE.size  # 64 bytes
assert LARGE_HEADER == 64

MAGIC_PLAIN = b"DRB1"
MAGIC_BLAKE = b"DRS1"
MAGIC_HMAC = b"DRS2"
MAGIC_LARGE = b"DRL1"
MAGIC_LARGE_SIGNED = b"DRL2"
LARGE_MAGICS = (MAGIC_LARGE, MAGIC_LARGE_SIGNED)

# why a sealed value was refused (the reasons a warning or an error names)
DAMAGED = "it fails its checksum (a damaged or truncated write)"
UNSIGNED = "it is not signed, and this store requires signatures (a key is configured)"
OTHER_KEY = "it was signed with another key"
FORGED = "its signature does not match (it was modified after it was written)"


class SigningKey:
    """A key that signs and verifies values (keyed BLAKE2b-256 / HMAC-SHA256).

    Attributes:
        id: 8 bytes identifying the key (a hash of it), stored beside each signature.
        source: Where the key came from, for messages (never the key itself).
    """

    __slots__ = ("_key", "id", "source")

    def __init__(self, secret: bytes, source: str) -> None:
        self._key = hashlib.blake2b(secret, digest_size=32, person=b"durably-key").digest()
        self.id = hashlib.blake2b(self._key, digest_size=8, person=b"durably-kid").digest()
        self.source = source

    def __repr__(self) -> str:
        return f"<SigningKey {self.id.hex()} from {self.source}>"

    def mac(self, magic: bytes, context: bytes, payload: Any) -> bytes:
        """The MAC of ``context`` and ``payload`` with the algorithm ``magic`` names."""
        if magic == MAGIC_BLAKE:
            h = hashlib.blake2b(key=self._key, digest_size=32, person=b"durably-seal")
            h.update(context)
            h.update(b"\x00")
            h.update(payload)
            return h.digest()
        if len(payload) < 1 << 20:  # one call into OpenSSL: fastest below a megabyte
            return hmac.digest(self._key, context + b"\x00" + bytes(payload), "sha256")
        m = hmac.new(self._key, context + b"\x00", "sha256")
        m.update(payload)
        return m.digest()

    def content_mac(self) -> Any:
        """A running HMAC-SHA256 for the content of a large file (``update`` / ``digest``)."""
        return hmac.new(self._key, b"durably-content\x00", "sha256")


def key_from(value: Any, where: str) -> SigningKey:
    """A signing key from bytes or text given in code.

    Raises:
        DefinitionError: not bytes or str, shorter than 16 bytes, or a str naming a file.
    """
    if isinstance(value, str):
        if os.path.sep in value and os.path.isfile(os.path.expanduser(value)):
            raise DefinitionError(
                f"{where} is the key itself, but {value!r} names a file. Fix: pass the file's "
                f"content (key=pathlib.Path({value!r}).read_bytes()) or set "
                "DURABLY_KEY_FILE to the path."
            )
        secret = value.encode()
    elif isinstance(value, (bytes, bytearray, memoryview)):
        secret = bytes(value)
    else:
        raise DefinitionError(
            f"{where} takes the key as bytes or str, not {type(value).__qualname__}. Fix: "
            "key=secrets.token_bytes(32) (store it safely), or set DURABLY_KEY_FILE."
        )
    if len(secret) < MIN_KEY_BYTES:
        raise DefinitionError(
            f"{where} is {len(secret)} bytes long; a signing key needs at least "
            f"{MIN_KEY_BYTES}. Fix: use a random key, e.g. "
            "python -c \"import secrets; print(secrets.token_hex(32))\"."
        )
    return SigningKey(secret, where)


def key_from_file(path: str | os.PathLike[str], where: str) -> SigningKey:
    """A signing key read from a file that only its owner (and group) can read.

    Raises:
        StoreError: the file is missing, unreadable, too short, readable by every user or
            writable by anyone but its owner.
    """
    file = Path(path).expanduser()
    try:
        st = file.stat()
        data = file.read_bytes().strip()
    except OSError as exc:
        raise StoreError(
            f"cannot read the signing key file {file} ({where}): {exc.strerror or exc}. Fix: "
            "create it (python -c \"import secrets; print(secrets.token_hex(32))\" > FILE; "
            "chmod 600 FILE) or point DURABLY_KEY_FILE at an existing one."
        ) from None
    if hasattr(os, "getuid") and st.st_mode & (stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP):
        raise StoreError(
            f"the signing key file {file} ({where}) has mode {stat.S_IMODE(st.st_mode):#o}: "
            "other users can read or change it, and so sign values this store will load. "
            f"Fix: chmod 600 {file} (or 640 to share it with a group)."
        )
    if len(data) < MIN_KEY_BYTES:
        raise StoreError(
            f"the signing key file {file} ({where}) holds {len(data)} bytes; a key needs at "
            f"least {MIN_KEY_BYTES}. Fix: write a random key into it, e.g. "
            "python -c \"import secrets; print(secrets.token_hex(32))\"."
        )
    return SigningKey(data, f"{where} ({file})")


def key_differs(where: str, recorded: str, key: SigningKey) -> StoreError:
    """The error of a store opened with ``key`` whose values were signed with the key of id
    ``recorded`` (hex, as stored in the store: :attr:`SigningKey.id`, never the key).

    Example:
        >>> error = key_differs("the store /data/s", "00" * 8, SigningKey(b"k" * 32, "a test"))
        >>> "another key" in str(error) and "DURABLY_KEY_FILE" in str(error)
        True
    """
    return StoreError(
        f"{where} was signed with another key than this process's ({key.source}): its "
        f"values carry key id {recorded}, this key's id is {key.id.hex()}. A value signed "
        "with one key cannot be read with another: this process would execute its steps "
        "again and write over the entries and runs of the processes that have the right "
        "key. Fix: use the store's key in this process, as its other users do (the file "
        "they point DURABLY_KEY_FILE at, or their DURABLY_KEY, durably.configure(key=...) or "
        "key=; the key given in code comes first, then DURABLY_KEY, then DURABLY_KEY_FILE); "
        "one store has one key (no rotation): to change it, start a new store.")


def env_key() -> SigningKey | None:
    """The key from ``$DURABLY_KEY`` or ``$DURABLY_KEY_FILE``, or None."""
    text = os.environ.get("DURABLY_KEY")
    if text:
        try:
            return key_from(text, "DURABLY_KEY")
        except DefinitionError as exc:
            raise StoreError(str(exc)) from None
    path = os.environ.get("DURABLY_KEY_FILE")
    if path:
        return key_from_file(path, "DURABLY_KEY_FILE")
    return None


_process_key: SigningKey | None = None


def set_process_key(key: SigningKey | None) -> None:
    """The key of ``durably.configure(key=...)`` (None: none given)."""
    global _process_key
    _process_key = key


def _process_key_set() -> SigningKey | None:
    """The key of ``durably.configure(key=...)``, None if none was given (the environment's
    not looked at)."""
    return _process_key


def process_key() -> SigningKey | None:
    """The key every store not given its own signs with: ``durably.configure(key=...)``,
    else ``$DURABLY_KEY`` / ``$DURABLY_KEY_FILE``, else None."""
    return _process_key or env_key()


# -- inline values -----------------------------------------------------------------------------
def seal(payload: bytes, key: SigningKey | None = None, context: bytes = b"") -> bytes:
    """Prefix a payload with its checksum and, with a key, its signature.

    Example:
        >>> from durably._store.integrity import seal, unseal
        >>> unseal(seal(b"payload"))
        b'payload'
    """
    check = xxhash.xxh3_64_intdigest(payload)
    if key is None:
        return _PLAIN.pack(MAGIC_PLAIN, check) + payload
    magic = MAGIC_BLAKE if len(payload) < _HMAC_FROM else MAGIC_HMAC
    return _SIGNED.pack(magic, check, key.id, key.mac(magic, context, payload)) + payload


def open_plain(data: bytes) -> bytes | None:
    """The payload of a sound value sealed without a key (the common case of a journaled
    result, read on every replayed step), else None: then :func:`open_seal` says why, or
    opens a signed one."""
    if data[:4] == MAGIC_PLAIN and len(data) >= 12:
        payload = data[12:]
        if xxhash.xxh3_64_intdigest(payload) == _PLAIN.unpack_from(data)[1]:
            return payload
    return None


def open_seal(data: Any, key: SigningKey | None = None, context: bytes = b""
              ) -> tuple[bytes | None, str]:
    """``(payload, "")`` for a sound sealed value, else ``(None, why)``.

    Without a key, a signed value is accepted on its checksum (no key means the directory
    itself is trusted); with a key, only values signed with it are.
    """
    if type(data) is not bytes:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            return None, f"it is not a byte string ({type(data).__qualname__})"
        data = bytes(data)
    if len(data) < 12:
        return None, DAMAGED
    magic = data[:4]
    if magic == MAGIC_PLAIN:
        if key is not None:
            return None, UNSIGNED
        payload = data[12:]
        if xxhash.xxh3_64_intdigest(payload) != _PLAIN.unpack_from(data)[1]:
            return None, DAMAGED
        return payload, ""
    if magic in (MAGIC_BLAKE, MAGIC_HMAC) and len(data) >= _SIGNED.size:
        _, check, kid, mac = _SIGNED.unpack_from(data)
        payload = data[_SIGNED.size:]
        if xxhash.xxh3_64_intdigest(payload) != check:
            return None, DAMAGED
        if key is None:
            return payload, ""
        if kid != key.id:
            return None, OTHER_KEY
        if not hmac.compare_digest(mac, key.mac(magic, context, payload)):
            return None, FORGED
        return payload, ""
    if magic in LARGE_MAGICS and len(data) >= LARGE_HEADER:
        # a large value sealed in a file's reserved header (see durably.store), read whole
        payload = data[LARGE_HEADER:]
        mac = None
        if key is not None:
            m = key.content_mac()
            m.update(payload)
            mac = m.digest()
        why = check_large_header(data, xxhash.xxh3_128_digest(payload), mac, key, context)
        return (None, why) if why else (payload, "")
    return None, DAMAGED


def unseal(data: bytes, key: SigningKey | None = None, context: bytes = b"") -> bytes | None:
    """The payload of :func:`seal`, or None when the bytes are damaged (or, with a key,
    unsigned or signed otherwise)."""
    return open_seal(data, key, context)[0]


# -- large files -------------------------------------------------------------------------------
def large_header(digest: bytes, key: SigningKey | None, context: bytes,
                 content_mac: bytes | None) -> bytes:
    """The 64-byte header of a large file whose content has xxh3-128 ``digest``."""
    if key is None:
        return _LARGE.pack(MAGIC_LARGE, digest, b"\x00" * 8, b"\x00" * 32)
    assert content_mac is not None
    mac = key.mac(MAGIC_HMAC, context, content_mac + digest)
    return _LARGE.pack(MAGIC_LARGE_SIGNED, digest, key.id, mac)


def read_large_header(head: bytes) -> tuple[bytes, bytes, bytes, bytes] | None:
    """(magic, digest, key id, MAC) of a large file's header, or None."""
    if len(head) < LARGE_HEADER or head[:4] not in LARGE_MAGICS:
        return None
    magic, digest, kid, mac = _LARGE.unpack_from(head)
    return magic, digest, kid, mac


def check_large_header(head: bytes, digest: bytes, content_mac: bytes | None,
                       key: SigningKey | None, context: bytes) -> str:
    """"" when a large file's header matches its content, else why not."""
    found = read_large_header(head)
    if found is None:
        return DAMAGED
    magic, want, kid, mac = found
    if want != digest:
        return DAMAGED
    if key is None:
        return ""
    if magic != MAGIC_LARGE_SIGNED:
        return UNSIGNED
    if kid != key.id:
        return OTHER_KEY
    assert content_mac is not None
    if not hmac.compare_digest(mac, key.mac(MAGIC_HMAC, context, content_mac + digest)):
        return FORGED
    return ""


def scan(file: IO[bytes], offset: int, key: SigningKey | None,
         progress: Callable[[int], None] | None = None, limit: int | None = None,
         head: bytes = b"") -> tuple[bytes, bytes | None, int]:
    """Read ``file`` from ``offset`` to its end (or ``limit`` bytes): (xxh3-128, content MAC
    or None, bytes read). The checksum covers ``head`` first, when given (not the MAC)."""
    file.seek(offset)
    h = xxhash.xxh3_128()
    if head:
        h.update(head)
    m = key.content_mac() if key is not None else None
    size = 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while True:
        want = _CHUNK if limit is None else min(_CHUNK, limit - size)
        n = file.readinto(view[:want]) if want else 0  # type: ignore[attr-defined]
        if not n:
            break
        chunk = view[:n]
        h.update(chunk)
        if m is not None:
            m.update(chunk)
        size += n
        if progress is not None:
            progress(n)
    return h.digest(), (m.digest() if m is not None else None), size


# -- who may write a store ---------------------------------------------------------------------
def check_private(root: Path) -> str:
    """"" when only this user can write the directory ``root``, else what is wrong (it
    belongs to another user, or its group or every user can write it)."""
    if not hasattr(os, "getuid"):
        return ""
    st = root.stat()
    me = os.getuid()
    problems = []
    if st.st_uid != me:
        problems.append(f"it belongs to user {_user(st.st_uid)}, not to you ({_user(me)})")
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_IWOTH:
        problems.append(f"every user can write it (mode {mode:#o})")
    elif mode & stat.S_IWGRP and not _private_group(st.st_gid):
        problems.append(f"group {_group(st.st_gid)} can write it (mode {mode:#o})")
    return "; ".join(problems)


#: what a store directory holds; none of it may be a symbolic link or writable by others
STORE_PARTS = ("FORMAT", "JOURNAL", "cache", "cache/cache.db", "journal.sqlite3",
               "journal.sqlite3-wal",
               "journal.sqlite3-shm", "blobs", "tmp", "damaged")


def check_parts(root: Path, shared: bool) -> str:
    """"" when the parts of the store are sound, else what is wrong: a part that is a
    symbolic link (always refused: it would make durably read or write elsewhere, for
    example put a damaged entry's bytes into a folder of someone else's choosing), or, for
    a private store, a part that another user owns or can write."""
    problems = []
    me = os.getuid() if hasattr(os, "getuid") else None
    for name in STORE_PARTS:
        path = root / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            problems.append(f"{name} cannot be checked ({exc})")
            continue
        if stat.S_ISLNK(st.st_mode):
            problems.append(f"{name} is a symbolic link")
            continue
        if shared or me is None:
            continue
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid != me:
            problems.append(f"{name} belongs to user {_user(st.st_uid)}")
        elif mode & stat.S_IWOTH or (mode & stat.S_IWGRP and not _private_group(st.st_gid)):
            problems.append(f"{name} can be written by other users (mode {mode:#o})")
    return "; ".join(problems)


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        import grp

        return f"{grp.getgrgid(gid).gr_name!r} (gid {gid})"
    except (ImportError, KeyError):
        return f"gid {gid}"


def _private_group(gid: int) -> bool:
    """Whether ``gid`` is this user's private group (named after the user, no other member):
    a group-writable directory of such a group is still the user's alone."""
    try:
        import grp
        import pwd

        user = pwd.getpwuid(os.getuid())
        group = grp.getgrgid(gid)
    except (ImportError, KeyError):
        return False
    return (gid == user.pw_gid and group.gr_name == user.pw_name
            and set(group.gr_mem) <= {user.pw_name})
