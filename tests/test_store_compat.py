"""A store written by an earlier release keeps working: it opens, its runs are listed and
shown, its finished run replays, its interrupted run and its failed run resume, and its cache
entries are hits.

Each ``tests/fixtures/compat_store_v<VERSION>/`` holds ``store/``, a store written by durably
VERSION (``tests/fixtures/make_compat_store.py``, running the frozen code of
``tests/fixtures/compat_pipeline.py``), and ``manifest.json``, which says what is in it (run
ids, statuses, steps, results, formats). Every test works on a copy of the store in its own
``tmp_path``, at another path than the one it was written at, with the private modes durably
gives a store (a checkout has the umask's); the checked-in files are never opened by durably
(opening a store of an older format upgrades it in place) and are checked unchanged after
each test.

What executed is told by ``compat_pipeline``: each task body appends its name to the file
named by ``$DURABLY_COMPAT_LOG``. A task's fingerprint covers its bytecode, which differs from
one Python minor version to the next: under another Python than the fixture's, cached steps
and cache entries are computed again by design, so the tests then only check that what was
expected to execute did (``test_the_fixture_was_written_by_this_python`` is skipped, saying
so).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import durably

from .fixtures import compat_pipeline as pipeline

FIXTURES = Path(__file__).parent / "fixtures"
VERSIONS = sorted(p for p in FIXTURES.glob("compat_store_v*") if (p / "manifest.json").is_file())
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def _manifest(fixture: Path) -> dict[str, Any]:
    return json.loads((fixture / "manifest.json").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _copy_store(src: Path, dest: Path) -> None:
    """The files of a checked-in store, copied as durably would have made them: folders
    0o700, files 0o600 (a checkout's modes follow the umask, and a store others can write
    is refused); folders git does not keep (empty ones) are left to durably to make."""
    dest.mkdir(mode=0o700, parents=True)
    for path in sorted(src.rglob("*")):
        if path.is_file():
            target = dest / path.relative_to(src)
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            target.chmod(0o600)


def _steps(steps: list[durably.StepRecord]) -> list[list[str | None]]:
    """Steps as the manifest gives them: [task, status, the task of their caller]."""
    tasks = {s.step_id: s.task for s in steps}
    return [[s.task, s.status, tasks.get(s.parent_id) if s.parent_id else None]
            for s in steps]


@dataclasses.dataclass
class Compat:
    """A copy of one fixture's store, configured as the default store."""

    manifest: dict[str, Any]
    store_dir: Path
    store: durably.DiskStore
    log: Path

    @property
    def same_python(self) -> bool:
        return bool(self.manifest["python"] == PYTHON)

    def run(self, kind: str) -> dict[str, Any]:
        """What the manifest says of the run of that kind (finished, interrupted, failed)."""
        return self.manifest["runs"][kind]  # type: ignore[no-any-return]

    def executed(self) -> list[str]:
        """The task bodies that executed since the last look."""
        if not self.log.exists():
            return []
        names = self.log.read_text(encoding="utf-8").split()
        self.log.unlink()
        return names

    def expect_executed(self, expected: list[str]) -> None:
        """Exactly these bodies executed (under another Python: at least these, since the
        fingerprints of the cached steps changed with the bytecode)."""
        names = self.executed()
        if self.same_python:
            assert names == expected
        else:
            missing = [n for n in expected if names.count(n) < expected.count(n)]
            assert not missing, (names, expected)


@pytest.fixture(params=VERSIONS, ids=[p.name for p in VERSIONS])
def fixture_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A checked-in fixture, checked unchanged after the test."""
    fixture: Path = request.param
    before = _tree_digest(fixture)
    yield fixture
    assert _tree_digest(fixture) == before, f"{fixture} was changed: restore it from git"


@pytest.fixture
def compat(fixture_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
           ) -> Iterator[Compat]:
    store_dir = tmp_path / "elsewhere" / "store"
    _copy_store(fixture_dir / "store", store_dir)
    log = tmp_path / "executed.log"
    for var in ("DURABLY_KEY", "DURABLY_KEY_FILE", "DURABLY_ALLOW_SHARED", pipeline.FIXED_VAR):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(pipeline.LOG_VAR, str(log))
    store = durably.DiskStore(store_dir)
    durably.configure(store=store)
    try:
        yield Compat(_manifest(fixture_dir), store_dir, store, log)
    finally:
        durably.configure()
        store.close()


def test_the_fixtures_are_there() -> None:
    """At least today's release has a fixture (a glob finding none would test nothing)."""
    assert VERSIONS, f"no compat_store_v*/manifest.json in {FIXTURES}"
    assert {_manifest(p)["durably_version"] for p in VERSIONS} >= {"0.1.0"}
    for fixture in VERSIONS:
        assert fixture.name == f"compat_store_v{_manifest(fixture)['durably_version']}"


