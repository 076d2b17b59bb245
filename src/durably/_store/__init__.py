"""Stores: what :mod:`durably.store`'s protocol is built from (the records, leases, integrity,
store URLs) and the backends: :mod:`.memory` and :mod:`.disk`."""
