"""A look at a local input before a local run: how many images (up to a cap) and their mean file size, for the
rule that picks the local worker processes (``runner.local_processes``).

Small images (tiles, thumbnails, crops) spend most of their CPU holding the GIL, so one process keeps about
one core busy on them; photos leave the GIL most of the time, and one process feeds ~4 cores. A handful of
images finishes before extra worker processes have started. Only a local folder, glob or manifest is looked
at (the first ``SAMPLE_NAMES`` image names, the first ``SAMPLE_STATS`` sizes); anything else, or a look that
fails, gives None and the rule for photos. Preflight checks the input itself and names what is wrong with it.

    sample = input_sample(cfg)   # InputSample(images=32768, mean_bytes=2431.0, capped=True) or None
"""

from __future__ import annotations

import glob
import itertools
import logging
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .. import storage
from ..config import IMAGE_EXTENSIONS, ConvertConfig
from ..sources.manifest import read_manifest_rows
from ..sources.rules import PATH_COLUMN
from .preflight import manifest_format

_LOG = logging.getLogger(__name__)

# Image names counted at most: past this many, any number of processes the rule picks pays for its start-up.
SAMPLE_NAMES = 32_768
# Files whose size is looked at (the first ones listed).
SAMPLE_STATS = 256

_GLOB_CHARS = re.compile(r"[*?\[]")


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
            paths = _manifest_paths(cfg.manifest)
        elif cfg.input and not storage.is_remote(cfg.input):
            paths = _glob_paths(cfg.input) if _GLOB_CHARS.search(cfg.input) else _folder_paths(cfg.input)
        else:
            return None
        return _sample(paths)
    except (OSError, ValueError, UnicodeError) as e:  # only a speed setting depends on it: the rule for photos
        _LOG.info("no look at the input's image sizes (%s); the local process rule assumes photos", e)
        return None


def _sample(paths: Iterable[str]) -> InputSample | None:
    named, sizes = 0, []
    for path in itertools.islice(paths, SAMPLE_NAMES):
        named += 1
        if len(sizes) < SAMPLE_STATS:
            try:
                sizes.append(os.stat(path).st_size)
            except OSError:
                continue  # gone, or not ours to read: a reject in the run, not a size
    if not sizes:
        return None
    return InputSample(named, sum(sizes) / len(sizes), capped=named >= SAMPLE_NAMES)


def _is_image(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _folder_paths(root: str) -> Iterator[str]:
    """Image files under ``root``, walked depth first in name order (lazily: stops when the caller does)."""
    if not os.path.isdir(root):
        return
    stack = [root]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as entries:
            ordered = sorted(entries, key=lambda e: e.name)
        subfolders = []
        for entry in ordered:
            if entry.is_dir(follow_symlinks=False):
                subfolders.append(entry.path)
            elif _is_image(entry.name):
                yield entry.path
        stack.extend(reversed(subfolders))


def _glob_paths(pattern: str) -> Iterator[str]:
    return (path for path in glob.iglob(pattern, recursive=True) if _is_image(path) and os.path.isfile(path))


def _manifest_paths(manifest: str) -> Iterator[str]:
    """The manifest's local paths (relative ones under its folder); nothing for a manifest in a bucket."""
    if storage.is_remote(manifest):
        return
    fmt = manifest_format(manifest)
    folder = os.path.dirname(os.path.abspath(manifest))
    with open(manifest, encoding="utf-8-sig", newline="") as fh:
        for row in read_manifest_rows(fh, fmt):
            path = row.get(PATH_COLUMN)
            if isinstance(path, str) and path and not storage.is_remote(path):
                yield path if os.path.isabs(path) else os.path.join(folder, path)
