"""Stores chosen by URL: ``$DURABLY_STORE``, ``durably.configure(store="...")``, ``--store``
on the command line, ``@durably.entrypoint(store="...")``.

- A plain path (no ``scheme://``: ``/data/store``, ``./store``, ``~/store``, a
  :class:`pathlib.Path`) or a ``file://`` URL (``file:///data/store``) is a
  :class:`~durably.DiskStore` directory. A ``file://`` URL may carry the store's options as
  its query: ``file:///data/store?synchronous=full&size_limit=5GB`` (``size_limit``,
  ``synchronous``, ``allow_shared``, ``memo_entries``, ``compress`` (a zstandard level, or
  true); never ``key``: a key has no place in a URL, which ends up in logs and process lists).
- ``memory://`` is a new :class:`~durably.testing.MemoryStore`; ``memory://NAME`` is the same
  one for the same name within a process (it lives as long as the process), handy in tests.
- Any other scheme is a backend registered by a package under the entry point group
  ``durably.stores``: the entry point's name is the scheme, its object a callable
  ``(url: str, **options) -> Store``. In ``pyproject.toml``::

      [project.entry-points."durably.stores"]
      redis = "durably_redis:open_store"

A store pickles as its URL and its options (:func:`open_store_for_pickle`), as joblib's
``Memory`` pickles with its location, and process and Dask workers reopen the caller's store
from them.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import threading
import urllib.parse
from typing import TYPE_CHECKING, Any

from durably._store.disk.store import DiskStore, size_limit_bytes
from durably._store.integrity import SigningKey
from durably._store.memory import MemoryStore
from durably.exceptions import DefinitionError, StoreError
from durably.store import Store

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = [
    "ENTRY_POINT_GROUP",
    "available_schemes",
    "disk_location",
    "open_store",
    "open_store_at",
    "open_store_for_pickle",
    "redact",
    "store_from",
    "store_url_scheme",
]

#: the entry point group third-party store backends register under (name: the URL scheme)
ENTRY_POINT_GROUP = "durably.stores"

_BUILTIN = ("file", "memory")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://")
#: a scheme without its // (two letters at least: C:\\store is a Windows path)
_BARE_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]+):")
_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://[^/@:?#]*:"  # scheme://user:PASSWORD@
                       r"|[A-Za-z][A-Za-z0-9+.\-]+:/?[^/@:?#]*:)"  # (its // left out)
                       r"[^/@?#]*@")
#: a password in the query (libpq takes ?password=...&sslpassword=...)
_QUERY_PASSWORD = re.compile(r"([?&](?:ssl)?password=)[^&#\s]*", re.IGNORECASE)
#: a value of libpq's keyword/value form: 'quoted' (\' and \\ escaped) or up to a space
_LIBPQ_VALUE = r"(?:'(?:[^'\\]|\\.)*'|[^\s']+)"
_LIBPQ_PAIR = re.compile(r"\s*([A-Za-z_]+)\s*=\s*(" + _LIBPQ_VALUE + r")?\s*")
#: a password in libpq's keyword/value form (host=db password=... dbname=app)
_KEYWORD_PASSWORD = re.compile(r"((?:^|\s)(?:ssl)?password\s*=\s*)" + _LIBPQ_VALUE + "?",
                               re.IGNORECASE)
#: libpq's connection keywords (PostgreSQL 17): a text made of keyword=value pairs of these
#: is a libpq connection string, not a directory
_LIBPQ_KEYWORDS = frozenset({
    "host", "hostaddr", "port", "dbname", "user", "password", "passfile", "require_auth",
    "channel_binding", "connect_timeout", "client_encoding", "options", "application_name",
    "fallback_application_name", "keepalives", "keepalives_idle", "keepalives_interval",
    "keepalives_count", "tcp_user_timeout", "replication", "gssencmode", "sslmode",
    "requiressl", "sslcompression", "sslcert", "sslkey", "sslpassword", "sslcertmode",
    "sslrootcert", "sslcrl", "sslcrldir", "sslsni", "requirepeer",
    "ssl_min_protocol_version", "ssl_max_protocol_version", "krbsrvname", "gsslib",
    "gssdelegation", "service", "target_session_attrs", "load_balance_hosts",
    "sslnegotiation",
})
_DISK_OPTIONS = ("size_limit", "synchronous", "key", "allow_shared", "memo_entries",
                 "compress")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
#: how to get the backend of a scheme durably knows about but does not ship by default
_INSTALL = {
    "postgresql": "pip install 'durably[postgres]'",
    "postgres": "pip install 'durably[postgres]'",
}


# -- reading a URL ------------------------------------------------------------------------------
def _split(url: Any, where: str) -> tuple[str, str]:
    """``(scheme, text)``: the scheme in lower case (``""`` for a plain path) and the URL or
    path as a str.

    Raises:
        DefinitionError: ``url`` is not a str or a path, or is empty.
    """
    if isinstance(url, os.PathLike):
        path = os.fspath(url)
        if not isinstance(path, str):
            raise DefinitionError(
                f"{where} takes a store URL or a path as str or pathlib.Path, not the bytes "
                f"path {path!r}. Fix: pass os.fsdecode(path).")
        if not path:
            raise DefinitionError(f"{where}: the store path is empty. Fix: give a directory, "
                                  "for example \"./.durably\".")
        return "", path
    if not isinstance(url, str):
        raise DefinitionError(
            f"{where} takes a store URL or a path (str or pathlib.Path), not "
            f"{type(url).__qualname__}. Fix: a directory (\"/data/store\", \"./store\"), a "
            "file:// or memory:// URL, or a store object (durably.DiskStore(path)).")
    if not url.strip():
        raise DefinitionError(
            f"{where}: the store URL is empty. Fix: give a directory (\"./.durably\"), a "
            "file:// URL, or memory:// for a store in memory.")
    match = _SCHEME.match(url)
    if match is not None:
        return match.group(1).lower(), url
    bare = _BARE_SCHEME.match(url)  # scheme:rest, without the //
    if bare is not None:
        scheme = bare.group(1).lower()
        if scheme == "file":  # file:/data/store (RFC 8089's short form)
            return scheme, url
        if scheme in _BUILTIN or scheme in _INSTALL or scheme in _backends():
            rest = url[bare.end():].lstrip("/")
            raise DefinitionError(
                f"{where} {redact(url)!r} looks like a {scheme}:// store URL without its '//'. "
                f"Fix: {redact(f'{scheme}://{rest}')}, or ./{redact(url)} for a directory of "
                "that name.")
    pairs = _libpq_pairs(url)
    if pairs is not None:
        raise DefinitionError(
            f"{where} {redact(url)!r} is a libpq connection string (keyword=value), which "
            "durably does not take: a store is named by a URL, which processes and workers "
            f"reopen it from. Fix: {_libpq_url(pairs)}, with the password in PGPASSWORD or "
            "~/.pgpass (or ./ in front, if it is a directory's name).")
    return "", url


def _libpq_pairs(text: str) -> dict[str, str] | None:
    """The keywords and values of a libpq connection string in keyword/value form
    (``host=db port=5432 dbname=app``), unquoted; None when ``text`` is not one (a directory's
    name): keyword=value pairs only, each keyword one libpq takes."""
    pairs: dict[str, str] = {}
    at = 0
    while at < len(text):
        match = _LIBPQ_PAIR.match(text, at)
        if match is None or match.end() == at or match.group(1).lower() not in _LIBPQ_KEYWORDS:
            return None
        value = match.group(2) or ""
        if value.startswith("'"):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        pairs[match.group(1).lower()] = value
        at = match.end()
    return pairs or None


def _libpq_url(pairs: dict[str, str]) -> str:
    """The postgresql:// URL of a libpq connection string's keywords, its password left out
    (the advice of an error message)."""
    quote = functools.partial(urllib.parse.quote, safe="")
    host = pairs.get("host", "")
    user = quote(pairs["user"]) + "@" if pairs.get("user") else ""
    netloc = "" if host.startswith("/") else (
        f"[{host}]" if ":" in host else quote(host)) + (
        f":{quote(pairs['port'])}" if pairs.get("port") and host else "")
    query = [(k, v) for k, v in pairs.items() if k not in (
        "user", "password", "dbname", "sslpassword") and (k != "host" or host.startswith("/"))
        and (k != "port" or not netloc)]
    return (f"postgresql://{user}{netloc}/{quote(pairs.get('dbname', ''))}"
            + ("?" + urllib.parse.urlencode(query) if query else ""))


def store_url_scheme(url: str | os.PathLike[str]) -> str:
    """The scheme of a store URL, in lower case: ``"file"`` for a plain path or a ``file://``
    URL, ``"memory"``, or the scheme a backend registers (``"postgresql"``).

    Raises:
        DefinitionError: ``url`` is not a str or a path, or is empty.

    Example:
        >>> store_url_scheme("./store"), store_url_scheme("Memory://x")
        ('file', 'memory')
    """
    scheme, _ = _split(url, "store_url_scheme(url)")
    return scheme or "file"


def redact(url: str) -> str:
    """The URL with its password (``scheme://user:PASSWORD@host``, or ``?password=`` in the
    query, as libpq takes it, or ``password=`` in libpq's keyword/value form) hidden, for
    messages.

    Example:
        >>> redact("postgresql://ada:s3cret@db/cache")
        'postgresql://ada:***@db/cache'
        >>> redact("postgresql:ada:s3cret@db/cache")  # (its // left out)
        'postgresql:ada:***@db/cache'
        >>> redact("postgresql://ada@db/cache?password=s3cret&sslmode=require")
        'postgresql://ada@db/cache?password=***&sslmode=require'
        >>> redact("host=db password='s3 cret' dbname=cache")  # (libpq's keyword/value form)
        'host=db password=*** dbname=cache'
    """
    return _KEYWORD_PASSWORD.sub(r"\1***", _QUERY_PASSWORD.sub(
        r"\1***", _PASSWORD.sub(r"\1***@", url)))


def disk_location(url: str | os.PathLike[str], where: str = "the store URL"
                  ) -> tuple[str, dict[str, Any]] | None:
    """The directory a plain path or a ``file://`` URL names (as given: ``~`` not expanded,
    a relative path left relative) and the options in its query; None for another scheme.

    Raises:
        DefinitionError: not a str or a path, empty, a ``file://`` URL naming another host,
            or a query with an unknown option or a bad value.

    Example:
        >>> disk_location("file:///data/my%20store?synchronous=full")
        ('/data/my store', {'synchronous': 'full'})
        >>> disk_location("memory://x") is None
        True
    """
    scheme, text = _split(url, where)
    if scheme == "":
        return text, {}
    if scheme != "file":
        return None
    parts = urllib.parse.urlsplit(text)
    host, path = parts.netloc, parts.path
    if host.lower() == "localhost":
        host = ""
    if host in ("~", ".", "..") or host.startswith("~"):  # file://~/store, file://./store
        path = host + path
    elif host:
        raise DefinitionError(
            f"{where} {redact(text)!r} names a directory on the host {host!r}: a DiskStore is "
            "a local directory. Fix: file:///absolute/path (three slashes), or a plain path "
            "(\"./store\", \"~/store\").")
    directory = os.fsdecode(urllib.parse.unquote_to_bytes(path))
    if not directory:
        raise DefinitionError(
            f"{where} {text!r} names no directory. Fix: file:///absolute/path/to/store.")
    if parts.fragment:
        raise DefinitionError(
            f"{where} {text!r} has a fragment (#{parts.fragment}). Fix: leave it out, or "
            "write a '#' of the directory's name as %23.")
    return directory, _query_options(parts.query, text, where)


def _query_options(query: str, url: str, where: str) -> dict[str, Any]:
    """A ``file://`` URL's query as DiskStore options."""
    options: dict[str, Any] = {}
    for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if name == "key":
            raise DefinitionError(
                f"{where} {url!r} gives a signing key in the URL; a key has no place in a URL "
                "(it ends up in logs, shell histories and process lists). Fix: set "
                "DURABLY_KEY_FILE (or DURABLY_KEY), or pass key=... in code.")
        if name not in _DISK_OPTIONS:
            known = ", ".join(n for n in _DISK_OPTIONS if n != "key")
            raise DefinitionError(
                f"{where} {url!r} has the option {name!r}, which a DiskStore does not take. "
                f"Its options: {known} (for example ?synchronous=full).")
        if name == "size_limit":
            options[name] = size_limit_bytes(value, f"{where} {url!r}: size_limit")
        elif name == "memo_entries":
            try:
                options[name] = int(value.replace("_", ""))
            except ValueError:
                raise DefinitionError(
                    f"{where} {url!r}: {name}={value!r} is not a whole number. Fix: "
                    f"{name}={'1000000000' if name == 'size_limit' else '0'}.") from None
        elif name == "allow_shared":
            if value.lower() not in _TRUE + _FALSE:
                raise DefinitionError(
                    f"{where} {url!r}: allow_shared={value!r} is not true or false. Fix: "
                    "allow_shared=true.")
            options[name] = value.lower() in _TRUE
        elif name == "compress":  # a zstandard level (0: off), true or false
            low = value.lower()
            options[name] = (int(value) or False) if value.isdigit() else (
                low in _TRUE if low in _TRUE + _FALSE else value)  # (a bad one: DiskStore says)
        elif name == "synchronous" and value not in ("normal", "full"):
            raise DefinitionError(
                f"{where} {url!r}: synchronous={value!r} is not normal or full. Fix: "
                "synchronous=full to survive power cuts, else leave it out.")
        else:
            options[name] = value
    return options


