"""Support for the ``durably`` command."""
