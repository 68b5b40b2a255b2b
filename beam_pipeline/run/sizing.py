"""A look at a local input before a local run: how many images (up to a cap) and their mean file size, for the
rule that picks the local worker processes (``runner.local_processes``).

Small images (tiles, thumbnails, crops) spend most of their CPU holding the GIL, so one process keeps about
one core busy on them; photos leave the GIL most of the time, and one process feeds ~4 cores. A handful of
images finishes before extra worker processes have started. Only a local folder, glob or manifest is looked
at: the first ``SAMPLE_NAMES`` image names (as the listing takes them: hidden and OS files and other
extensions left out), the sizes of the first ``SAMPLE_STATS``, for at most ``SAMPLE_SECONDS`` and
``SAMPLE_ENTRIES`` directory entries (a look cut short counts as many images). Anything else, or a look that
fails, gives None and the rule for photos: only a speed setting depends on it, and preflight checks the input
itself and names what is wrong with it.

    sample = input_sample(cfg)   # InputSample(images=32768, mean_bytes=2431.0, capped=True) or None
"""

from __future__ import annotations

import glob
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from .. import storage
from ..config import ConvertConfig
from ..sources.manifest import read_manifest_rows
from ..sources.rules import PATH_COLUMN, skip_reason
from .preflight import GLOB_CHARS, manifest_format

_LOG = logging.getLogger(__name__)

# Image names counted at most: past this many, any number of processes the rule picks pays for its start-up.
SAMPLE_NAMES = 32_768
# Files whose size is looked at (the first ones listed).
SAMPLE_STATS = 256
# The look stops after this long or this many directory entries or manifest rows (of any kind), whichever
# comes first; the count is then taken as "many".
SAMPLE_SECONDS = 1.0
SAMPLE_ENTRIES = 4 * SAMPLE_NAMES


@dataclass(frozen=True)
class InputSample:
    """``images`` image files named (``capped``: at least that many), ``mean_bytes`` over the first sizes."""

    images: int
    mean_bytes: float
    capped: bool


def input_sample(cfg: ConvertConfig) -> InputSample | None:
    """The sample of a local ``--input`` folder or glob, or of a local ``--manifest``; None otherwise."""
    try:
        if cfg.manifest:
            if storage.is_remote(cfg.manifest):
                return None
            return _sample(_manifest_paths(storage.normalize(cfg.manifest)))
        if not cfg.input or storage.is_remote(cfg.input):
            return None
        if GLOB_CHARS.search(cfg.input):
            return _sample(_glob_paths(storage.absolute_pattern(cfg.input)))
        return _sample(_folder_paths(storage.normalize(cfg.input)))
    except Exception as e:  # noqa: BLE001 - only a speed setting depends on it: the rule for photos
        _LOG.info("no look at the input's image sizes (%s: %s); the local process rule assumes photos",
                  type(e).__name__, e)  # fmt: skip
        return None


def _sample(entries: Iterator[str | None]) -> InputSample | None:
    """``entries``: an image path, or None for an entry looked at that is not one."""
    deadline = time.monotonic() + SAMPLE_SECONDS
    named, seen, sizes, capped = 0, 0, [], False
    for path in entries:
        seen += 1
        if seen >= SAMPLE_ENTRIES or (seen % 256 == 0 and time.monotonic() > deadline):
            capped = True
            break
        if path is None:
            continue
        named += 1
        if len(sizes) < SAMPLE_STATS:
            try:
                sizes.append(os.stat(path).st_size)
            except OSError:
                pass  # gone, or not ours to read: a reject in the run, not a size
        if named >= SAMPLE_NAMES:
            capped = True
            break
    if not sizes:
        return None
    return InputSample(named, sum(sizes) / len(sizes), capped=capped)


def _input_file(path: str, relpath: str) -> str | None:
    return None if skip_reason(relpath, check_extension=True) else path


def _folder_paths(root: str) -> Iterator[str | None]:
    """Each entry under ``root``: each folder's files in the order the filesystem gives them, then its
    subfolders. Lazy: a flat folder of a million files is read only as far as the caller goes. A subfolder
    this process may not read is left out, as the listing leaves it out."""
    if not os.path.isdir(root):
        return
    stack = [root]
    while stack:
        folder = stack.pop()
        subfolders = []
        try:
            entries = os.scandir(folder)
        except OSError:
            if folder == root:
                raise
            continue
        with entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):  # a link to a folder is not followed: no loop
                    subfolders.append(entry.path)
                    yield None
                else:
                    yield _input_file(entry.path, os.path.relpath(entry.path, root).replace(os.sep, "/"))
        stack.extend(sorted(subfolders, reverse=True))


def _glob_paths(pattern: str) -> Iterator[str | None]:
    """The glob's matches, by Python's rules (close to Beam's: only the mean size and the count matter)."""
    for path in glob.iglob(pattern, recursive=True):
        yield _input_file(path, os.path.basename(path)) if os.path.isfile(path) else None


def _manifest_paths(manifest: str) -> Iterator[str | None]:
    """The manifest's local paths (relative ones under its folder)."""
    folder = os.path.dirname(manifest)
    with open(manifest, encoding="utf-8-sig", newline="") as fh:
        for row in read_manifest_rows(fh, manifest_format(manifest)):
            path = row.get(PATH_COLUMN)
            if isinstance(path, str) and path and not storage.is_remote(path):
                yield path if os.path.isabs(path) else os.path.join(folder, path)
            else:
                yield None