# -- opening ------------------------------------------------------------------------------------
def open_store(url: str | os.PathLike[str], /, **options: Any) -> Store:
    """The store a URL or a path names.

    Args:
        url: A directory (``"/data/store"``, ``"./store"``, ``"~/store"``, a
            :class:`pathlib.Path`) or a ``file://`` URL: a :class:`~durably.DiskStore`
            (nothing touches the disk until it is used). ``memory://``: a new
            :class:`~durably.testing.MemoryStore`; ``memory://NAME``: the same one for the
            same name in this process. Another scheme: the backend registered for it under
            the entry point group ``durably.stores``.
        **options: Passed to the store: for a DiskStore ``size_limit``, ``synchronous``,
            ``key``, ``allow_shared``, ``memo_entries`` (they override the same options in a
            ``file://`` URL's query); for a backend, whatever it takes.

    Raises:
        DefinitionError: ``url`` is not a str or a path, is empty, has a scheme no installed
            backend registers (the message says which schemes are available and how to get
            the missing one), or an option is wrong.
        StoreError: the backend registered for the scheme fails to import.

    Example:
        >>> import tempfile
        >>> store = open_store(tempfile.mkdtemp(), synchronous="full")
        >>> type(store).__name__, store.synchronous
        ('DiskStore', 'full')
        >>> open_store("memory://tests") is open_store("memory://tests")
        True
    """
    return open_store_at(url, options, "open_store(url)")


