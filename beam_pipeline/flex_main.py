"""Entry point of the Flex Template container: the template's parameters are ``convert``'s settings.

Dataflow's launcher runs ``python flex_main.py --input=gs://... --overwrite=true ...``
with the parameter names of templates/metadata.json (``_`` for ``-``). The
launcher submits the job and exits (``--detach``): the job's own last step
runs the TFT analysis, writes the TFDS metadata and publishes ``_SUCCESS``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from beam_pipeline.cli import main
from beam_pipeline.flags import CONFIG_KEYS, NEGATIONS


def to_cli_args(params: Sequence[str]) -> list[str]:
    """Template parameters → convert flags; Beam options (``--project=...``) pass as they are."""
    out: list[str] = []
    for param in params:
        key, sep, value = param.partition("=")
        name = key.lstrip("-")
        if not key.startswith("--") or name not in CONFIG_KEYS:
            out.append(param)
            continue
        flag = "--" + name.replace("_", "-")
        if CONFIG_KEYS[name] is bool:
            word = value.strip().lower()
            on, off = word in ("", "true", "1", "yes"), word in ("false", "0", "no")
            negating = [no for no, setting in NEGATIONS.items() if setting == name]
            if not (on or off):
                out.append(param)  # neither: convert refuses it, naming it (never read as one or the other)
            elif negating:  # resume=false, split_folders=false: the --no-X flag; true is the default
                out += ["--" + negating[0].replace("_", "-")] if off else []
            elif on:
                out.append(flag)
            continue
        out.append(f"{flag}={value}" if sep else flag)
    return out


def convert_args(params: Sequence[str]) -> list[str]:
    """The whole ``convert`` command line the launcher runs."""
    args = to_cli_args(params)
    if not any(a == "--runner" or a.startswith("--runner=") for a in args):
        args.append("--runner=DataflowRunner")  # this container only ever launches Dataflow jobs
    if "--detach" not in args:
        args.append("--detach")
    return ["convert", *args]


if __name__ == "__main__":
    sys.exit(main(convert_args(sys.argv[1:])))