def test_the_pipeline_code_is_frozen(fixture_dir: Path) -> None:
    manifest = _manifest(fixture_dir)
    assert manifest["pipeline"] == pipeline.__name__ == "tests.fixtures.compat_pipeline"
    source = Path(pipeline.__file__).read_bytes().replace(b"\r\n", b"\n")
    assert hashlib.sha256(source).hexdigest() == manifest["pipeline_sha256"], (
        "tests/fixtures/compat_pipeline.py changed since the fixture was written: its steps "
        "no longer match the stored ones. Restore the file from git (it is frozen).")


def test_the_fixture_was_written_by_this_python(fixture_dir: Path) -> None:
    manifest = _manifest(fixture_dir)
    if manifest["python"] != PYTHON:
        pytest.skip(f"{fixture_dir.name} was written by Python {manifest['python']}, this is "
                    f"{PYTHON}: fingerprints cover bytecode, so the other tests only check "
                    "that what must execute did, not that nothing else did")


def test_the_checked_in_store_is_small_settled_and_portable(fixture_dir: Path) -> None:
    """No write-ahead log, lock, lease or temporary file; nothing naming where it was made
    but a failure's traceback; under 2 MB. (Read with SQLite's immutable mode: nothing is
    written, not even a -shm file.)"""
    store_dir = fixture_dir / "store"
    manifest = _manifest(fixture_dir)
    files = [p for p in store_dir.rglob("*") if p.is_file()]
    names = {str(p.relative_to(store_dir)) for p in files}
    assert {"FORMAT", "JOURNAL", "journal.sqlite3", "cache/cache.db"} <= names
    assert not [n for n in names if n.endswith(("-wal", "-shm", "-journal"))
                or n.split("/")[0] in ("tmp", "damaged", "blobs")], names
    assert sum(p.stat().st_size for p in files) < 2 * 2**20
    assert (store_dir / "FORMAT").read_text().split() == [
        "durably-store", str(manifest["store_format"])]
    con = sqlite3.connect((store_dir / "journal.sqlite3").as_uri() + "?mode=ro&immutable=1",
                          uri=True)
    try:
        assert con.execute("PRAGMA user_version").fetchone()[0] == manifest["journal_format"]
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("SELECT count(*) FROM leases").fetchone()[0] == 0
        runs = dict(con.execute("SELECT run_id, status FROM runs").fetchall())
    finally:
        con.close()
    assert runs == {r["id"]: r["status"] for r in manifest["runs"].values()}


def test_the_runs_are_listed_and_read_back(compat: Compat) -> None:
    runs = durably.list_runs()
    assert {r.id: r.status for r in runs} == {
        r["id"]: r["status"] for r in compat.manifest["runs"].values()}
    for kind in ("finished", "interrupted", "failed"):
        info = compat.run(kind)
        entrypoint = getattr(pipeline, info["entrypoint"])
        (listed,) = durably.list_runs(entrypoint)
        run = durably.get_run(info["id"])
        assert listed.id == run.id == info["id"]
        assert run.status == info["status"] and run.attempt == 1
        assert run.entrypoint == f"{pipeline.__name__}:{info['entrypoint']}"
        assert run.name == info["entrypoint"]
        assert _steps(run.steps) == info["steps"]
        assert run.history(), "a checkpoint per finished step or interrupt"
        kinds = [e.kind for e in run.events()]
        assert kinds[0] == "run_started"
        assert kinds[-1] == {"finished": "run_finished", "interrupted": "run_interrupted",
                             "failed": "run_failed"}[kind]
    finished = durably.get_run(compat.run("finished")["id"])
    assert finished.result == compat.run("finished")["result"]
    assert finished.counts() == compat.run("finished")["counts"]
    (pending,) = durably.get_run(compat.run("interrupted")["id"]).interrupts
    expected = compat.run("interrupted")["interrupt"]
    assert (pending.id, pending.payload, pending.task) == (
        expected["id"], expected["payload"], expected["task"])
    failed = durably.get_run(compat.run("failed")["id"])
    assert failed.error == compat.run("failed")["error"]
    with pytest.raises(durably.RunStateError):
        _ = failed.result
    compat.expect_executed([])


