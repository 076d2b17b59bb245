"""Shared fixtures: a store parametrized over every implementation, isolated defaults, the
system programs some tests need (skipped without them, failed in CI: see system.py), and a
helper that runs a script in a real subprocess."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import durably
from durably.testing import MemoryStore

from . import system
from .minimal_store import MinimalStore
from .postgres_server import drop_schemas, fresh_schema, server_url, with_schema

STORES = ["disk", "memory", "minimal", "postgres"]

# type-checked by test_typing.py, never imported or run
collect_ignore = ["typing", "fixtures"]  # fixtures: test_store_compat.py's data, frozen code


def make_store(kind: str, root: Path) -> Any:
    if kind == "postgres":  # (a schema of its own, dropped by the store fixture)
        return durably.open_store(with_schema(server_url(), fresh_schema()),
                                  allow_unsigned=True)
    if kind == "disk":
        return durably.DiskStore(root / "store")
    if kind == "minimal":
        return MinimalStore()
    return MemoryStore()


@pytest.fixture(autouse=True)
def _isolated_default_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test gets its own default store directory, never ./.durably."""
    monkeypatch.setenv("DURABLY_DIR", str(tmp_path / "default-store"))
    monkeypatch.delenv("DURABLY_STORE", raising=False)
    durably.configure()
    yield
    durably.configure()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Each store implementation, configured as the default for the test."""
    s = make_store(request.param, tmp_path)
    durably.configure(store=s)
    yield s
    durably.configure()
    s.close()
    if request.param == "postgres":
        drop_schemas(server_url(), [s.schema])


@pytest.fixture
def disk_store(tmp_path: Path) -> Iterator[durably.DiskStore]:
    """A DiskStore in the test's folder, configured as the default for the test."""
    s = durably.DiskStore(tmp_path / "store")
    durably.configure(store=s)
    yield s
    durably.configure()
    s.close()


@pytest.fixture
def sigint_raises_keyboard_interrupt() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in this process and in the processes it starts, as
    Python's default handler does, during the test: whatever pytest was started with. (A
    shell's background job, ``nohup`` and some CI runners start it with SIGINT ignored,
    which Python then keeps, and which every process it starts inherits; a handler is
    reset to the default on exec instead, so a Python child installs its own.)"""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        # (None: a handler not installed from Python, which cannot be put back from it)
        signal.signal(signal.SIGINT,
                      signal.default_int_handler if previous is None else previous)


@pytest.fixture(scope="session")
def require_dot() -> str:
    """The path of Graphviz's ``dot``: the test skips without it (fails in CI)."""
    return system.dot()


@pytest.fixture(scope="session")
def require_chromium() -> str:
    """The path of a headless Chromium: the test skips without it (fails in CI)."""
    return system.chromium()


@pytest.fixture(scope="module")
def browser(require_chromium: str) -> Iterator[Any]:
    """A headless Chromium driven by Playwright (``playwright.sync_api.Browser``): the system's
    Chromium (Playwright's own browser download is never used), shared by a module's tests; the
    test skips without it (fails in CI). Not shared by the session: Playwright's sync API keeps
    an asyncio loop running on the main thread while it is open, and ``asyncio.run`` (every
    async test of other modules) refuses to start inside a running loop."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[test]'")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=require_chromium, headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any, tmp_path: Path) -> Iterator[Any]:
    """A fresh Playwright page (``playwright.sync_api.Page``) in its own browser context, with
    JavaScript errors collected: the test fails if the page raised one (``page.errors`` lists
    them as they come). Screenshots go to ``tmp_path``."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    opened.errors = errors
    try:
        yield opened
    finally:
        context.close()
    assert not errors, f"the page raised JavaScript errors: {errors}"


def write_script(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source))
    return path


def script_env(store_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["DURABLY_DIR"] = str(store_dir)
    env.update(extra)
    return env


def run_script(
    path: Path, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=timeout,
        cwd=path.parent,
    )
    assert proc.returncode == 0, f"script failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def load_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str
                ) -> ModuleType:
    """(Re)load a module from source under a fixed name, as an edited file would be."""
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no stale .pyc of the same size
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def define(src: str, ns: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run source like a notebook cell: into a ``__main__`` namespace (new or given)."""
    if ns is None:
        ns = {"__name__": "__main__"}
    exec(textwrap.dedent(src), ns)
    return ns


def fp(func: Any) -> str:
    """The code fingerprint of a function."""
    from durably._keys.fingerprint import fingerprint_function

    return fingerprint_function(func).digest


def variant(template: str, value: object) -> str:
    """A source template with ``$V`` replaced by ``repr(value)``."""
    return textwrap.dedent(template).replace("$V", repr(value))
