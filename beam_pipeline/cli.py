"""Command line: ``python -m beam_pipeline convert ...`` (console script ``beam-pipeline``).

Flags override ``--config FILE.yaml``, which overrides the defaults.  Flags
this tool does not define go to Beam's PipelineOptions; a flag neither knows
is an error.  Exit codes: 0 done, 1 the pipeline (or a read or write around it) failed, 2 a usage, config or
input mistake (one line; ``-v`` adds the traceback), 3 too many rejects (or no image converted, or no object
kept), 130 interrupted (Ctrl-C; the same command resumes).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import __version__
from .config import DATE_FIELD, ConvertConfig, dataset_name_from_output, is_date, parse_split_ratios, validate
from .config_file import yaml_settings
from .errors import MissingExtraError, PipelineError, RejectsError, UsageError, one_line
from .flags import (
    CONVERT,
    INSPECT,
    NEGATIONS,
    TILE_SIZES,
    Command,
    Parser,
    build_parser,
    check_locations,
    clean_command,
)
from .malloc import give_back_large_frees
from .summary import summary
from .vocab.dataset_info import DatasetInfo

if TYPE_CHECKING:
    from .planning import PlanSummary
    from .run.convert import NotRunHere

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REJECTS = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
# Finished shards stay in the scratch folder (resume.py): the same command takes them.
INTERRUPTED = "interrupted: run the same command again to resume"

# What convert, plan and inspect import beyond the base install (the [convert] extra).
CONVERTER_MODULES = ("apache_beam", "PIL", "yaml")


def _convert_parser() -> Parser:
    """``convert``'s (and ``plan``'s) parser, built from the flag table in flags.py."""
    return build_parser(CONVERT)


def _with_default_job_name(flags: list[str], name: str, run_date: str) -> list[str]:
    """A dated run gets a Dataflow job name from the dataset and date, unless one is given."""
    if any(f == "--job_name" or f.startswith("--job_name=") for f in flags):
        return flags
    job = re.sub(r"[^a-z0-9-]", "-", f"{name}-{run_date}".lower()).strip("-")
    return [*flags, f"--job_name={job}"]


def check_beam_flags(flags: Sequence[str]) -> None:
    """Raises UsageError for a flag (or value) that no Beam PipelineOptions class accepts."""
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    class Strict(_BeamArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            raise UsageError(f"pipeline option: {message}")

    parser = Strict(allow_abbrev=False, add_help=False)
    seen: set[str] = set()
    for cls in PipelineOptions.__subclasses__():
        if str(cls) in seen:
            continue
        seen.add(str(cls))
        cls._add_argparse_args(parser)  # noqa: SLF001 - Beam builds its own parser this way
    _, unknown = parser.parse_known_args(list(flags))
    if unknown:
        first = next((u for u in unknown if u.startswith("-")), unknown[0]).split("=", 1)[0]
        beam = [s for action in parser._actions for s in action.option_strings]  # noqa: SLF001
        guess = closest_flag(first, [f.name for f in CONVERT.flags if f.name.startswith("--")], beam)
        hint = f"; did you mean {guess}?" if guess else ""
        raise UsageError(f"unknown flag {first} (not a beam_pipeline or Beam option){hint}")


def closest_flag(typed: str, ours: Sequence[str], beams: Sequence[str]) -> str | None:
    """The known flag ``typed`` most likely meant (this tool's first, then Beam's), or None when none is close:
    --split-ratio → --split-ratios, --max-reject → --max-reject-fraction, --num_workers → --num_workers."""
    import difflib

    name = typed.lower()
    for known in (ours, beams):
        starts = sorted(k for k in known if k.startswith(name) and len(name) >= 5)  # a cut-short flag
        close = starts or difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        if close:
            return close[0]
    return None


def _is_flag_value(args: Sequence[str], item: str) -> bool:
    """Whether ``item`` follows a ``--flag`` (without ``=``) as its value."""
    i = args.index(item)
    return i > 0 and args[i - 1].startswith("--") and "=" not in args[i - 1]


def parse_convert(argv: Sequence[str]) -> tuple[ConvertConfig, list[str], bool]:
    """argv after ``convert`` → (config, Beam flags, verbose)."""
    parser = _convert_parser()
    args, rest = parser.parse_known_args(list(argv))
    given = vars(args)
    verbose = bool(given.pop("verbose", False))
    check_locations(CONVERT, given)
    settings: dict[str, Any] = {}
    beam_flags: list[str] = []
    if "config" in given:
        settings, beam_flags = yaml_settings(given.pop("config"))
    settings.update(given)
    stray = [r for r in rest if not r.startswith("-") and not _is_flag_value(rest, r)]
    if stray:
        raise UsageError(
            f"unexpected argument {stray[0]!r} (quote a glob so the shell does not expand it: --input 'photos/*.jpg')"
        )
    beam_flags.extend(rest)
    check_beam_flags(beam_flags)
    check_locations(CONVERT, settings)  # a --config file's paths too

    output = settings.get("output")
    if not output:
        raise UsageError("--output is required")
    run_date = settings.pop("run_date", None) or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    if not is_date(run_date):
        raise UsageError(f"--run-date {run_date!r}: expected YYYY-MM-DD")
    if DATE_FIELD in output:
        # The template stays in the config: --incremental-from latest looks for its earlier dates.
        settings.update(output_template=output, run_date=run_date)
        output = settings["output"] = output.replace(DATE_FIELD, run_date)
        beam_flags = _with_default_job_name(
            beam_flags, settings.get("name") or dataset_name_from_output(output), run_date
        )
    for switch, setting in NEGATIONS.items():  # --no-resume → resume=False
        if settings.pop(switch, False):
            settings[setting] = False
    ratios = settings.pop("split_ratios", None)
    name = settings.pop("name", None) or dataset_name_from_output(output)
    allow = bool(settings.get("allow_split_names"))
    cfg = ConvertConfig(name=name, split_ratios=parse_split_ratios(ratios, allow) if ratios else None, **settings)
    validate(cfg)
    return cfg, beam_flags, verbose


def process_started() -> float:
    """When this process started, as a ``time.time()`` value (Linux: from /proc; else when cli was imported).

    The summary's "done in" is the wall time a user waited, interpreter and
    import start-up included. The process's age is the system uptime minus
    its start in clock ticks since boot (both 10 ms resolution).
    """
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _IMPORTED
    now = time.time()
    return now - age if 0 <= age < now - _IMPORTED + 3600 else _IMPORTED


_IMPORTED = time.time()


def _not_job_messages(record: logging.LogRecord) -> bool:
    """False for the job messages Beam's portable runner logs while it waits for a Flink or Spark job."""
    return not (record.name == "root" and record.pathname.endswith("portable_runner.py"))


