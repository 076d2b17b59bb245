"""``@task`` and ``@entrypoint``: the public decorators over the runtime."""