def open_store_at(url: Any, options: dict[str, Any], where: str) -> Store:
    """:func:`open_store`, with ``where`` naming what gave the URL in error messages
    (``"$DURABLY_STORE"``, ``"configure(store=...)"``, ``"--store"``)."""
    disk = disk_location(url, where)
    if disk is not None:
        directory, given = disk
        return _open_disk(directory, {**given, **options}, where)
    scheme, text = _split(url, where)
    if scheme == "memory":
        return _open_memory(text, options, where)
    backend = _backends().get(scheme)
    if backend is None:
        raise DefinitionError(_unknown_scheme(scheme, text, where))
    return _open_backend(backend, scheme, text, options, where)


def _open_disk(directory: str, options: dict[str, Any], where: str) -> DiskStore:
    unknown = sorted(set(options) - set(_DISK_OPTIONS))
    if unknown:
        raise DefinitionError(
            f"{where}: a DiskStore (a directory) takes no option {unknown[0]!r}. Its "
            f"options: {', '.join(_DISK_OPTIONS)}.")
    key = options.get("key")
    if isinstance(key, SigningKey):  # (a store unpickled: the key given in code, as it was)
        store = DiskStore(directory, **{k: v for k, v in options.items() if k != "key"})
        store._given_key = key
        return store
    return DiskStore(directory, **options)