def _quiet_logs(verbose: bool) -> None:
    """The CLI's log setup (never done on import): WARNING and above, and none of TF's start-up lines."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not verbose:
        # Failures are reported in one line by main(); Beam's own error log
        # would repeat them with a traceback.
        for noisy in ("apache_beam", "absl", "tensorflow", "tensorflow_transform"):
            logging.getLogger(noisy).setLevel(logging.CRITICAL)
        # A portable runner (Flink, Spark) relays the job's messages through the root logger, a worker's
        # traceback among them.
        for handler in logging.getLogger().handlers:
            handler.addFilter(_not_job_messages)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
        # absl's C++ logger prints TF's oneDNN/CUDA notices before it reads
        # its settings; these lower its thresholds where the build honours them.
        os.environ.setdefault("ABSL_MIN_LOG_LEVEL", "3")


def require_converter(command: str) -> None:
    """The base install is the reader side; the commands need the ``[convert]`` extra (one line if missing)."""
    import importlib.util

    for module in CONVERTER_MODULES:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package missing, or a module set to None
            found = False
        if not found:
            raise MissingExtraError(f"{command} needs the converter", "convert", name=module)


def without_missing_transform(cfg: ConvertConfig) -> tuple[ConvertConfig, str | None]:
    """The TFT analysis is an extra (``[transform]``): without it installed, skip it with a note.

    ``--image-stats`` asks for the analysis explicitly, so without TFT that is a usage error.
    """
    import importlib.util

    if not cfg.transform or importlib.util.find_spec("tensorflow_transform") is not None:
        return cfg, None
    hint = "pip install 'beam_pipeline[transform]'"
    if cfg.image_stats:
        raise UsageError(f"--image-stats needs tensorflow-transform, which is not installed ({hint})")
    note = f"skipped: tensorflow-transform is not installed ({hint}; --no-transform hides this)"
    return dataclasses.replace(cfg, transform=False), note


USAGE = f"""beam_pipeline {__version__}: image collections to sharded TFRecord datasets

