"""The disk store: a SQLite journal, a diskcache cache and a folder of large values.
The only package that imports ``sqlite3`` or ``diskcache``."""
