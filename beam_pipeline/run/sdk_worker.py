"""A worker process of a local ``multi_processing`` run: Beam's SDK worker, ending at once on Ctrl-C.

A Ctrl-C in a terminal reaches the whole process group, the worker processes
too. Beam's worker would log its KeyboardInterrupt to the launcher and print
a traceback of its own, one per process; this one leaves as a kill would
(exit 130, nothing printed), and the launcher says "interrupted" in one line.
What the run wrote stays for the next run to resume, as after any kill.
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> None:
    """``python -m beam_pipeline.run.sdk_worker N``: N is how many worker processes the run started, which
    this one's writers divide the memory budget and the cores by (writer/budget.py)."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    from beam_pipeline.runner import LOCAL_PROCESSES_ENV

    if len(sys.argv) > 1:
        os.environ[LOCAL_PROCESSES_ENV] = sys.argv[1]  # this process's own environment
    from apache_beam.runners.worker import sdk_worker_main

    sdk_worker_main.main(sys.argv[:1])


if __name__ == "__main__":
    main()