usage: python -m beam_pipeline convert --input FOLDER|GLOB --output DIR [options] [beam options]
       python -m beam_pipeline convert --manifest FILE.csv|FILE.jsonl --output DIR [options]
       python -m beam_pipeline plan    (the same input flags as convert; reads no pixels, writes nothing)
       python -m beam_pipeline inspect OUTPUT [--split S] [--verify] [--contact-sheet FILE.png] [--n 64]
                                       [--report FILE.html]
       python -m beam_pipeline clean   OUTPUT [--older-than AGE] [--force] [--dry-run]
       python -m beam_pipeline COMMAND --help
"""


def _inspect_parser() -> Parser:
    return build_parser(INSPECT)


def run_inspect(argv: Sequence[str]) -> int:
    from . import contact_sheet, inspection
    from .run.workers import use_anonymous_gcs_for_emulator

    use_anonymous_gcs_for_emulator()
    args = _inspect_parser().parse_args(list(argv))
    check_locations(INSPECT, vars(args))
    inspection.check_access(args.output)
    try:
        info = inspection.read_info(args.output)
    except UsageError as e:
        note = _scratch_note(args.output)
        if not note:
            raise
        # a first run that was killed: say what it left (note[0]: how many, how big)
        raise UsageError(f"{e}; {note[0]}: beam-pipeline clean {args.output}") from None
    if args.split and args.split not in info.splits:
        raise UsageError(f"--split {args.split}: the dataset has {', '.join(info.splits)}")
    print(inspection.summary(args.output, info, args.split))
    note = _scratch_note(args.output)
    if note:
        print("\n" + "\n".join(note))
    if args.contact_sheet:
        if args.n < 1:
            raise UsageError("--n must be at least 1")
        low, high = TILE_SIZES
        if not low <= args.tile_size <= high:
            raise UsageError(f"--tile-size must be {low} to {high} pixels")
        tiles = contact_sheet.contact_sheet(
            args.output, info, args.contact_sheet, args.n, args.seed, args.split, tile=args.tile_size
        )
        print(f"contact sheet: {tiles} examples -> {args.contact_sheet}")
    if args.report:
        from . import report

        counts = report.write_report(args.output, info, args.report, seed=args.seed)
        print(f"report: {counts['sampled']} sampled records, {counts['groups']} near-duplicate groups -> {args.report}")
    if args.verify:
        try:
            done = inspection.verify(args.output, info, args.split)
        except inspection.VerifyError as e:
            print(f"error: verify failed: {e}", file=sys.stderr)
            return EXIT_FAILED
        print(f"verified {done:,} records: {inspection.verified_what(info)} all match")
    return EXIT_OK


def _clean_command() -> Command:
    from .run.files import STALE_TMP_AGE_S

    return clean_command(STALE_TMP_AGE_S / 86400)


def _clean_parser() -> Parser:
    return build_parser(_clean_command())


def run_clean(argv: Sequence[str]) -> int:
    from . import inspection, scratch
    from .run.workers import use_anonymous_gcs_for_emulator

    use_anonymous_gcs_for_emulator()
    args = _clean_parser().parse_args(list(argv))
    check_locations(_clean_command(), vars(args))
    inspection.check_access(args.output)
    older_than = scratch.parse_age(args.older_than)
    results = scratch.clean(args.output, older_than, args.force, args.dry_run)
    print("\n".join(scratch.clean_lines(results, older_than, args.dry_run)))
    return EXIT_OK


def _scratch_note(output: str, own_run_id: str = "") -> list[str]:
    """Lines naming the scratch folders of other runs in ``output`` (none if it cannot be listed)."""
    from . import scratch

    try:
        return scratch.report_lines(output, scratch.other_runs(output, own_run_id))
    except Exception as e:  # noqa: BLE001 - a note; a listing that fails must not fail the command
        logging.getLogger(__name__).debug("could not list scratch folders in %s: %s", output, e)
        return []


def _plan_text(plan: PlanSummary) -> str:
    lines = [f"plan for {plan['output']} (target {plan['target_shard_mb']:g} MB per shard; no pixels read)"]
    for split, s in plan["splits"].items():
        sizes = s["shard_bytes"] or [0]
        lines.append(
            f"  {split:<12} {s['examples']:>8} examples  {s['num_shards']:>4} shards  "
            f"~{min(sizes) / 1e6:.1f}-{max(sizes) / 1e6:.1f} MB each"
        )
        if s["labels"]:
            lines.append("      " + ", ".join(f"{k} {v}" for k, v in list(s["labels"].items())[:12]))
        files = s["files"]
        shown = files if len(files) <= 3 else [files[0], "...", files[-1]]
        lines.extend(f"      {f}" for f in shown)
    if plan["rejects"]:
        lines.append("  rejected while listing: " + ", ".join(f"{k} {v}" for k, v in plan["rejects"].items()))
    if plan["skipped"]:
        lines.append("  skipped: " + ", ".join(f"{k} {v}" for k, v in plan["skipped"].items()))
    return "\n".join(lines)


def _check_failpoints() -> None:
    """A misspelt BEAM_PIPELINE_FAILPOINTS entry stops the command before it starts (never silently unarmed)."""
    from . import failpoints

    try:
        failpoints.check_env()
    except ValueError as e:
        raise UsageError(str(e)) from None


COMMANDS = ("convert", "plan", "inspect", "clean")


def main(argv: Sequence[str] | None = None, *, started: float | None = None) -> int:
    """Runs one command; returns its exit code.

    ``started`` (a ``time.time()`` value) is where the summary's "done in"
    counts from: the process start when this is the process's entry point
    (``console_main``), else this call.
    """
    started = time.time() if started is None else started
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return EXIT_OK if argv else EXIT_USAGE
    if argv[0] == "--version":
        print(__version__)
        return EXIT_OK
    verbose = "-v" in argv or "--verbose" in argv  # before or after the command
    command, rest = argv[0], argv[1:]
    if command in ("-v", "--verbose") and rest:
        command, rest = rest[0], rest[1:]
    _no_gce_check_for_emulator()
    # The launcher lists and plans, and on the local runner runs everything: freed buffers of the listing go
    # back to the system instead of waiting in malloc's heaps (320k tiles: peak 524 -> 476 MB, measured).
    give_back_large_frees()
    try:
        return _run(command, rest, verbose, started)
    except (UsageError, MissingExtraError) as e:
        if verbose:
            logging.exception("usage error")
        print(f"error: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except RejectsError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return EXIT_REJECTS
    except PipelineError as e:
        if interrupted(e):
            return _interrupted()
        if verbose:
            logging.exception("pipeline failed")
        print(f"error: pipeline failed: {one_line(e)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return _interrupted()
    except BrokenPipeError:  # a reader that went away (inspect | head): nothing more to say to it
        return EXIT_OK
    except Exception as e:  # noqa: BLE001 - a read or write that failed outside the pipeline (a busy store, say)
        if interrupted(e):
            return _interrupted()
        if verbose:
            logging.exception("failed")
        print(f"error: {type(e).__name__}: {one_line(e)} (-v shows the traceback)", file=sys.stderr)
        return EXIT_FAILED


def _no_gce_check_for_emulator() -> None:
    """Against a GCS emulator no credentials are needed; skip google-auth's metadata-server probe
    (it retries for ~27 s off Google Cloud)."""
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        os.environ.setdefault("NO_GCE_CHECK", "true")


def _run(command: str, rest: list[str], verbose: bool, started: float) -> int:
    """One command after the checks every command shares (installed parts, logging, failpoints)."""
    if command not in COMMANDS:
        raise UsageError(f"unknown command {command!r} (try: {', '.join(COMMANDS)})")
    require_converter(command)
    _quiet_logs(verbose)
    _check_failpoints()
    if command == "inspect":
        return run_inspect(rest)
    if command == "clean":
        return run_clean(rest)
    cfg, beam_flags, _ = parse_convert(rest)
    if command == "plan":
        from .run.convert import run_plan

        print(_plan_text(run_plan(cfg, beam_flags)))
        return EXIT_OK
    return _run_convert(cfg, beam_flags, started)


def _run_convert(cfg: ConvertConfig, beam_flags: list[str], started: float) -> int:
    """Runs (or submits, or only builds) the job and prints what became of it."""
    from .run.convert import run_convert

    cfg, transform_note = without_missing_transform(cfg)
    info = run_convert(cfg, beam_flags, own_process=True)
    if not isinstance(info, DatasetInfo):
        print(_not_run_here(info, cfg.output))
        return EXIT_OK
    print(summary(info, cfg.output, time.time() - started, transform_note))
    for line in _scratch_note(cfg.output, info.run_id or ""):
        print("  " + line)
    return EXIT_OK


def _not_run_here(job: DatasetInfo | NotRunHere, output: str) -> str | None:
    """What to say when the job was only built (--dry_run, --template_location) or left running (--detach);
    None for a run that ended here (its dataset.json)."""
    if isinstance(job, DatasetInfo):
        return None
    if job.dry_run is not None:
        import json

        return "dry run: job built, not submitted\n" + json.dumps(job.dry_run, indent=2)
    if job.template_location:
        return f"job request written to {job.template_location} (not submitted)"
    return f"submitted job {job.job_id}; it writes {output}/_SUCCESS when the dataset is complete"


def interrupted(error: BaseException) -> bool:
    """Whether ``error`` comes from a Ctrl-C: the runner re-raises a KeyboardInterrupt in a worker thread as a
    RuntimeError ("KeyboardInterrupt [while running ...]") whose cause or context chain holds the original."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _interrupted() -> int:
    print(INTERRUPTED, file=sys.stderr)
    return EXIT_INTERRUPTED