_memory_lock = threading.Lock()
_memory: dict[str, _NamedMemoryStore] = {}


class _NamedMemoryStore(MemoryStore):
    """The :class:`~durably.testing.MemoryStore` of ``memory://NAME``: one per name in a
    process, kept as long as the process lives; pickles as its URL."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    @property
    def url(self) -> str:
        """``memory://NAME``."""
        return f"memory://{self.name}"

    def __repr__(self) -> str:
        return f"<MemoryStore {self.url}: {len(self._cache)} cache entries, {len(self._runs)} " \
               "runs>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (open_store_for_pickle, (self.url, {}))


def _open_memory(text: str, options: dict[str, Any], where: str) -> MemoryStore:
    if options:
        raise DefinitionError(
            f"{where}: a memory:// store takes no options, got {', '.join(sorted(options))}.")
    name = text[len("memory://"):]
    if "?" in name or "#" in name:
        raise DefinitionError(
            f"{where} {text!r}: a memory:// store takes no query or fragment. Fix: "
            "memory://NAME.")
    if not name:
        return MemoryStore()
    with _memory_lock:
        store = _memory.get(name)
        if store is None:
            store = _memory[name] = _NamedMemoryStore(name)
    return store


def _backends() -> dict[str, EntryPoint]:
    """The backends installed, by scheme (lower case; the first of a name wins). The
    built-in schemes cannot be taken over."""
    from importlib.metadata import entry_points

    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        scheme = ep.name.strip().lower()
        if scheme not in _BUILTIN:
            found.setdefault(scheme, ep)
    return found


