"""The PostgreSQL server and the S3 server the tests of the PostgreSQL store use.

The server is named by ``$DURABLY_TEST_POSTGRES`` (a libpq URL): ``.ci/run`` starts a
throwaway one (``.ci/postgres start``) and sets ``DURABLY_REQUIRE_SYSTEM=1``, so that a
test which needs it fails rather than skips there (system.py). Without it, those tests skip,
saying how to run them. S3 is a local moto server, started in this process when a test asks
for it. Each store gets a schema of its own, dropped when the test ends.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from . import system

HOW = ("start a throwaway server with eval \"$(.ci/postgres start)\" (it sets "
       "$DURABLY_TEST_POSTGRES and the other variables the tests read), then run pytest again")


def server_url() -> str:
    """The test server's URL; skips the test without one (fails it when
    ``$DURABLY_REQUIRE_SYSTEM`` is set, as in CI: see system.py)."""
    return server_setting("DURABLY_TEST_POSTGRES", "no PostgreSQL server for the tests")


def server_setting(name: str, what: str) -> str:
    """The value of ``$name``, one of the variables ``.ci/postgres start`` sets; skips the
    test without it, saying ``what`` is missing (fails it when the server is required)."""
    value = os.environ.get(name)
    if value:
        return value
    system.missing(f"{what} (${name} is not set)", HOW, postgres=True)


def fresh_schema() -> str:
    return f"t_{uuid.uuid4().hex[:16]}"


def with_schema(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


def drop_schemas(url: str, schemas: list[str]) -> None:
    import psycopg

    if not schemas:
        return
    with psycopg.connect(url, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    schemas.clear()


class S3:
    """A moto S3 server on 127.0.0.1 with one bucket, and the fsspec options to reach it."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.options: dict[str, Any] = {
            "key": "testing", "secret": "testing",
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "eu-west-1"}}
        import s3fs

        s3fs.S3FileSystem(**self.options, skip_instance_cache=True).mkdir("durably-tests")

    def url(self) -> str:
        return f"s3://durably-tests/{uuid.uuid4().hex[:12]}"

    def stop(self) -> None:
        self.server.stop()


_s3: list[S3] = []


def s3_server() -> S3:
    """The moto server of this test session (started on first use)."""
    if not _s3:
        _s3.append(S3())
    return _s3[0]


@pytest.fixture
def pg_schemas() -> Iterator[list[str]]:
    """Schemas a test made on the server (dropped after it)."""
    made: list[str] = []
    yield made
    url = os.environ.get("DURABLY_TEST_POSTGRES")
    if url:
        drop_schemas(url, made)
