"""The PostgreSQL store (``pip install 'durably[postgres]'``): :class:`PostgresStore`, opened
by ``postgresql://`` URLs through the entry point :func:`open_store`."""

from durably._store.postgres.store import PostgresStore, open_store

__all__ = ["PostgresStore", "open_store"]
