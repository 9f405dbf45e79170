"""What a script (a sed script, an awk program) does, as its parser found it."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.analysis import Word


@dataclass(frozen=True)
class Facts:
    reads: tuple[Word, ...] = ()
    """Files the script opens for reading (sed `r`/`R`, awk `getline < "f"`)."""
    writes: tuple[Word, ...] = ()
    """Files it writes (sed `w`/`W` and the `w` flag, awk `print > "f"`)."""
    runs: tuple[str, ...] = ()
    """Why it runs code (sed `e`, awk system() or a pipe); empty: it does not."""
    error: str = ""
    """Why the script cannot be read (the program would refuse it, or the parser cannot be sure)."""