def test_the_finished_run_replays_every_step(compat: Compat) -> None:
    info = compat.run("finished")
    run = pipeline.report.run(*info["args"])
    assert run.id == info["id"], "the run id derived from the arguments changed"
    assert (run.status, run.attempt, run.resumed_from) == ("finished", 2, "finished")
    assert run.result == info["result"]
    compat.expect_executed([])
    if compat.same_python:
        # every step the entrypoint's body called (a nested step comes with its caller)
        assert _steps(run.steps) == [[task, "replayed", None]
                                     for task, _, caller in info["steps"] if caller is None]
    # a plain call is the same run again: its result, nothing executed
    assert pipeline.report(*info["args"]) == info["result"]
    compat.expect_executed([])


def test_the_interrupted_run_resumes_with_an_answer(compat: Compat) -> None:
    info = compat.run("interrupted")
    assert pipeline.approve.resume(info["id"], info["answer"]) == info["result"]
    # the asking task runs again from its start, then what follows it; draft is replayed
    compat.expect_executed(["review", "publish"])
    run = durably.get_run(info["id"])
    assert (run.status, run.attempt, run.result) == ("finished", 2, info["result"])
    assert run.interrupts == []
    assert pipeline.approve(*info["args"]) == info["result"]  # finished: replayed
    compat.expect_executed([])


