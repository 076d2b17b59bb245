"""The runtime: the task spec, the run context and its write buffer, the call path,
the attempt lifecycle, interrupts, history, retries and configuration."""