def available_schemes() -> list[str]:
    """The URL schemes a store can be opened with here: ``file`` and ``memory``, then those
    the installed backends register, sorted."""
    return [*_BUILTIN, *sorted(_backends())]


def _unknown_scheme(scheme: str, url: str, where: str) -> str:
    schemes = available_schemes()
    shown = ", ".join(f"{s}://" for s in schemes)
    close = difflib.get_close_matches(scheme, schemes, n=1)
    if scheme in _INSTALL:
        fix = f"Fix: {_INSTALL[scheme]} (it registers the {scheme}:// store)."
    else:
        fix = (f"Fix: install the package that provides {scheme}:// stores (it registers an "
               f"entry point named {scheme!r} in the group {ENTRY_POINT_GROUP!r})"
               + (f", or did you mean {close[0]}://?" if close else ", or check the URL."))
    return (f"{where} {redact(url)!r}: no store backend is installed for the URL scheme "
            f"{scheme!r}. Available: {shown} (a plain path is a directory too). {fix}")


def _open_backend(ep: EntryPoint, scheme: str, url: str, options: dict[str, Any],
                  where: str) -> Store:
    dist = getattr(getattr(ep, "dist", None), "name", None)
    origin = f"{ep.value!r}" + (f" of the package {dist!r}" if dist else "")
    try:
        factory = ep.load()
    except Exception as exc:
        raise StoreError(
            f"{where} {redact(url)!r}: the store backend for {scheme}:// ({origin}) failed "
            f"to import: {type(exc).__name__}: {exc}. Fix: reinstall"
            + (f" {dist}" if dist else " the package that provides it") + ".") from exc
    if not callable(factory):
        raise DefinitionError(
            f"the entry point {ep.name!r} of the group {ENTRY_POINT_GROUP!r} ({origin}) is "
            f"a {type(factory).__qualname__}, not a callable (url, **options) -> Store.")
    store = factory(url, **options)
    if not isinstance(store, Store):
        raise DefinitionError(
            f"the store backend for {scheme}:// ({origin}) returned a "
            f"{type(store).__qualname__}, which does not implement durably.Store.")
    return store


def store_from(value: Any, where: str = "store=...") -> Any:
    """``value`` opened with :func:`open_store` if it is a str or a path, else ``value``
    unchanged (a store object, None)."""
    if isinstance(value, (str, os.PathLike)):
        return open_store_at(value, {}, where)
    return value


# -- pickling -----------------------------------------------------------------------------------
def open_store_for_pickle(url: str, options: dict[str, Any]) -> Store:
    """Reopen a pickled store: how ``DiskStore`` (and a ``memory://NAME`` store) unpickle.

    A DiskStore's options include the signing key it was given in code (not one from the
    environment): a pickled store carries it, as the store object does.
    """
    return open_store_at(url, dict(options), "unpickling a store:")