def test_the_failed_run_resumes_once_fixed(compat: Compat,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    info = compat.run("failed")
    assert info["steps"] == [["fetch", "ran", None]] * 4 + [["flaky", "failed", None]]
    # not fixed yet: it fails again at the same step, the steps before it replayed
    with pytest.raises(RuntimeError, match="on purpose"):
        pipeline.batch.run(*info["args"])
    compat.expect_executed(["flaky"])
    assert (durably.get_run(info["id"]).status, durably.get_run(info["id"]).attempt) == (
        "failed", 2)
    monkeypatch.setenv(pipeline.FIXED_VAR, "1")
    run = pipeline.batch.run(*info["args"])
    assert run.id == info["id"]
    assert (run.status, run.attempt, run.resumed_from) == ("finished", 3, "failed")
    assert run.result == info["result"]
    # only the failed step and what follows it executed
    compat.expect_executed(["flaky", "finish"])
    if compat.same_python:
        assert _steps(run.steps) == [["fetch", "replayed", None]] * 4 + [
            ["flaky", "ran", None], ["finish", "ran", None]]


def test_the_cache_entries_written_outside_a_run_are_hits(compat: Compat) -> None:
    for call in compat.manifest["standalone"]:
        if compat.same_python:
            assert pipeline.standalone.explain(*call["args"]).hit
        assert pipeline.standalone(*call["args"]) == call["result"]
        compat.expect_executed([])
    assert pipeline.standalone("ef", 2) == "efef"  # (a new call does execute)
    compat.expect_executed(["standalone"])


def _durably(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m durably ARGS`` in a subprocess."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST", "DURABLY_"))}
    proc = subprocess.run([sys.executable, "-m", "durably", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_the_command_line_lists_and_shows_the_runs(compat: Compat, tmp_path: Path) -> None:
    where = ("--dir", str(compat.store_dir))
    listed = json.loads(_durably("runs", "--json", *where, cwd=tmp_path).stdout)
    assert {r["id"]: r["status"] for r in listed} == {
        r["id"]: r["status"] for r in compat.manifest["runs"].values()}
    text = _durably("runs", *where, cwd=tmp_path).stdout
    assert all(r["id"] in text for r in compat.manifest["runs"].values())
    for kind in ("finished", "interrupted", "failed"):
        info = compat.run(kind)
        shown = json.loads(_durably("show", info["id"], "--json", *where, cwd=tmp_path).stdout)
        assert (shown["id"], shown["status"], shown["attempt"]) == (info["id"], kind, 1)
        assert shown["entrypoint"] == f"{pipeline.__name__}:{info['entrypoint']}"
        tasks = {s["step_id"]: s["task"] for s in shown["steps"]}
        assert [[s["task"], s["status"], tasks.get(s["parent_id"])]
                for s in shown["steps"]] == info["steps"]
        if kind == "finished":
            assert shown["result"] == info["result"]
        if kind == "interrupted":
            assert [i["id"] for i in shown["interrupts"]] == [info["interrupt"]["id"]]
        if kind == "failed":
            assert shown["error"] == info["error"]
    text = _durably("show", compat.run("finished")["id"][:12], *where, cwd=tmp_path).stdout
    assert "finished (attempt 1)" in text and "report" in text
    compat.expect_executed([])


def test_pickles_naming_the_modules_of_release_0_1_0_load() -> None:
    """A value an older release stored names durably's classes by the module they had then
    (``durably._retry.Retry``): it loads, as the class where it is now."""
    import importlib
    import pickle

    from durably._keys import moved, serde

    for old, new in moved.MOVED_MODULES.items():
        assert old.count(".") == 1 and importlib.import_module(new)  # (each move is real)
    for (old, name), new in moved.MOVED_NAMES.items():
        assert hasattr(importlib.import_module(new), name), (old, name, new)
    retry = durably.Retry(attempts=2)
    now = pickle.dumps(retry, protocol=2)
    assert b"cdurably._runtime.retry\nRetry\n" in now
    then = now.replace(b"cdurably._runtime.retry\nRetry\n", b"cdurably._retry\nRetry\n")
    assert serde.loads(then) == retry
    from durably._runtime.retry import Seceded

    found = moved.moved_name("durably._worker", "Seceded")
    assert found is Seceded  # (a name that moved to another module than its own)
    # a name that moved to another module of the same package since (a module split in two)
    found = moved.moved_name("durably._store", "KeyRecord")
    assert found is durably.store.KeyRecord
    with pytest.raises(ModuleNotFoundError):  # (a module that never was still fails)
        serde.loads(now.replace(b"cdurably._runtime.retry\n", b"cdurably._nothing\n"))


def test_durably_s_own_names_keep_their_digests_and_code_versions(fixture_dir: Path) -> None:
    """A task whose code uses one of durably's public functions or classes, and an argument
    that is one of durably's values, keep the cache key the release gave them: moving code
    between durably's modules changed ``__module__``, which digests record
    (``durably._keys.recorded``). Code versions cover bytecode: compared under the fixture's
    Python only."""
    from .fixtures import name_digests

    then = json.loads((fixture_dir / "name_digests.json").read_text(encoding="utf-8"))
    now = name_digests.compute()
    kinds = ["digest", "value"] + (["code"] if _manifest(fixture_dir)["python"] == PYTHON else [])
    changed = [f"{kind} of {name}" for kind in kinds for name, value in then[kind].items()
               if name in now[kind] and now[kind][name] != value]
    assert not changed, ("these changed since the release (run tests/fixtures/"
                         "make_recorded_names.py after moving code): " + ", ".join(changed))
    assert set(then["digest"]) <= set(now["digest"])  # (no public name went away)


def test_every_recorded_name_is_where_the_table_says() -> None:
    """Each entry of the table of moved names names a function or class its module defines
    (some say a public module is theirs once it is imported: ``durably.stategraph``)."""
    import importlib

    from durably._keys import recorded

    for _then, module, names in recorded._MOVED:
        defined = vars(importlib.import_module(module))
        for name in names.split():
            found = getattr(defined.get(name), "__module__", None)
            assert found == module or found in ("durably.stategraph", "durably"), (module, name)


def test_plain_pickles_of_release_0_1_0_load() -> None:
    """A value of durably's pickled by the user with plain pickle under release 0.1.0 (a
    queue between an old and a new worker, a cache of their own) loads with plain pickle:
    an old module that is gone imports as its moved names, an old module that is a package
    now answers its old names, and never with the wrong object."""
    import pickle

    retry = durably.Retry(attempts=2)
    now = pickle.dumps(retry, protocol=2)
    old = now.replace(b"cdurably._runtime.retry\nRetry\n", b"cdurably._retry\nRetry\n")
    assert pickle.loads(old) == retry
    for module, name, expected in [
            ("durably._decorators", "task", durably.task),  # (a module of that name now)
            ("durably._decorators", "entrypoint", durably.entrypoint),
            ("durably._store", "DiskStore", durably.DiskStore),
            ("durably._runtime", "Spec", None),
            ("durably._executors", "Thread", durably.executors.Thread),
            ("durably._files", "File", durably.File),
            ("durably._records", "StepRecord", durably.StepRecord)]:
        found = pickle.loads(b"c" + module.encode() + b"\n" + name.encode() + b"\n.")
        assert found is expected if expected is not None else found.__name__ == name
    import importlib

    assert importlib.import_module("durably._retry").Retry is durably.Retry  # (it imports)
    from durably._store import records  # (a submodule is still a submodule)

    assert records.StepRecord is durably.StepRecord
    with pytest.raises(AttributeError):
        pickle.loads(b"cdurably._store\nnothing_by_that_name\n.")
