"""Stores chosen by URL: paths and file:// URLs are DiskStores, memory://NAME is one store per
name, other schemes come from the ``durably.stores`` entry points; ``$DURABLY_STORE``,
``configure(store="...")``, ``--store``; a store pickles as its URL and options, and worker
processes reopen the caller's store from it."""

from __future__ import annotations

import json
import logging
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import durably
from durably._executors import worker as _worker
from durably._runtime import config as _config
from durably._store.urls import available_schemes, disk_location, open_store, store_url_scheme
from durably.cli import cli
from durably.testing import MemoryStore

from .conftest import run_script, script_env, write_script


@pytest.fixture(autouse=True)
def _no_store_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the environment that runs the tests says, no $DURABLY_STORE here."""
    monkeypatch.delenv("DURABLY_STORE", raising=False)
    durably.configure()


# -- what a URL opens ---------------------------------------------------------------------------
def test_a_plain_path_is_a_disk_store_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    store = open_store(str(tmp_path / "a"))
    assert isinstance(store, durably.DiskStore) and store.path == tmp_path / "a"
    assert open_store(tmp_path / "b").path == tmp_path / "b"  # a pathlib.Path
    monkeypatch.chdir(tmp_path)
    relative = open_store("./rel/store")
    assert isinstance(relative, durably.DiskStore)
    assert relative.path.absolute() == tmp_path / "rel" / "store"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert open_store("~/s").path == tmp_path / "home" / "s"
    assert store_url_scheme("./rel") == store_url_scheme(tmp_path) == "file"
    assert not (tmp_path / "a").exists()  # nothing touches the disk until the store is used


def test_a_file_url_is_a_disk_store_with_the_options_of_its_query(tmp_path: Path) -> None:
    where = tmp_path / "my store"
    store = open_store(where.as_uri())
    assert isinstance(store, durably.DiskStore) and store.path == where
    assert open_store(f"file://localhost{where}").path == where
    tuned = open_store(f"{where.as_uri()}?synchronous=full&size_limit=1_000_000&memo_entries=0"
                       "&allow_shared=false")
    assert isinstance(tuned, durably.DiskStore)
    assert (tuned.synchronous, tuned.size_limit, tuned.memo_entries, tuned.allow_shared) == \
        ("full", 1_000_000, 0, False)
    # keyword options win over the query's
    assert open_store(f"{where.as_uri()}?synchronous=full", synchronous="normal").synchronous \
        == "normal"
    assert disk_location("FILE:///x/y") == ("/x/y", {})
    assert store_url_scheme(where.as_uri()) == "file"


@pytest.mark.parametrize("url,message", [
    ("file:///s?key=0123456789abcdef0123", "has no place in a URL"),
    ("file:///s?colour=blue", "does not take"),
    ("file:///s?size_limit=big", "size_limit must be a positive number of bytes.*5GB"),
    ("file:///s?allow_shared=maybe", "not true or false"),
    ("file://server/share/s", "another host|on the host 'server'"),
    ("file://", "names no directory"),
])
def test_a_bad_file_url_is_refused_before_anything_opens(url: str, message: str) -> None:
    with pytest.raises(durably.DefinitionError, match=message):
        open_store(url)


@pytest.mark.parametrize("value,message", [
    (None, "not NoneType"),
    (42, "not int"),
    ("", "is empty"),
    ("   ", "is empty"),
    (b"/tmp/store", "not bytes"),
])
def test_what_is_no_url_says_so(value: Any, message: str) -> None:
    with pytest.raises(durably.DefinitionError, match=message):
        open_store(value)


def test_memory_urls_name_one_store_per_name_in_a_process() -> None:
    a = open_store("memory://test-urls-a")
    assert isinstance(a, MemoryStore)
    assert open_store("memory://test-urls-a") is a
    assert open_store("MEMORY://test-urls-a") is a
    assert open_store("memory://test-urls-b") is not a
    assert open_store("memory://") is not open_store("memory://")  # unnamed: a new one
    assert a.url == "memory://test-urls-a" and "memory://test-urls-a" in repr(a)
    assert pickle.loads(pickle.dumps(a)) is a  # in this process: the same store
    with pytest.raises(durably.DefinitionError, match="takes no options"):
        open_store("memory://x", size_limit=3)


def test_an_unnamed_memory_store_still_does_not_pickle() -> None:
    with pytest.raises(TypeError):
        pickle.dumps(MemoryStore())
    assert MemoryStore().location() is None


def _without_psycopg(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine where durably[postgres] is not installed."""
    monkeypatch.setitem(sys.modules, "psycopg", None)  # (import psycopg: ImportError)


