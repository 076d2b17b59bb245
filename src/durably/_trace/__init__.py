"""The tracer: a run's journal and events turned into a graph (rendering lives in
:mod:`durably.render`)."""
