"""Errors the command line turns into exit codes.

``UsageError`` is a mistake in flags, config, input or output paths: exit 2, one
line, no traceback.  ``PipelineError`` is a run that started and failed: exit 1.
``RejectsError`` is a run over its reject budget: exit 3.
``MissingExtraError`` is a part used without its extra installed (``[convert]``,
``[transform]``): one line naming the install command.
"""

import re


class UsageError(Exception):
    """A config/CLI/input mistake found before (or instead of) running the job."""


class PipelineError(Exception):
    """The job ran and did not complete."""


class RejectsError(Exception):
    """The job ran, but too many inputs (or all of them) were rejected: exit 3, nothing published."""


def message_lines(e: BaseException) -> list[str]:
    """An exception's message as its non-empty lines, stripped."""
    return [line.strip() for line in str(e).splitlines() if line.strip()]


def one_line(e: BaseException) -> str:
    """An error's message as the one line the command line prints: a message of several lines (a parser's
    context snippet, say) keeps every line, joined with "; "."""
    lines = message_lines(e)
    return "; ".join(lines) if lines else type(e).__name__


def last_line(e: BaseException) -> str:
    """The last non-empty line of an exception's message (runners wrap worker errors in long texts) that is not
    a Java stack frame: a Flink or Spark job's failure ends with its Java stack trace, whose last line
    (``java.base/java.lang.Thread.run(Thread.java:840)``) says nothing."""
    lines = [line for line in message_lines(e) if not _JAVA_FRAME.match(line)]
    return lines[-1] if lines else type(e).__name__


# "\tat org.x.Y.m(Y.java:12)", "java.base/java.lang.Thread.run(Thread.java:840)", "... 12 more"
_JAVA_FRAME = re.compile(r"^\s*(at\s+)?[\w$./]+\([\w$]+\.(java|scala):\d+\)\s*$|^\s*\.\.\. \d+ more\s*$")


def install_hint(extra: str) -> str:
    """The pip command that adds an extra (the same words wherever a part is missing)."""
    return f"pip install 'beam_pipeline[{extra}]'"


class MissingExtraError(ImportError):
    """A part of the package whose extra is not installed; the message is one line naming the pip command.

    An ImportError, so code that already catches ImportError (or checks ``e.name``) keeps working.
    """

    def __init__(self, needs: str, extra: str, *, name: str | None = None) -> None:
        super().__init__(f"{needs}: {install_hint(extra)}", name=name)
