"""What decoders say while one file is decoded, caught per thread instead of printed.

Pillow reports odd files three ways: Python ``warnings`` (corrupt EXIF, a
malformed MPO, an invalid APNG), log records of its ``PIL.*`` loggers ("More
samples per pixel than can be decoded"), and libtiff's C handler, which writes
to fd 2 ("WEBP compression support is not configured"). Files are decoded on a
thread pool, so neither ``warnings.catch_warnings`` nor redirecting fd 2 can
be used (both are process-wide: they would swallow or misattribute other
threads' output). Instead one hook per channel is installed once, on first
use (importing this module changes nothing), and each hook looks at a
thread-local: inside ``captured()`` the message goes to that thread's list,
elsewhere it goes where it would have gone. Python shows a warning once per
place and text, so a second file that raises the same one would lose it (its
reject's detail then depending on which file a process decoded first): Pillow's
own User- and RuntimeWarnings are set to "always" (``_ALWAYS``), the one
process-wide change; outside a capture they print as before, only not once.

    with captured() as notes:
        decode(data)
    notes  # e.g. ["libtiff: WEBP compression support is not configured."]
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

_LOCAL = threading.local()
_LOCK = threading.Lock()
_INSTALLED: dict[str, Any] = {}
_MAX_NOTES = 20  # per file: a hostile file can make a decoder complain thousands of times
_ALWAYS = (UserWarning, RuntimeWarning)  # categories of Pillow's warnings about files (module PIL.*)
_PILLOW_MODULES = r"PIL\."


def _note(text: str) -> bool:
    """Adds ``text`` to this thread's list if it is capturing; False if it is not."""
    notes = getattr(_LOCAL, "notes", None)
    if notes is None:
        return False
    if len(notes) < _MAX_NOTES and text not in notes:
        notes.append(text)
    return True


def _show_warning(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    if not _note(f"{category.__name__}: {message}"):
        _INSTALLED["showwarning"](message, category, filename, lineno, file, line)


class _PillowLogFilter(logging.Filter):
    """Keeps PIL.* records of WARNING and above out of the handlers while this thread captures."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        return not _note(f"{record.levelname} {record.name}: {record.getMessage()}")


_FILTER = _PillowLogFilter()


def _pillow_libtiff() -> ctypes.CDLL | None:
    """The libtiff that Pillow's C module uses (wheels bundle their own copy), or None."""
    from PIL import _imaging, features  # noqa: F401 - loads the library being looked for

    if not features.check("libtiff"):
        return None
    candidates = []
    try:
        with open("/proc/self/maps") as fh:  # the copy this process has loaded, wherever it came from
            candidates = list(dict.fromkeys(line.split()[-1] for line in fh if "libtiff" in line))
    except OSError:  # not Linux: the copy inside Pillow's wheel
        pil = os.path.dirname(_imaging.__file__)
        candidates = glob.glob(os.path.join(pil, ".dylibs", "libtiff*")) + glob.glob(
            os.path.join(pil, os.pardir, "pillow.libs", "libtiff*")
        )
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
            lib.TIFFSetErrorHandler  # noqa: B018 - present in every libtiff
            return lib
        except (OSError, AttributeError):
            continue
    return None


# libtiff's handler: (const char* module, const char* fmt, va_list ap). A va_list arrives as a pointer on
# x86-64 (an array type) and on arm64 (a pointer, or on Linux a >16-byte struct passed by reference),
# so it can be handed on to vsnprintf as it is.
_TIFF_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p)
_LIBC = ctypes.CDLL(None) if sys.platform != "win32" else None


def _tiff_message(module: bytes | None, fmt: bytes | None, args: int | None) -> str:
    text = (fmt or b"").decode(errors="replace")
    if _LIBC is not None and fmt:
        buf = ctypes.create_string_buffer(1024)
        _LIBC.vsnprintf(buf, ctypes.c_size_t(len(buf)), ctypes.c_char_p(fmt), ctypes.c_void_p(args))
        text = buf.value.decode(errors="replace")
    return f"{(module or b'').decode(errors='replace')}: {text}" if module else text


def _tiff_handler(kind: str) -> Any:
    def handle(module: bytes | None, fmt: bytes | None, args: int | None) -> None:
        text = _tiff_message(module, fmt, args)
        if not _note(f"libtiff {kind}: {text}"):
            print(f"{text}", file=sys.stderr)  # what libtiff's own handler prints

    return _TIFF_HANDLER(handle)


def _filters_unchanged() -> bool:
    """Whether ``warnings.filters`` is the list the hooks were last installed into, as long as it was then: a
    change to it (``filterwarnings``, ``simplefilter``, ``resetwarnings``, ``catch_warnings``) changes one."""
    kept = _INSTALLED.get("filters")
    return kept is not None and kept[0] is warnings.filters and kept[1] == len(warnings.filters)


def _install() -> None:
    """Installs the three hooks, once per process (again for ``warnings`` if someone replaced it since)."""
    if warnings.showwarning is _show_warning and _filters_unchanged():
        return  # nothing changed since: no lock, no look through the filters (once per image)
    with _LOCK:
        if warnings.showwarning is not _show_warning:
            _INSTALLED["showwarning"] = warnings.showwarning
            warnings.showwarning = _show_warning
        for category in _ALWAYS:  # again if someone reset the filters since (catch_warnings, resetwarnings)
            if not any(f[0] == "always" and f[2] is category and f[3] and f[3].pattern == _PILLOW_MODULES
                       for f in warnings.filters):  # fmt: skip
                warnings.filterwarnings("always", category=category, module=_PILLOW_MODULES)
        if "logging" not in _INSTALLED:
            from PIL import Image

            Image.init()  # imports every plugin, so every PIL.* logger exists
            names = [n for n in logging.root.manager.loggerDict if n == "PIL" or n.startswith("PIL.")]
            for name in names:
                logging.getLogger(name).addFilter(_FILTER)
            _INSTALLED["logging"] = names
        if "libtiff" not in _INSTALLED:
            lib = _pillow_libtiff()
            handlers = (_tiff_handler("error"), _tiff_handler("warning"))  # kept alive here
            if lib is not None:
                lib.TIFFSetErrorHandler.argtypes = [_TIFF_HANDLER]
                lib.TIFFSetWarningHandler.argtypes = [_TIFF_HANDLER]
                lib.TIFFSetErrorHandler(handlers[0])
                lib.TIFFSetWarningHandler(handlers[1])
            _INSTALLED["libtiff"] = handlers
        _INSTALLED["filters"] = (warnings.filters, len(warnings.filters))  # the list itself: its id is never reused


@contextlib.contextmanager
def captured() -> Iterator[list[str]]:
    """Collects what decoders say in this thread (at most 20 distinct messages) instead of printing it."""
    _install()
    outer = getattr(_LOCAL, "notes", None)
    notes: list[str] = []
    _LOCAL.notes = notes
    try:
        yield notes
    finally:
        _LOCAL.notes = outer
