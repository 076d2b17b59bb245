"""Executors: fan-out of a task over threads, processes or a Dask cluster, and
what runs on the worker side."""
