"""What the lab's processes print for a Python warning: one ``warning: MESSAGE`` line on stderr, the
message stripped of ANSI escape codes (gymnasium colours its deprecation notes), instead of Python's
``FILE:LINE: CATEGORY: MESSAGE`` plus the source line, and each distinct line once per process (the spec
check, the preflight and the session each resolve an old env id: one warning the user needs once).

The ``lab`` command installs it (``orchestrator.cli.main``), and so do the processes whose stderr ends in
logs (the spec-check child, the session actors), so a log file never holds escape codes from a warning.
"""

from __future__ import annotations

import re
import sys
import warnings
from typing import TextIO

SHOWN: set[str] = set()  # warning lines this process printed since install_warning_format
# CSI sequences (colours, cursor moves: ESC [ params final-byte) and two-byte escapes (ESC + one char)
ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (ECMA-48 CSI and two-byte escapes)."""
    return ANSI_ESCAPE.sub("", text)


def warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 line: str | None = None) -> str:
    """A warning as ``'warning: MESSAGE\\n'`` (``warnings.formatwarning``'s signature), ANSI escapes removed,
    one line (newlines inside the message become spaces). The location and category are not shown."""
    text = " ".join(strip_ansi(str(message)).split())
    return f"warning: {text}\n"


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: TextIO | None = None, line: str | None = None) -> None:
    """``warnings.showwarning`` replacement: writes ``warning_line`` to ``file`` (default stderr) unless
    this process printed that line already; a closed or broken stream is ignored, as Python's own does."""
    stream = sys.stderr if file is None else file
    text = warning_line(message, category, filename, lineno, line)
    if stream is None or text in SHOWN:
        return
    SHOWN.add(text)
    try:
        stream.write(text)
    except OSError:
        pass


def install_warning_format() -> None:
    """Make every later warning of this process print as one ``warning: ...`` line, each distinct line once
    (counted from this call)."""
    SHOWN.clear()
    warnings.showwarning = show_warning  # (formatwarning stays Python's: a caller's own formatting is theirs)

