"""Small words every step of a run uses: a path's absolute form, a note line for the user, a
worker error without the runner's step tails, a labels file's lines."""

from __future__ import annotations

import re
import sys

from .. import storage
from ..sources.manifest import open_text

absolute = storage.normalize  # a bucket path without its trailing slash; a local one absolute


def without_step(message: str) -> str:
    """A worker's error message without the ``[while running 'Step']`` tails the runner adds."""
    return re.sub(r"( \[while running '[^']*'\])+$", "", message)


def note(message: str) -> None:
    """One ``note:`` line on stderr: something a user should know that is no error."""
    print(f"note: {message}", file=sys.stderr, flush=True)


def label_lines(path: str) -> list[str]:
    """The labels of a labels file, exactly: line k is label k, spaces included (labels.txt is written one
    label per line, and no label holds a character str.splitlines() splits on: listing rejects those as
    bad_label). Only the line ends go (``\n``, or ``\r\n`` of a file edited on Windows); an empty line holds
    no label (none is empty)."""
    with open_text(path) as stream:
        text = stream.read()
    lines = (line[:-1] if line.endswith("\r") else line for line in text.split("\n"))
    return [line for line in lines if line]
