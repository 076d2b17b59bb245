"""``python -m durably``: the ``durably`` command, for environments where its script is not on
``PATH`` (a virtual environment not activated, a notebook's ``!`` line)."""

from durably.cli import main

if __name__ == "__main__":
    main()
