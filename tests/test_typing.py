"""Type checkers see the original parameters and return types of decorated functions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECK = Path(__file__).parent / "typing" / "check_signatures.py"


def test_decorated_signatures_type_check() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--warn-unused-ignores",
         "--no-incremental", "--cache-dir", "/dev/null", str(CHECK)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