_THREAD_ERRORS: list[str] = []  # what the runner's threads ended by, in this process (one line each)


def _thread_error_to_log(args: threading.ExceptHookArgs) -> None:
    """A thread's uncaught error is kept as one line (its traceback logged with --verbose), not printed.

    The threads that end so are the runner's: Beam's local job service raises in its own thread when a worker
    process exits, and its gRPC readers when a worker's channel closes. The job fails with them and main()
    reports that in one line, or the interrupt behind them (a Ctrl-C reaches the whole process group, worker
    processes too: their threads fail before the interrupt is reported, so they cannot be told apart here).
    ``console_main`` adds the kept lines to a failed command's error: the cause the job's own error may not
    name (a worker killed by the OOM killer).
    """
    import traceback

    error = args.exc_value
    message = one_line(error) if error is not None else args.exc_type.__name__
    if message not in _THREAD_ERRORS:
        _THREAD_ERRORS.append(message)
    text = "".join(traceback.format_exception(args.exc_type, error, args.exc_traceback)).rstrip()
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger(__name__).info("thread %s ended by an error:\n%s", name, text)


def console_main() -> None:
    """Entry point of ``beam-pipeline`` and ``python -m beam_pipeline``: main(), then a fast exit.

    Once the command is done and its output flushed, the interpreter's
    teardown (TensorFlow's and Beam's native threads and finalizers) only
    adds seconds (measured 1.5-2.5 s after a TFT run); every file this tool
    writes is closed by then, so the process leaves with os._exit.
    """
    threading.excepthook = _thread_error_to_log
    try:
        code = main(started=process_started())
    except KeyboardInterrupt:  # a second Ctrl-C while the first one was being handled
        code = _interrupted()
    except SystemExit as e:  # argparse's --help and usage errors
        if isinstance(e.code, str):  # the message the interpreter would print
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    said = [m for m in _THREAD_ERRORS if " " in m] or _THREAD_ERRORS  # a message over a bare error name
    if code == EXIT_FAILED and said:
        print(f"  the runner's threads said: {'; '.join(said[:3])}", file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # a reader that went away (| head), or a closed stream
            pass
    logging.shutdown()
    os._exit(code)
