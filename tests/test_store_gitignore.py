"""A store directory durably creates carries a ``.gitignore`` of ``*``, so a store made inside
a project (``./.durably``) is never committed by accident; a directory that existed is left
as it was."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import durably


@durably.task
def double(x: int) -> int:
    return 2 * x


def test_a_store_created_inside_a_git_project_is_ignored_by_git(tmp_path: Path) -> None:
    git = shutil.which("git")
    if git is None:  # pragma: no cover - git is part of the development environment
        pytest.fail("git is needed for this test (apt-get install git)")
    subprocess.run([git, "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "job.py").write_text("print('a project file')\n")
    store = durably.DiskStore(tmp_path / ".durably")
    durably.configure(store=store)
    assert double(21) == 42  # the store is created, its cache written
    store.close()
    assert (tmp_path / ".durably" / ".gitignore").read_text().splitlines()[-1] == "*"
    status = subprocess.run([git, "status", "--porcelain", "--untracked-files=all"],
                            cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert status.splitlines() == ["?? job.py"]  # nothing of the store


def test_an_existing_directory_gets_no_gitignore(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir(mode=0o700)
    store = durably.DiskStore(folder)
    durably.configure(store=store)
    assert double(2) == 4
    store.close()
    assert (folder / "FORMAT").is_file()  # a store now
    assert not (folder / ".gitignore").exists()


def test_nested_parents_are_created_and_only_the_store_gets_it(tmp_path: Path) -> None:
    store = durably.DiskStore(tmp_path / "a" / "b" / "store")
    durably.configure(store=store)
    assert double(3) == 6
    store.close()
    assert (tmp_path / "a" / "b" / "store" / ".gitignore").is_file()
    assert not (tmp_path / "a" / ".gitignore").exists()
    assert not (tmp_path / "a" / "b" / ".gitignore").exists()
