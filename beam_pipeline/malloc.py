"""glibc's malloc told to give large freed blocks back to the system (the writers' budgets and the launcher).

Its own module, importing nothing heavy: the command line calls it before any command runs.
"""

from __future__ import annotations

import ctypes
import os
import sys

# Allocations from this size up get pages of their own, given back to the system when freed.
FREED_TO_SYSTEM_FROM = 4 * 1024 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_MALLOC_SET_IN: set[int] = set()


def give_back_large_frees() -> bool:
    """Makes glibc's malloc give a freed decode buffer back to the system at once (once per process).

    The budgets count pixels in flight, but by default glibc raises the size
    it serves from its heaps to the largest block freed so far (up to 32 MB),
    and Pillow allocates an image in blocks of 16 MB, so after the first large
    image every later one comes from a heap of the thread that decodes it. A
    heap keeps what is freed in it, so with five decode threads the process
    kept up to five decoded 13,000 x 13,000 images' worth (2.3-3.0 GB measured
    where the budget is 1 GB). A fixed threshold (which also turns the raising
    off) puts every block from 4 MB up in pages of its own. Tiles and photos
    allocate far less per block and do not notice. The launcher calls it too:
    it lists and plans (and on the local runner runs everything), and the
    listing's freed buffers then leave the process (320k tiles: peak RSS 524
    -> 476 MB). False where there is no glibc (macOS, musl): nothing to change.
    """
    pid = os.getpid()
    if pid in _MALLOC_SET_IN:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: the C library it runs on
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    if mallopt(_M_MMAP_THRESHOLD, FREED_TO_SYSTEM_FROM) != 1:
        return False
    _MALLOC_SET_IN.add(pid)
    return True
