"""What some tests need beyond Python's packages: Graphviz's ``dot`` program (SVG), a headless
Chromium (the HTML report opened in a browser) and a PostgreSQL server (postgres_server.py).

On a machine with only Python, a test that needs one of them skips, and its reason says how
to provide it. ``.ci/run`` provides them all and sets ``DURABLY_REQUIRE_SYSTEM=1``, which
turns those skips into failures: CI never skips one silently. (``DURABLY_REQUIRE_POSTGRES=1``,
its older name for the PostgreSQL server alone, still requires that server.)
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

REQUIRE = "DURABLY_REQUIRE_SYSTEM"
REQUIRE_POSTGRES = "DURABLY_REQUIRE_POSTGRES"  # (the PostgreSQL server only)


def _set(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def required(*, postgres: bool = False) -> bool:
    """Whether a missing program or server fails a test rather than skips it: with
    ``$DURABLY_REQUIRE_SYSTEM`` set (as ``.ci/run`` does), or, for the PostgreSQL server,
    ``$DURABLY_REQUIRE_POSTGRES``."""
    return _set(REQUIRE) or (postgres and _set(REQUIRE_POSTGRES))


def missing(what: str, how: str, *, postgres: bool = False) -> NoReturn:
    """Skip the test because ``what`` is missing, saying ``how`` to provide it; fail it instead
    when the environment requires it (see `required`)."""
    if required(postgres=postgres):
        names = f"{REQUIRE} or {REQUIRE_POSTGRES}" if postgres else REQUIRE
        pytest.fail(f"{what}, and {names} is set (as .ci/run sets it), so this test fails "
                    f"rather than skips: {how}", pytrace=False)
    pytest.skip(f"{what}: {how} (set {REQUIRE}=1 to make this a failure, as .ci/run does)")


def dot() -> str:
    """The path of Graphviz's ``dot`` program; skips (or fails, see `required`) without it."""
    found = shutil.which("dot")
    if found is None:
        missing("the Graphviz `dot` program is not on PATH",
                "install Graphviz (Debian/Ubuntu: apt install graphviz; macOS: brew install "
                "graphviz; .ci/run installs it), then run pytest again")
    return found


CHROMIUMS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium() -> str:
    """The path of a headless Chromium (or Chrome); skips (or fails, see `required`) without
    one."""
    for name in CHROMIUMS:
        found = shutil.which(name)
        if found:
            return found
    missing(f"no Chromium on PATH (looked for {', '.join(CHROMIUMS)})",
            "install it (Debian: apt install chromium; Ubuntu: the chromium snap or Google "
            "Chrome; .ci/run installs Debian's package), then run pytest again")
