"""The benchmarks: one entry point, one measurement per name (scripts/bench/).

    .venv/bin/python scripts/benchmark.py --list                      # the measurements
    .venv/bin/python scripts/benchmark.py NAME --help                 # one measurement's options
    .venv/bin/python scripts/benchmark.py --make-gb 2 --data bench-data   # no NAME: contenders, as before
    .venv/bin/python scripts/benchmark.py profile --data small95 --pipeline

Without a NAME the options go to ``contenders`` (the tutorial loop, the
textbook Beam pipeline and the decode floors against ``convert``). Results
and how to read them: docs/benchmarks.md.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # bench/, make_sample_images, cluster
sys.path.insert(1, str(HERE.parent))  # beam_pipeline and tests (tests/hostile.py, tests/imagegen.py)

from bench import COMMANDS, DEFAULT  # noqa: E402


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [__doc__.strip(), "", "measurements:"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["--list"], ["list"]):
        print(usage())
        return 0
    if argv and argv[0] in COMMANDS:
        name, rest = argv[0], argv[1:]
    elif argv and not argv[0].startswith("-"):
        print(f"error: unknown measurement {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    else:
        name, rest = DEFAULT, argv
    module = importlib.import_module(f"bench.{COMMANDS[name][0]}")
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
