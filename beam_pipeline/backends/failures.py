"""What a failed storage call was: the errors Beam wraps, looked through (used by both backends and callers)."""

from __future__ import annotations


def causes(e: BaseException) -> list[BaseException]:
    """The file system errors behind a BeamIOError (it wraps them per path), or the error itself."""
    from apache_beam.io.filesystem import BeamIOError

    details = getattr(e, "exception_details", None) if isinstance(e, BeamIOError) else None
    return [c for c in details.values() if isinstance(c, BaseException)] if details else [e]