@pytest.mark.parametrize("given, fix", [
    ("host=db.example port=5433 dbname=cache user=ada password=topsecret2",
     "postgresql://ada@db.example:5433/cache"),
    ("dbname=cache  password = 'top secret2' host=/run/postgresql",
     "postgresql:///cache?host=%2Frun%2Fpostgresql"),
])
def test_a_libpq_keyword_string_is_refused_without_showing_its_password(
        given: str, fix: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """libpq's keyword/value form (host=... password=...) as $DURABLY_STORE, --store or
    configure(store=...): a DefinitionError that says which URL to give instead, and neither
    it nor any log line shows the password (it was taken as a directory, named in full)."""
    password = "topsecret2" if "topsecret2 " in given + " " else "top secret2"
    caplog.set_level(logging.DEBUG)
    shown: list[str] = []
    for call in (lambda: durably.configure(store=given),
                 lambda: open_store(given)):
        with pytest.raises(durably.DefinitionError) as caught:
            call()
        shown.append(str(caught.value))
    monkeypatch.setenv("DURABLY_STORE", given)
    with pytest.raises(durably.DefinitionError) as caught:
        _config.default_store()
    shown.append(str(caught.value))
    assert "$DURABLY_STORE" in shown[-1]
    for args in (["runs"], ["--store", given, "runs"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code in (1, 2) and "Traceback" not in result.output
        shown.append(result.output)
    monkeypatch.delenv("DURABLY_STORE")
    shown += [record.getMessage() for record in caplog.records]
    assert not any(password in text for text in shown), shown
    for text in shown[:5]:
        assert "libpq connection string" in text and f"Fix: {fix}," in text
        assert "***" in text
    assert not Path(given).exists()  # (no directory made of it)


def test_an_unknown_scheme_names_it_the_schemes_available_and_the_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patched:
        _without_psycopg(patched)
        with pytest.raises(durably.DefinitionError) as info:
            open_store("postgresql://ada:s3cret@db.example/cache")
    text = str(info.value)
    assert "pip install 'durably[postgres]'" in text and "psycopg" in text
    assert "s3cret" not in text and "ada:***@db.example" in text  # no password in messages
    with pytest.raises(durably.DefinitionError) as info:
        open_store("redis://ada:s3cret@db.example/cache")
    text = str(info.value)
    assert "'redis'" in text and "file://, memory://" in text and "postgresql://" in text
    assert "s3cret" not in text and "ada:***@db.example" in text  # no password in messages
    with pytest.raises(durably.DefinitionError, match=r"'fiel'.*did you mean file://"):
        open_store("fiel:///data/store")
    with pytest.raises(durably.DefinitionError, match=r"group 'durably\.stores'"):
        open_store("nosuch://x")


# -- backends registered by entry points --------------------------------------------------------
BACKEND = '''
from durably.testing import MemoryStore


class FakeStore(MemoryStore):
    """A store of the made-up scheme fake://, in memory, remembering how it was opened."""

    def __init__(self, url, **options):
        super().__init__()
        self._url = url
        self.options = options

    @property
    def url(self):
        return self._url


def open_fake(url, **options):
    return FakeStore(url, **options)


def not_a_store(url, **options):
    return object()
'''


@pytest.fixture
def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package installed on sys.path (a module and its dist-info) that registers the
    schemes fake:// and broken:// in the entry point group durably.stores."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "durably_fake_backend.py").write_text(BACKEND)
    info = site / "durably_fake_backend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: durably-fake-backend\n"
                                   "Version: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[durably.stores]\nfake = durably_fake_backend:open_fake\n"
        "broken = durably_fake_backend:not_a_store\n"
        "missing = durably_no_such_module:open\n"
        "file = durably_fake_backend:open_fake\n")  # (a built-in scheme is never taken over)
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop("durably_fake_backend", None)


def test_a_scheme_registered_by_an_entry_point_opens_its_store(backend: Path,
                                                               tmp_path: Path) -> None:
    store = open_store("fake://cluster/cache?x=1", timeout=3)
    assert type(store).__name__ == "FakeStore"
    assert (store.url, store.options) == ("fake://cluster/cache?x=1", {"timeout": 3})
    assert store_url_scheme("FAKE://x") == "fake"
    assert {"fake", "broken", "missing"} <= set(available_schemes())
    assert available_schemes()[:2] == ["file", "memory"]
    assert isinstance(open_store((tmp_path / "s").as_uri()), durably.DiskStore)
    durably.configure(store="fake://configured")
    assert _config.default_store().url == "fake://configured"  # type: ignore[attr-defined]
    with pytest.raises(durably.DefinitionError, match=r"does not implement durably\.Store"):
        open_store("broken://x")
    with pytest.raises(durably.StoreError, match=r"missing://.*failed to import.*"
                                                 r"durably-fake-backend"):
        open_store("missing://x")
    with pytest.raises(durably.DefinitionError, match=r"Available: .*fake://"):
        open_store("nosuch://x")


def test_a_worker_reopens_a_backends_store_from_its_url(backend: Path) -> None:
    store = open_store("fake://shared")
    where = _worker._describe_store(store)
    assert where[0] == "url" and where[2:] == ("fake://shared", {})
    _worker._use_store(("url", ("another-host", 1), *where[2:]))  # as a worker process sees it
    try:
        reopened = _config.default_store()
        assert type(reopened).__name__ == "FakeStore" and reopened is not store
        assert reopened.url == "fake://shared"  # type: ignore[attr-defined]
    finally:
        _worker._worker_store = None
        durably.configure()


def test_a_worker_that_cannot_open_the_url_caches_in_memory(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="durably"):
        _worker._use_store(("url", ("another-host", 1), "nosuch://u:pw@host/x", {}))
    try:
        assert type(_config.default_store()) is MemoryStore
        assert "cannot be used here" in caplog.text and "nosuch://u:***@host/x" in caplog.text
    finally:
        _worker._worker_store = None
        durably.configure()


def test_a_named_memory_store_is_not_shared_with_worker_processes() -> None:
    where = _worker._describe_store(open_store("memory://not-shared"))
    assert where[0] == "memory" and where[2] == "memory://not-shared"
    assert _worker._describe_store(MemoryStore())[0] == "memory"


# -- choosing the default store -----------------------------------------------------------------
def test_configure_takes_a_url_or_a_path(tmp_path: Path) -> None:
    durably.configure(store=str(tmp_path / "s"))
    store = _config.default_store()
    assert isinstance(store, durably.DiskStore) and store.path == tmp_path / "s"
    durably.configure(store=tmp_path / "p")
    assert _config.default_store().path == tmp_path / "p"  # type: ignore[attr-defined]
    durably.configure(store="memory://configured")
    assert _config.default_store() is open_store("memory://configured")
    with pytest.raises(durably.DefinitionError, match=r"configure\(store=...\).*'nosuch'"):
        durably.configure(store="nosuch://x")
    assert _config.default_store() is open_store("memory://configured")  # unchanged
    with pytest.raises(durably.DefinitionError, match="needs a durably store"):
        durably.configure(store=3)  # type: ignore[arg-type]


def test_durably_store_wins_over_durably_dir(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLY_STORE", "memory://from-the-environment")
    durably.configure()
    assert _config.default_store() is open_store("memory://from-the-environment")
    monkeypatch.setenv("DURABLY_STORE", (tmp_path / "env").as_uri())
    durably.configure()  # (the environment is read again)
    assert _config.default_store().path == tmp_path / "env"  # type: ignore[attr-defined]
    monkeypatch.setenv("DURABLY_STORE", "")  # set but empty: as if unset
    durably.configure()
    assert _config.default_store().path == tmp_path / "default-store"  # type: ignore[attr-defined]
    monkeypatch.setenv("DURABLY_STORE", "nosuch://x")
    durably.configure()
    with pytest.raises(durably.DefinitionError, match=r"\$DURABLY_STORE 'nosuch://x'"):
        _config.default_store()


def test_an_entrypoint_takes_its_store_by_url() -> None:
    @durably.entrypoint(store="memory://entrypoint-store")
    def job(x: int) -> int:
        return x + 1

    assert job(1) == 2
    assert len(open_store("memory://entrypoint-store").list_runs()) == 1
    with pytest.raises(durably.DefinitionError, match=r"@entrypoint\(store=...\).*'nosuch'"):
        durably.entrypoint(store="nosuch://x")


SCRIPT = """
import json
import durably
from durably._runtime.config import default_store

@durably.task
def double(x):
    return 2 * x

@durably.entrypoint
def job(x):
    return double(x)

print(json.dumps({"result": job(21), "type": type(default_store()).__name__,
                  "path": str(default_store().path)}))
"""


def test_durably_store_in_a_real_process(tmp_path: Path) -> None:
    script = write_script(tmp_path / "job.py", SCRIPT)
    chosen, ignored = tmp_path / "chosen store", tmp_path / "dir-store"
    proc = run_script(script, script_env(ignored, DURABLY_STORE=chosen.as_uri()))
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"result": 42, "type": "DiskStore", "path": str(chosen)}
    assert (chosen / "journal.sqlite3").exists() and not ignored.exists()
    env = script_env(ignored, DURABLY_STORE="nosuch://x")
    bad = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert bad.returncode != 0
    assert "$DURABLY_STORE 'nosuch://x': no store backend" in bad.stderr


# -- pickling -----------------------------------------------------------------------------------
def test_a_disk_store_pickles_as_its_url_and_options(tmp_path: Path) -> None:
    store = durably.DiskStore(tmp_path / "a store", size_limit=10**9, synchronous="full",
                              key=b"k" * 32, allow_shared=False, memo_entries=7)
    store.cache_put("k", b"v")
    assert store.url == (tmp_path / "a store").as_uri()
    assert open_store(store.url).path == store.path
    copy = pickle.loads(pickle.dumps(store))
    assert copy is not store and isinstance(copy, durably.DiskStore)
    assert (copy.path, copy.size_limit, copy.synchronous, copy.allow_shared,
            copy.memo_entries) == (store.path, 10**9, "full", False, 7)
    assert copy._given_key is not None and store._given_key is not None
    assert copy._given_key.id == store._given_key.id
    assert copy.cache_get("k") == b"v"  # signed with the same key: verified
    # the default store's directory, absolute, as it was when pickled
    plain = pickle.loads(pickle.dumps(durably.DiskStore()))
    assert plain.path == tmp_path / "default-store" and plain._given_key is None
    store.close()
    copy.close()


# -- the command line ---------------------------------------------------------------------------
@durably.task
def increment(x: int) -> int:
    return x + 1


@durably.entrypoint
def flow(x: int) -> int:
    return increment(x)


@pytest.fixture
def cli_store(tmp_path: Path) -> tuple[Path, str]:
    """A store directory with one run of ``flow``, and that run's id."""
    where = tmp_path / "cli store"
    store = durably.DiskStore(where)
    durably.configure(store=store)
    run_id = flow.run(1).id
    durably.configure()
    store.close()
    return where, run_id


def _runs(args: list[str], env: dict[str, str] | None = None) -> Any:
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    return [r["id"] for r in json.loads(result.output)]


def test_cli_store_option_before_or_after_the_command(cli_store: tuple[Path, str]) -> None:
    where, run_id = cli_store
    assert _runs(["--store", where.as_uri(), "runs", "--json"]) == [run_id]
    assert _runs(["runs", "--json", "--store", str(where)]) == [run_id]
    assert _runs(["runs", "--json", "--store", f"{where.as_uri()}?memo_entries=0"]) == [run_id]


def test_cli_honours_durably_store_and_lets_options_win(cli_store: tuple[Path, str],
                                                        tmp_path: Path) -> None:
    where, run_id = cli_store
    elsewhere = tmp_path / "not a store"
    env = {"DURABLY_STORE": where.as_uri(), "DURABLY_DIR": str(elsewhere)}
    assert _runs(["runs", "--json"], env) == [run_id]  # $DURABLY_STORE wins over $DURABLY_DIR
    result = CliRunner().invoke(cli, ["--dir", str(elsewhere), "runs"], env=env)
    assert result.exit_code == 1 and "(--dir)" in result.output  # an option wins over both
    result = CliRunner().invoke(cli, ["runs"], env={"DURABLY_STORE": str(elsewhere)})
    assert result.exit_code == 1
    assert "no durably store at" in result.output and "($DURABLY_STORE)" in result.output


def test_cli_store_errors(cli_store: tuple[Path, str], tmp_path: Path,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    where, _ = cli_store
    _without_psycopg(monkeypatch)
    runner = CliRunner()
    both = runner.invoke(cli, ["--store", str(where), "--dir", str(where), "runs"])
    assert both.exit_code == 2 and "--store and --dir" in both.output
    unknown = runner.invoke(cli, ["runs", "--store", "postgresql://db/x"])
    assert unknown.exit_code == 2 and "pip install 'durably[postgres]'" in unknown.output
    missing = runner.invoke(cli, ["runs", "--store", (tmp_path / "nope").as_uri()])
    assert missing.exit_code == 1 and "the directory does not exist" in missing.output
    assert "(--store)" in missing.output
    bad = runner.invoke(cli, ["runs", "--store", f"{where.as_uri()}?synchronous=sometimes"])
    assert bad.exit_code == 2 and "synchronous" in bad.output
    memory = runner.invoke(cli, ["--store", "memory://cli", "runs"])
    assert memory.exit_code == 0 and "no runs in the store at memory://cli" in memory.output
    stats = runner.invoke(cli, ["--store", "memory://cli", "cache", "stats"])
    assert stats.exit_code == 1 and 'capability "maintenance"' in stats.output


# -- worker processes ---------------------------------------------------------------------------
def _mark(log: str, text: str) -> None:
    with open(log, "a") as f:
        f.write(text + "\n")


@durably.task(ignore=("log",))
def inner(x: int, log: str) -> int:
    _mark(log, f"inner {x}")
    return x + 1


@durably.task(ignore=("log",))
def outer(x: int, log: str) -> int:
    _mark(log, f"outer {x}")
    return inner(x, log) * 2


@pytest.mark.slow
def test_worker_processes_write_to_the_store_given_by_url(tmp_path: Path) -> None:
    where, log = tmp_path / "url store", str(tmp_path / "calls.log")
    durably.configure(store=f"{where.as_uri()}?memo_entries=0")
    assert outer.map([1, 2], [log] * 2, executor="process") == [4, 6]
    assert inner(2, log) == 3  # cached by a worker process, in the store the URL names
    assert sorted(Path(log).read_text().splitlines()) == ["inner 1", "inner 2", "outer 1",
                                                          "outer 2"]
    fresh = durably.DiskStore(where)
    assert len(fresh.list_keys(inner.spec.identity)) == 2
    fresh.close()


def test_the_readme_shows_durably_store() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    assert "DURABLY_STORE" in readme and "--store" in readme
