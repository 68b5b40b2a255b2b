"""Pre-flight checks, runner choice, running the job and reading back its outcome.

Everything a user can get wrong (paths, manifest header, conflicting split
sources, an occupied output folder) is checked here, before the pipeline
starts, and raised as ``UsageError`` naming the flag or file.

    layout = prepare(cfg)                 # may raise UsageError
    info = run_convert(cfg, beam_args)    # dataset.json as a dict

A program may call ``run_convert`` itself, from several threads at once.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import itertools
import logging
import os
import posixpath
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    TestOptions,
    WorkerOptions,
)
from apache_beam.runners.runner import PipelineState

from . import failpoints, index, lease, metadata, resume, storage
from .annotations.coco import read_categories
from .annotations.objects import fixed_object_labels, is_background, labels_lines
from .annotations.table import PIXELS, looks_normalized, required_columns
from .config import DATE_FIELD, LATEST, SPLIT_FOLDERS, ConvertConfig, Layout, names_only_source
from .errors import PipelineError, RejectsError, UsageError, last_line
from .finalize import PUBLISHED_DIRS, PUBLISHED_FILES, TFT_DIRS, untold_tft_files
from .listing import LABEL_COLUMN, PATH_COLUMN, manifest_sources, open_text, read_manifest_rows
from .runner import is_dataflow, make_options
from .storage import read_json, read_json_object

_LOG = logging.getLogger(__name__)
_GLOB_CHARS = re.compile(r"[*?\[]")


def is_remote(path: str) -> bool:
    return "://" in path


def absolute(path: str) -> str:
    return path.rstrip("/") if is_remote(path) else os.path.abspath(os.path.expanduser(path))


def _exists_any(pattern: str, flag: str, text: str) -> bool:
    """Whether anything matches ``pattern``. A listing that fails is a UsageError naming its cause, never
    "nothing there" (gs:// access itself was asked first, with a short deadline: _check_gcs_locations)."""
    try:
        return bool(FileSystems.match([pattern], limits=[1])[0].metadata_list)
    except Exception as e:  # noqa: BLE001 - named, not swallowed
        raise UsageError(f"{flag} {text}: cannot list {pattern}: {last_line(e)}") from None


def _run_locations(cfg: ConvertConfig) -> list[tuple[str, str, bool]]:
    """(flag, value, is a folder) for each location the run names."""
    places = [
        ("--input", cfg.input, True),
        ("--manifest", cfg.manifest, False),
        ("--coco", cfg.coco, False),
        ("--voc", cfg.voc, True),
        ("--masks", cfg.masks, True),
        ("--labels-file", cfg.labels_file, False),
        ("--output", cfg.output, True),
        ("--incremental-from", None if cfg.incremental_from == LATEST else cfg.incremental_from, True),
    ]
    return [(flag, value, folder) for flag, value, folder in places if value]


def _gcs_locations(cfg: ConvertConfig) -> list[tuple[str, str, bool]]:
    """(flag, value, is a folder) for each gs:// location the run names."""
    return [place for place in _run_locations(cfg) if place[1].startswith("gs://")]


def _ask_gcs(flag: str, value: str, *, folder: bool) -> bool:
    """storage.gcs_check of a location (a glob: the folder before its first wildcard); a UsageError naming the
    flag when GCS cannot be asked or refuses."""
    glob = _GLOB_CHARS.search(value)
    path = value[: glob.start()].rsplit("/", 1)[0] if glob else value
    try:
        return storage.gcs_check(path, folder=folder)
    except storage.GcsAccessError as e:
        raise UsageError(f"{flag} {value}: {e}") from None


def _check_gcs_locations(cfg: ConvertConfig) -> None:
    """Asks GCS about every gs:// location of the run before anything else, each within seconds: no network,
    a missing bucket, missing credentials or a refused permission is one line naming the flag and the cause.
    A folder input with nothing under it, or a file that is not there, is said here too."""
    for flag, value, folder in _gcs_locations(cfg):
        if _ask_gcs(flag, value, folder=folder) or _GLOB_CHARS.search(value):
            continue
        if not folder:
            raise UsageError(f"{flag} {value}: no such file")
        if flag in ("--input", "--voc", "--masks"):
            raise UsageError(f"{flag} {value}: nothing under it (the folder is empty or does not exist)")


# What Dataflow workers read or write themselves (--labels-file is read by the launcher alone).
_WORKER_FLAGS = ("--input", "--manifest", "--coco", "--voc", "--masks", "--output", "--incremental-from")


def _dataflow_locations(options: PipelineOptions) -> list[tuple[str, str]]:
    """(flag, value) of the Beam options that name where Dataflow stages, keeps temporary files or writes the
    job request."""
    gcp = options.view_as(GoogleCloudOptions)
    places = [
        ("--temp_location", gcp.temp_location),
        ("--staging_location", gcp.staging_location),
        ("--template_location", gcp.template_location),
    ]
    return [(flag, value) for flag, value in places if value]


def check_dataflow_paths(cfg: ConvertConfig, options: PipelineOptions) -> None:
    """DataflowRunner: a UsageError for a local path the workers would have to read or write (they cannot see
    this machine's disk), before anything is asked or staged. A local --template_location is this machine's."""
    if not is_dataflow(options):
        return
    places = [(flag, value) for flag, value, _ in _run_locations(cfg) if flag in _WORKER_FLAGS]
    places += [(flag, value) for flag, value in _dataflow_locations(options) if flag != "--template_location"]
    for flag, value in places:
        if not is_remote(value):
            raise UsageError(
                f"{flag} {value}: a local path, but Dataflow workers cannot read this machine's disk; give a gs:// path"
            )


def check_dataflow_access(options: PipelineOptions) -> None:
    """DataflowRunner: asks GCS about the buckets of --temp_location, --staging_location and
    --template_location with the short deadline of the run's own locations (storage.gcs_check). Beam asks about
    them first with its client's two-minute retries each (its soft-delete policy warning, when the options are
    validated), so no network was minutes of silence before any error."""
    if not is_dataflow(options):
        return
    for flag, value in _dataflow_locations(options):
        if value.startswith("gs://"):
            _ask_gcs(flag, value, folder=True)  # a prefix not there yet is fine: the bucket answered


def _input_root_and_pattern(text: str) -> tuple[str, str]:
    """(root, glob): a folder lists recursively; a glob's root is the folder before its first wildcard."""
    if _GLOB_CHARS.search(text):
        pattern = text if is_remote(text) else os.path.join(os.getcwd(), os.path.expanduser(text))
        prefix = pattern[: _GLOB_CHARS.search(pattern).start()]
        root = prefix.rsplit("/", 1)[0] or "/"
        if not _exists_any(pattern, "--input", text):
            raise UsageError(f"--input {text}: no files match")
        return root, pattern
    root = absolute(text)
    if not is_remote(root):
        if not os.path.exists(root):
            raise UsageError(f"--input {text}: no such folder")
        if not os.path.isdir(root):
            raise UsageError(f"--input {text}: is a file, not a folder (use --manifest for a list of files)")
    pattern = FileSystems.join(root, "**")
    if not _exists_any(pattern, "--input", text):
        raise UsageError(f"--input {text}: the folder is empty")
    return root, pattern


def _has_split_folders(root: str) -> bool:
    return any(_exists_any(FileSystems.join(root, name, "**"), "--input", root) for name in SPLIT_FOLDERS)


def flat_folder_hint(where: str) -> str:
    """What to do when every file sits directly in the input root and labels come from class folders."""
    return f"files directly in {where} have no class folder: pass --labels-from none"


# A root with more direct entries than this is not looked through up front (a flat bucket of
# millions of objects): the run's verdict gives the same hint if every file ends a no_label reject.
_FLAT_CHECK_LIMIT = 10_000


def _only_files_directly_in(root: str, pattern: str) -> bool:
    """True when every listed file is directly in ``root`` (image files there, no sub-folder), so none has a
    class folder: a glob with no ``/`` after the root, or a folder whose direct entries are image files only."""
    rest = pattern[len(root.rstrip("/")) + 1 :] if pattern.startswith(root.rstrip("/") + "/") else None
    if rest is None:
        return False
    if rest != "**":  # a glob: its matches are direct entries of root when it names no sub-folder
        return "/" not in rest and "**" not in rest
    from .config import IMAGE_EXTENSIONS
    from .listing import FILES, _Lister

    images = 0
    for n, entry in enumerate(_Lister(root).one_level(root)):
        if isinstance(entry, str) or n >= _FLAT_CHECK_LIMIT:  # a sub-folder, or too many to look through here
            return False
        if getattr(entry, "tag", None) == FILES:
            images += posixpath.splitext(entry.value.path)[1].lower() in IMAGE_EXTENSIONS
    return images > 0


def _manifest_format(path: str) -> str:
    lower = path.lower()
    if lower.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    return "csv"


# JSONL rows the launcher reads for a first look (a 'path' key, lines that are not JSON):
# the pipeline decides the label and split columns over every row.
FIRST_LOOK_ROWS = 100


def _manifest_columns(path: str, fmt: str) -> tuple[str, ...]:
    """The manifest's columns: a CSV's header (every row's), or the keys of the first JSONL rows only."""
    try:
        with open_text(path) as stream:
            if fmt == "csv":
                for row in csv.reader(stream):
                    if any(cell.strip() for cell in row):
                        header = tuple(cell.strip() for cell in row)
                        twice = _repeated(c for c in header if c)
                        if twice is not None:  # csv.DictReader would keep the last one's values, silently
                            raise UsageError(f"--manifest {path}: column {twice!r} appears twice in the header")
                        return header
                return ()
            columns: dict[str, None] = {}
            for i, row in enumerate(read_manifest_rows(stream, fmt)):
                columns.update(dict.fromkeys(row))
                if i + 1 >= FIRST_LOOK_ROWS:
                    break
            return tuple(columns)
    except UnicodeDecodeError:
        raise UsageError(f"--manifest {path}: not UTF-8 text") from None
    except ValueError as e:
        raise UsageError(f"--manifest {path}: {e}") from None
    except csv.Error as e:  # a header field over listing.MAX_CSV_FIELD
        raise UsageError(f"--manifest {path}: its header is not CSV the reader can take ({e})") from None


def _check_object_columns(cfg: ConvertConfig, fmt: str, columns: tuple[str, ...]) -> None:
    """--manifest-objects: a CSV's header must have the form's columns (a JSONL row may leave them out: a
    row without objects)."""
    if not cfg.manifest_objects or fmt != "csv":
        return
    missing = [c for c in required_columns(cfg.manifest_objects) if c not in columns]
    if missing:
        raise UsageError(
            f"--manifest-objects {cfg.manifest_objects}: {cfg.manifest} has no {', '.join(repr(c) for c in missing)} "
            f"column{'s' if len(missing) > 1 else ''} (found: {', '.join(columns)})"
        )


def _note_normalized_looking_boxes(cfg: ConvertConfig, path: str, fmt: str) -> None:
    """A note when the manifest's first rows give boxes only within [0, 1] while --box-units is pixels."""
    if not cfg.manifest_objects or cfg.box_units != PIXELS:
        return
    with open_text(path) as stream:
        first = list(itertools.islice(read_manifest_rows(stream, fmt), FIRST_LOOK_ROWS))
    if looks_normalized(first, cfg.manifest_objects):
        note(
            f"--manifest {cfg.manifest}: its first boxes all lie within [0, 1], under a pixel each as --box-units "
            "pixels reads them; normalized coordinates need --box-units normalized"
        )


def label_lines(path: str) -> list[str]:
    """The labels of a labels file, exactly: line k is label k, spaces included (labels.txt is written one
    label per line, and no label holds a character str.splitlines() splits on: listing rejects those as
    bad_label). Only the line ends go (``\n``, or ``\r\n`` of a file edited on Windows); an empty line holds
    no label (none is empty)."""
    with open_text(path) as stream:
        text = stream.read()
    lines = (line[:-1] if line.endswith("\r") else line for line in text.split("\n"))
    return [line for line in lines if line]


def _read_labels_file(path: str) -> tuple[str, ...]:
    if not FileSystems.exists(path):
        raise UsageError(f"--labels-file {path}: no such file")
    try:
        labels = label_lines(path)
    except UnicodeDecodeError:
        raise UsageError(f"--labels-file {path}: not UTF-8 text") from None
    except IsADirectoryError:
        raise UsageError(f"--labels-file {path}: a folder, not a file of labels") from None
    if not labels:
        raise UsageError(f"--labels-file {path}: no labels in it")
    twice = _repeated(labels)
    if twice is not None:
        raise UsageError(f"--labels-file {path}: label {twice!r} appears twice")
    broken = _line_break_label(labels)
    if broken:
        raise UsageError(f"--labels-file {path}: {broken}")
    spaced = [label for label in labels if label != label.strip()]
    if spaced:
        more = f" (and {len(spaced) - 1} more)" if len(spaced) > 1 else ""
        note(f"--labels-file {path}: label {spaced[0]!r}{more} has leading or trailing spaces, kept as they are")
    return tuple(labels)


def _previous_problem(path: str, labelled: bool) -> tuple[str | None, tuple[str, ...] | None]:
    """(why ``path`` cannot be the previous output of an incremental run, or None; its labels when labelled).

    Whether its records can be reused too is decided later (``index.reuse_problem``): its label ids are kept
    either way.
    """
    if not FileSystems.exists(FileSystems.join(path, metadata.SUCCESS)):
        return f"not a complete dataset (no {metadata.SUCCESS})", None
    if not labelled:
        return None, None
    labels_path = FileSystems.join(path, metadata.LABELS_TXT)
    if not FileSystems.exists(labels_path):
        return f"has no {metadata.LABELS_TXT}, and this run is labelled", None
    try:
        labels = tuple(label_lines(labels_path))
    except UnicodeDecodeError:
        return f"its {metadata.LABELS_TXT} is not UTF-8 text (damaged)", None
    if not labels:
        return f"{metadata.LABELS_TXT} lists no labels", None
    twice = _repeated(labels)
    if twice is not None:  # line k is id k: a label on two lines has no one id
        return f"its {metadata.LABELS_TXT} lists {twice!r} twice (damaged)", None
    broken = _line_break_label(labels)
    if broken:  # written before such labels were rejects: this run would keep it in its labels.txt
        return f"its {metadata.LABELS_TXT}: {broken}; start a new dataset without --incremental-from", None
    return None, labels


def _line_break_label(labels: Iterable[str]) -> str | None:
    """'label X holds …' for the first label holding a character str.splitlines() splits on, or None."""
    for label in labels:
        problem = metadata.line_break_problem(label)
        if problem:
            return f"label {label!r} {problem}"
    return None


def _repeated(labels: Iterable[str]) -> str | None:
    """The first label listed twice, or None."""
    seen: set[str] = set()
    for label in labels:
        if label in seen:
            return label
        seen.add(label)
    return None


def _other_coco_ids(
    cfg: ConvertConfig, previous: str, info: dict[str, Any] | None, categories: Sequence[tuple[int, str]]
) -> str | None:
    """Why the previous output's category ids are not this --coco run's (its labels.txt is not the first lines of
    this run's), naming --coco-category-offset when that changed; None when they are (or it has no labels.txt)."""
    _, prior = _previous_problem(previous, True)
    lines = labels_lines(categories)
    if prior is None or tuple(lines[: len(prior)]) == prior:
        return None
    old = ((info or {}).get("config") or {}).get("coco_category_offset") or 0
    if old != cfg.coco_category_offset:
        return (
            f"--coco-category-offset {cfg.coco_category_offset}: {previous} was converted with "
            f"--coco-category-offset {old} (other category ids)"
        )
    return f"--coco {cfg.coco}: other category ids than {previous}'s labels.txt"


def _read_previous(path: str, labelled: bool) -> tuple[str, tuple[str, ...] | None]:
    """(previous output, its labels or None) for --incremental-from; a UsageError if it cannot serve."""
    problem, labels = _previous_problem(path, labelled)
    if problem:
        raise UsageError(f"--incremental-from {path}: {problem}")
    return path, labels


def _previous_info(previous: str) -> dict[str, Any] | None:
    """The previous output's dataset.json, or None when it is damaged (also: JSON of another shape) or missing.

    A read that fails (a busy store, a lost connection) is raised as it is: not taken for damage, which would
    mean a full reconversion, nor for a usage mistake; the command line makes it one line, exit 1 (run again).
    """
    path = FileSystems.join(previous, metadata.DATASET_JSON)
    if not FileSystems.exists(path):
        return None
    failpoints.hit("launcher.previous")
    try:
        info = read_json_object(path)
    except ValueError:  # not JSON, not an object, nested too deep, not UTF-8
        return None
    return None if index.info_shape_problem(info) else info  # JSON, but not the shape this tool writes


def _note_reuse(cfg: ConvertConfig, previous: str, info: dict[str, Any] | None) -> bool:
    """One note when none of the previous output's records can be reused (its label ids still are kept).

    ``info``: its dataset.json (``_previous_info``). False when that is damaged or missing under ``latest``:
    nothing of it is read beyond its labels, so a nightly job is not stuck on one damaged night. Named by
    path, that dataset is a usage error.
    """
    if info is None:
        if cfg.incremental_from != LATEST:
            raise UsageError(f"--incremental-from {cfg.incremental_from}: {previous}: no readable dataset.json")
        note(
            f"--incremental-from {LATEST}: the newest earlier dataset, {previous}: no readable dataset.json; "
            "its label ids are kept, every file is converted"
        )
        return False
    why = index.reuse_problem(previous, info, cfg.as_dict())
    if why:
        note(
            f"--incremental-from {cfg.incremental_from}: no record of {previous} can be reused: {why}; "
            "its label ids are kept, every file is converted"
        )
    return True


# {date} as a glob (Beam's match has character classes; every file system lists by prefix).
_DATE_GLOB = "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]"


def earlier_dated_folders(template: str, files: Iterable[str], before: str) -> list[str]:
    """The folders ``template`` names for dates before ``before``, newest first, among ``files`` (files in them).

    A folder counts when {date} (everywhere it appears in ``template``) is one
    real calendar date strictly before ``before``: a folder of a later date, the
    run's own date, ``notes`` or ``2026-02-30`` does not.
    """
    from .retention import date_of

    dates = {date_of(template, path.rsplit("/", 1)[0]) for path in files}
    earlier = [d for d in dates if d is not None and d < before]  # YYYY-MM-DD sorts as dates do
    return [template.replace(DATE_FIELD, d) for d in sorted(earlier, reverse=True)]


def _complete_earlier_folders(template: str, pattern: str, before: str) -> list[str]:
    """The folders of ``template`` for dates before ``before`` that have _SUCCESS, newest first (on gs://, the
    newest only: the first found).

    On gs:// a glob lists every object under the path before {date}: every night's shards (millions a year
    without --keep-last). The dated folders are listed instead (a delimiter listing of the folder level that
    holds {date}), and _SUCCESS is looked for newest first.
    """
    if not is_remote(template):
        return earlier_dated_folders(template, [m.path for m in FileSystems.match([pattern])[0].metadata_list], before)
    from .retention import date_of

    head, _, rest = template.partition(DATE_FIELD)
    level = head.rpartition("/")[2] + DATE_FIELD + rest.split("/")[0]  # the folder name that holds {date}
    dates = {date_of(level, folder.rpartition("/")[2]) for folder in resume.gcs_folders(head)}
    for date in sorted((d for d in dates if d is not None and d < before), reverse=True):
        folder = template.replace(DATE_FIELD, date)
        if FileSystems.exists(FileSystems.join(folder, metadata.SUCCESS)):
            return [folder]
    return []


def _latest_previous(cfg: ConvertConfig, labelled: bool) -> tuple[str | None, tuple[str, ...] | None]:
    """--incremental-from latest: the newest earlier date's complete folder, with its labels; or (None, None).

    The earlier dates that have ``_SUCCESS`` are found by a listing (on gs://,
    of the dated folders, not their files); the newest of them is the previous
    output, whatever it holds: its label ids are the ones a model trained last
    night knows. If its records cannot be reused (no
    index.jsonl, other code: ``_note_reuse``), everything is converted with its
    ids; if it has no labels.txt (and this run is labelled), with fresh ids. An
    older date is never taken instead: its ids may be other than the newest's.
    """
    assert cfg.output_template is not None and cfg.run_date is not None  # config.validate
    template = absolute(cfg.output_template)
    pattern = FileSystems.join(template.replace(DATE_FIELD, _DATE_GLOB), metadata.SUCCESS)
    try:
        folders = _complete_earlier_folders(template, pattern, cfg.run_date)
    except Exception as e:  # noqa: BLE001 - a listing that fails must not pass for "no earlier dataset"
        raise UsageError(f"--incremental-from {LATEST}: cannot list {pattern}: {last_line(e)}") from None
    if not folders:
        note(f"--incremental-from {LATEST}: no earlier complete dataset for {template}; converting everything")
        return None, None
    problem, labels = _previous_problem(folders[0], labelled)
    if problem is not None:
        note(f"--incremental-from {LATEST}: the newest earlier dataset, {folders[0]}: {problem}; converting everything")
        return None, None
    _LOG.info("--incremental-from %s: %s", LATEST, folders[0])
    return folders[0], labels


def without_step(message: str) -> str:
    """A worker's error message without the ``[while running 'Step']`` tails the runner adds."""
    return re.sub(r"( \[while running '[^']*'\])+$", "", message)


def note(message: str) -> None:
    """One ``note:`` line on stderr: something a user should know that is no error."""
    print(f"note: {message}", file=sys.stderr, flush=True)


def _is_own_file(basename: str) -> bool:
    """A top-level name a run of this tool publishes (shards, metadata, TFT/TFDS artifacts, scratch)."""
    return (
        metadata.is_shard_file(basename)
        or basename in PUBLISHED_FILES
        or basename in PUBLISHED_DIRS
        or basename == metadata.SUCCESS
        or basename == lease.LEASE
        or basename.startswith(metadata.TMP_PREFIX)
    )


def _overlap(output: str, input_root: str) -> bool:
    """Whether the output lies inside the input folder or holds it. Local paths are compared as they resolve
    (symlinks followed, in every existing part of the path): an output reached through a link into the input
    is written into the folder being listed, as a plain path inside it is."""
    if not is_remote(output) and not is_remote(input_root):
        output, input_root = os.path.realpath(output), os.path.realpath(input_root)
    inside = lambda a, b: a == b or a.startswith(b.rstrip("/") + "/")  # noqa: E731
    return inside(output, input_root) or inside(input_root, output)


def _check_output(cfg: ConvertConfig, input_root: str | None) -> str:
    """The absolute output folder; refuses one that is a file, overlaps a listed folder, or is occupied.

    ``input_root`` is None for a manifest: only its rows are inputs, so an
    output beside the manifest is never listed as input.
    """
    out = absolute(cfg.output)
    if _GLOB_CHARS.search(out):
        # Beam's file systems would read them as a pattern wherever the output is listed.
        raise UsageError(f"--output {cfg.output}: the path may not hold [, * or ?")
    if not is_remote(out):
        if os.path.isfile(out):
            raise UsageError(f"--output {cfg.output}: is a file, not a folder")
    if input_root is not None and _overlap(out, input_root):
        raise UsageError(f"--output {cfg.output}: must not be inside the input folder (or contain it)")
    entries: list[str] = []
    if is_remote(out):
        try:
            entries = [m.path[len(out) + 1 :] for m in FileSystems.match([out + "/**"])[0].metadata_list]
        except Exception as e:  # noqa: BLE001 - a listing that failed is no empty output
            raise UsageError(f"--output {cfg.output}: cannot list it: {last_line(e)}") from None
    elif os.path.isdir(out):
        entries = os.listdir(out)
        if os.path.isdir(os.path.join(out, index.IDX_DIR)):
            entries += [f"{index.IDX_DIR}/{n}" for n in os.listdir(os.path.join(out, index.IDX_DIR))]
    top = {e.split("/", 1)[0] for e in entries}
    foreign = sorted(e for e in top if not _is_own_file(e))
    # The TFT folders are ours only beside a dataset of ours (or a run's scratch, a publish cut short): alone,
    # metadata/ (the name is a common one) or transform_fn/ is someone else's, and a run would write into it.
    ours = metadata.DATASET_JSON in top or any(e.startswith(metadata.TMP_PREFIX) for e in top)
    foreign += [] if ours else sorted(e for e in top if e in TFT_DIRS)
    # idx/ is ours only as far as it holds shard indexes: publish would remove other names in it as stale
    foreign += sorted(e for e in entries if e.startswith(index.IDX_DIR + "/") and not metadata.is_idx_file(e))
    if foreign:
        # Whatever --overwrite says: publishing would mix the dataset in
        # beside someone else's files, and a later publish deletes stale
        # names of this tool's own, never theirs, but a mixed folder is no
        # dataset anyone can trust.
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise UsageError(
            f"--output {cfg.output}: holds files this tool did not write ({shown}); choose an empty or new "
            "folder, or remove those files (--overwrite only replaces a dataset this tool wrote)"
        )
    if metadata.SUCCESS in top and not cfg.overwrite:
        raise UsageError(f"--output {cfg.output}: holds a complete dataset; pass --overwrite to replace it")
    untold = untold_tft_files(out) if metadata.DATASET_JSON in top and set(top) & set(TFT_DIRS) else []
    if untold:
        # Publish removes only the TFT files a dataset.json records: these would stay beside the new dataset.
        folders = ", ".join(sorted({rel.split("/", 1)[0] + "/" for rel in untold}))
        raise UsageError(
            f"--output {cfg.output}: its dataset.json is damaged (or names no file of its transform), so nothing "
            f"tells whether the {len(untold)} files under {folders} ({untold[0]}) are an earlier run's or yours; "
            "move any of yours out, delete those folders and run the same command again"
        )
    return out


def _finish_cut_short_publish(output: str, run_id: str) -> None:
    """A self-incremental run (--incremental-from its own --output) whose last run was killed while publishing:
    that run's publish is finished first (its staging folder holds the plan), under this run's lease.

    Without it the output never has ``_SUCCESS`` again and every re-run of the same command is refused.
    """
    from .finalize import PUBLISH_MANIFEST, publish

    if FileSystems.exists(FileSystems.join(output, metadata.SUCCESS)):
        return
    for folder in sorted(resume.scratch_folders(output), reverse=True):  # newest first
        plan = FileSystems.join(folder, PUBLISH_MANIFEST)
        if not FileSystems.exists(plan) or not read_json(plan).get("complete", True):
            continue
        name = folder.rstrip("/").rsplit("/", 1)[-1][len(metadata.TMP_PREFIX) :]
        try:
            publish(folder, output, leased=True, holder=run_id, release=False)
        except Exception as e:  # noqa: BLE001 - reported as the reason the previous output cannot serve
            raise UsageError(
                f"--incremental-from {output}: not a complete dataset (no {metadata.SUCCESS}); finishing the "
                f"publish of run {name}, cut short, failed: {last_line(e)}"
            ) from None
        note(f"finished the publish of run {name} in {output}, cut short by a crash")
        return


def prepare(
    cfg: ConvertConfig, *, check_output: bool = True, claim: Callable[[str, str], None] | None = None
) -> tuple[ConvertConfig, Layout]:
    """Resolves paths and input layout; raises UsageError for anything wrong.

    ``claim(output, run_id)`` takes the output lease (launcher.run_convert), after the output's checks and
    before anything reads a previous dataset in it.
    """
    _check_gcs_locations(cfg)
    manifest_format = None
    columns: tuple[str, ...] = ()
    if cfg.manifest:
        manifest = absolute(cfg.manifest)
        if not FileSystems.exists(manifest) or (not is_remote(manifest) and os.path.isdir(manifest)):
            raise UsageError(f"--manifest {cfg.manifest}: no such file")
        manifest_format = _manifest_format(manifest)
        columns = _manifest_columns(manifest, manifest_format)
        if PATH_COLUMN not in columns:
            found = ", ".join(columns) or "none"
            other = next((sep for sep in (";", "\t", "|") if len(columns) == 1 and sep in columns[0]), None)
            hint = f"; its columns look separated by {other!r}: a CSV manifest is separated by commas" if other else ""
            raise UsageError(f"--manifest {cfg.manifest}: no 'path' column (found: {found}){hint}")
        _check_object_columns(cfg, manifest_format, columns)
        _note_normalized_looking_boxes(cfg, manifest, manifest_format)
        root = posixpath.dirname(manifest) if is_remote(manifest) else os.path.dirname(manifest)
        pattern = None
    else:
        manifest = None
        root, pattern = _input_root_and_pattern(cfg.input or "")

    # A JSONL manifest's first rows may lack a column later rows have: the pipeline decides over every
    # row (listing.manifest_sources again); here a flag that conflicts with the first rows fails early.
    first_look = manifest_format == "jsonl"
    if manifest:
        seen = {*columns, LABEL_COLUMN} if first_look and cfg.labels_from == "manifest" else set(columns)
        split_source, label_source = manifest_sources(cfg, seen)
    else:
        folders = cfg.split_folders and _has_split_folders(root)
        split_source = "folders" if folders else ("ratios" if cfg.split_ratios else "default")
        if cfg.split_ratios and split_source == "folders":
            raise UsageError(
                "--split-ratios conflicts with the input: the input has split folders (train/, validation/, "
                "val/ or test/; if those are classes, pass --no-split-folders)"
            )
        label_source = "regex" if cfg.label_regex else (cfg.labels_from or "folder")
    coco, categories = None, None
    if cfg.coco:
        # a detection dataset: classes per object from the COCO file, no image/class/label
        label_source = "none"
        coco = absolute(cfg.coco)
        if not FileSystems.exists(coco) or (not is_remote(coco) and os.path.isdir(coco)):
            raise UsageError(f"--coco {cfg.coco}: no such file")
        found = read_categories(coco, cfg.coco_category_offset)
        categories = found.pairs
        if found.keypoints:
            many = "s" if found.keypoints != 1 else ""
            note(
                f"--coco {cfg.coco}: keypoints are not written ({found.keypoints} annotation{many} with keypoints: "
                "their boxes, classes and masks are; this tool writes no keypoint keys)"
            )
        if found.left_out is not None and not is_background(found.left_out):
            note(
                f"--coco {cfg.coco}: category 0 ({found.left_out!r}) names no object: left out of labels.txt and "
                "label_map.pbtxt (id 0 is the background)"
            )
        shared = found.shared_name()
        if shared is not None:
            note(
                f"--coco {cfg.coco}: categories {', '.join(map(str, shared[1]))} share the name {shared[0]!r}: kept "
                "as separate classes (a reader that looks classes up by name sees one)"
            )
    voc = None
    if cfg.voc:  # a detection dataset whose classes are named in the XML files (ids from the run's label list)
        label_source = "none"
        voc = absolute(cfg.voc)
        if not is_remote(voc) and not os.path.isdir(voc):
            raise UsageError(f"--voc {cfg.voc}: no such folder")
        if not FileSystems.match([FileSystems.join(voc, "**.xml")], limits=[1])[0].metadata_list:
            raise UsageError(f"--voc {cfg.voc}: no .xml files in it (the Annotations/ folder of a VOC set)")
    masks = None
    if cfg.masks:
        masks = absolute(cfg.masks)
        found = _exists_any(masks + "/**", "--masks", cfg.masks) if is_remote(masks) else os.path.isdir(masks)
        if not found:
            raise UsageError(f"--masks {cfg.masks}: no such folder (or nothing in it)")
        if not cfg.labels_from and not cfg.label_regex and not cfg.labels_file:
            label_source = "none"  # the classes are the label maps' pixel values

    if label_source == "folder" and pattern is not None and _only_files_directly_in(root, pattern):
        if masks and cfg.labels_file:  # --labels-from none would conflict with it: say what it is for
            raise UsageError(
                f"--labels-file {cfg.labels_file}: with --masks it names the images' class folders, and the files "
                f"directly in {root} have none (a label map's classes are its pixel values: drop --labels-file)"
            )
        raise UsageError(f"--input {cfg.input}: {flat_folder_hint(root)} for an unlabelled dataset")

    labels = _read_labels_file(absolute(cfg.labels_file)) if cfg.labels_file else None
    if labels is not None and names_only_source(cfg):  # the objects' class ids, fixed: 0 background, then 1…N
        fixed = fixed_object_labels(labels)
        if isinstance(fixed, str):
            raise UsageError(f"--labels-file {cfg.labels_file}: {fixed}")
        labels = fixed
    labelled = label_source != "none"
    output = _check_output(cfg, None if manifest else root) if check_output else absolute(cfg.output)
    run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8]
    if claim is not None:
        claim(output, run_id)
        # Checked again under the lease: another run may have published between the check and the claim.
        if check_output and not cfg.overwrite and FileSystems.exists(FileSystems.join(output, metadata.SUCCESS)):
            raise UsageError(f"--output {cfg.output}: holds a complete dataset; pass --overwrite to replace it")
    if cfg.incremental_from == LATEST:
        previous, prior_labels = _latest_previous(cfg, labelled)
    elif cfg.incremental_from:
        if claim is not None and cfg.overwrite and absolute(cfg.incremental_from) == output:
            _finish_cut_short_publish(output, run_id)
        previous, prior_labels = _read_previous(absolute(cfg.incremental_from), labelled)
    else:
        previous, prior_labels = None, None
    object_names = names_only_source(cfg)
    previous_info = _previous_info(previous) if previous else None
    if previous and object_names:
        # the objects' class ids of the previous run (its labels.txt) stay; new names follow
        problem, prior_labels = _previous_problem(previous, True)
        if problem is not None and (
            FileSystems.exists(FileSystems.join(previous, metadata.LABELS_TXT)) or "objects" in (previous_info or {})
        ):
            # A damaged (or deleted) labels.txt gives no ids to keep, and the records copied from that run hold
            # its ids (a record's object ids are not compared on reuse): fresh ids would disagree with them. A
            # previous dataset without objects and without labels.txt has no record this run could reuse.
            if cfg.incremental_from != LATEST:
                raise UsageError(f"--incremental-from {previous}: {problem}")
            where = f"--incremental-from {LATEST}: the newest earlier dataset, {previous}"
            note(f"{where}: {problem}; converting everything")
            previous, prior_labels = None, None
        elif labels is not None and tuple(labels[: len(prior_labels or ())]) != tuple(prior_labels or ()):
            # its records hold its ids (an object's id is not compared on reuse): none may be copied
            note(f"--labels-file {cfg.labels_file}: other ids than {previous}'s labels.txt; converting everything")
            previous, prior_labels = None, None
    elif previous and categories is not None:
        other = _other_coco_ids(cfg, previous, previous_info, categories)
        if other is not None:  # its records hold its ids: as for --labels-file, none is copied
            note(f"{other}; converting everything")
            previous = None
    elif previous and not labelled and first_look and not cfg.labels_from and not cfg.label_regex:
        # A later row may have a label: the previous run's ids, if it has any, keep their lines then.
        _, prior_labels = _previous_problem(previous, True)
    if previous and not _note_reuse(cfg, previous, previous_info):
        previous = None  # its label ids (prior_labels) are kept
    tmp_dir = FileSystems.join(output, metadata.TMP_PREFIX + run_id)
    # Earlier runs of this output that died holding finished shards (the same command run again).
    resume_from = (
        resume.resume_sources(output, tmp_dir) if check_output and cfg.resume and cfg.sink == "planned" else ()
    )
    cfg = _replace(cfg, output=output, manifest=manifest, input=None if manifest else cfg.input)
    layout = Layout(
        root=root,
        pattern=pattern,
        manifest=manifest,
        manifest_format=manifest_format,
        manifest_columns=columns,
        split_source=split_source,
        label_source=label_source,
        labels=labels,
        previous=previous,
        prior_labels=prior_labels,
        tmp_dir=tmp_dir,
        run_id=run_id,
        resume_from=resume_from,
        leased=claim is not None,
        coco=coco,
        categories=categories,
        object_names=object_names,
        voc=voc,
        masks=masks,
    )
    return cfg, layout


def _replace(cfg: ConvertConfig, **changes: Any) -> ConvertConfig:
    from dataclasses import replace

    return replace(cfg, **changes)


class LiveProgress:
    """Prints images done, rate and shards written on one updating stderr line (terminals only)."""

    def __init__(self, stream: Any = None, interval: float = 0.5) -> None:
        import sys
        import threading

        self._stream = stream or sys.stderr
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LiveProgress:
        if self._stream.isatty():
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            self._stream.write("\r" + " " * 79 + "\r")
            self._stream.flush()

    def _run(self) -> None:
        from .writer.shard import PROGRESS

        started = time.monotonic()
        base = PROGRESS.snapshot()
        while not self._stop.wait(self._interval):
            images, rejected, shards = (a - b for a, b in zip(PROGRESS.snapshot(), base, strict=True))
            elapsed = time.monotonic() - started
            rate = images / elapsed if elapsed > 0 else 0.0
            line = f"converting: {images:,} images ({rate:,.0f}/s), {rejected:,} rejected, {shards:,} shards written"
            self._stream.write("\r" + line[:79].ljust(79))
            self._stream.flush()


def _wait(result: Any) -> None:
    state = result.wait_until_finish()
    if state not in (PipelineState.DONE, None):
        raise PipelineError(f"the pipeline ended in state {state}")


def _past_allowance(rejects: int, allowance: int) -> str:
    """Which half of the rule past the fraction a run crossed (finalize.too_many_rejects)."""
    return f"more than --reject-allowance {allowance}" if rejects > allowance else "more than half of them"


def use_anonymous_gcs_for_emulator() -> bool:
    """With STORAGE_EMULATOR_HOST set, skip Beam's credential lookup (anonymous client).

    Off Google Cloud and without credentials, Beam retries the lookup for about
    25 s per process before falling back to an anonymous client; an emulator
    needs no credentials, so the fallback is taken at once.
    """
    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        return False
    storage.settle_gcs_credentials()
    return True


def _settle_gcs_credentials(cfg: ConvertConfig, options: PipelineOptions) -> None:
    """For a run that names a gs:// location: credentials, or anonymous at once (storage.settle_gcs_credentials).
    ``--no_auth`` does not reach Beam's GCS client in 2.77 (it still looks credentials up): here it does."""
    dataflow = is_dataflow(options) and any(v.startswith("gs://") for _, v in _dataflow_locations(options))
    dated = cfg.incremental_from == LATEST and (cfg.output_template or "").startswith("gs://")
    if _gcs_locations(cfg) or dated or dataflow:
        storage.settle_gcs_credentials(no_auth=bool(options.view_as(GoogleCloudOptions).no_auth))
    else:
        use_anonymous_gcs_for_emulator()


def worker_requirements(extra: str) -> list[str]:
    """What setup.py's ``extra`` adds to the base install, from this installed package's metadata, less Beam.

    One source for the launcher and ``pip install``; Beam is left out because a
    worker image's Beam is the launcher's already.
    """
    from importlib import metadata as importlib_metadata

    from packaging.requirements import Requirement

    try:
        lines = importlib_metadata.requires("beam_pipeline") or []
    except importlib_metadata.PackageNotFoundError:
        raise UsageError(
            "--setup_file: workers need the converter's requirements, read from the installed package; "
            "install it (pip install '.[convert]') or pass --requirements_file"
        ) from None
    wanted = []
    for line in lines:
        requirement = Requirement(line)
        if requirement.marker is None or not requirement.marker.evaluate({"extra": extra}):
            continue  # the base install (setup.py gives it) or another extra
        if requirement.name != "apache-beam":
            requirement.marker = None
            wanted.append(str(requirement))
    return wanted


def with_worker_requirements(cfg: ConvertConfig, beam_args: Sequence[str], folder: str) -> list[str]:
    """Beam flags that give ``--setup_file`` workers the converter (and TFT when they run the analysis).

    Workers install the package from setup.py without extras, which is the
    reader side (TensorFlow only); the converter is the ``[convert]`` extra and
    tensorflow-transform the ``[transform]`` one (its exact TensorFlow pin must
    not reach every install). A requirements file asks the workers to
    pip-install them at start (``[transform]`` when the job itself runs the
    analysis, ``--post-steps job``); ``--requirements_cache=skip`` keeps the
    launcher from downloading them first. Workers built from a prebuilt image
    (``--sdk_container_image``, the Dockerfile) have them; a given
    ``--requirements_file`` wins (with Beam's download cache outside the
    run's temporary folder unless ``--requirements_cache`` says where). The
    file is written in ``folder``, which must last until the job is submitted
    (the runner stages it then).
    """
    options = PipelineOptions(list(beam_args))
    setup = options.view_as(SetupOptions)
    if setup.requirements_file and setup.requirements_cache is None:
        # Beam's default cache of the requirements' downloads, meant to outlive the run, is in tempfile's
        # folder: the one outside the run's own (_RunTemporaryFolder)
        cache = os.path.join(_RUN_TEMPORARY_FOLDER.system_folder(), "beam-requirements-cache")
        return [*beam_args, f"--requirements_cache={cache}"]
    if not setup.setup_file or setup.requirements_file or options.view_as(WorkerOptions).sdk_container_image:
        return list(beam_args)
    extra = "transform" if cfg.transform and cfg.post_steps == "job" else "convert"
    path = os.path.join(folder, "requirements.txt")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("".join(f"{r}\n" for r in worker_requirements(extra)))
    return [*beam_args, f"--requirements_file={path}", "--requirements_cache=skip"]


# Said once by a run whose workers install the package at start (no worker image).
SETUP_FILE_COST = (
    "--setup_file: each worker pip-installs beam_pipeline and its requirements (TensorFlow, and TFT when the job "
    "runs the analysis: over 1 GB of wheels) when it starts, minutes per worker before it converts anything; "
    "a worker image has them (--sdk_container_image; configs/dataflow.yaml: WORKER_IMAGE; docs/dataflow.md)"
)
_PACKAGE_FLAGS = ("--setup_file", "--requirements_file", "--requirements_cache")


def with_worker_packages(cfg: ConvertConfig, beam_args: Sequence[str], folder: str) -> list[str]:
    """Beam flags that give a remote runner's workers the package, with ``folder`` for the files to stage.

    A worker image (``--sdk_container_image``, the Dockerfile's, which is also the Flex Template's) has the
    package and its requirements: the workers install nothing, so ``--setup_file`` and ``--requirements_file``
    (the config's fallback) are not staged. Without one, the workers install the sdist of ``--setup_file``
    and the requirements (with_worker_requirements), and the run says once what that costs. The sdist is built
    here (_built_sdist) and staged as an extra package.
    """
    options = PipelineOptions(list(beam_args))
    image = options.view_as(WorkerOptions).sdk_container_image
    setup_file = options.view_as(SetupOptions).setup_file
    if image:
        if setup_file or options.view_as(SetupOptions).requirements_file:
            _LOG.info("--sdk_container_image %s: workers run its beam_pipeline; not staging %s", image, _PACKAGE_FLAGS)
        return _without_flags(beam_args, _PACKAGE_FLAGS)
    args = with_worker_requirements(cfg, beam_args, folder)
    if not setup_file or os.path.basename(setup_file) != "setup.py":
        return args  # pyproject.toml: Beam's stager builds it (python -m build)
    note(SETUP_FILE_COST)
    return [*_without_flags(args, ("--setup_file",)), f"--extra_package={_built_sdist(setup_file, folder)}"]


def _without_flags(args: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``args`` less ``--flag=value`` and ``--flag value`` for each of ``flags``."""
    out: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
            if not arg.startswith("-"):
                continue
        name = arg.split("=", 1)[0]
        if name in flags:
            skip_value = "=" not in arg
            continue
        out.append(arg)
    return out


def _built_sdist(setup_file: str, folder: str) -> str:
    """The sdist of ``setup_file`` (a setup.py), built in ``folder``; what Beam's stager would stage.

    The stager runs ``python -m build`` in the setup file's folder first, and falls back to ``setup.py sdist``
    (what runs here) when that fails: pypa's ``build`` is not installed, and in a checkout the ``build/`` folder
    setuptools leaves shadows it, so each run printed a stray ``No module named build.__main__`` line.
    """
    import glob
    import subprocess
    import tempfile

    if not os.path.isfile(setup_file):
        raise UsageError(f"--setup_file {setup_file}: no such file")
    dist = tempfile.mkdtemp(prefix="sdist-", dir=folder)
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "--dist-dir", dist],
        cwd=os.path.dirname(os.path.abspath(setup_file)),
        capture_output=True,
        text=True,
        check=False,
    )
    archives = glob.glob(os.path.join(dist, "*.tar.gz"))
    if done.returncode or len(archives) != 1:
        said = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        cause = said[-1] if said else f"exit status {done.returncode}"
        raise UsageError(f"--setup_file {setup_file}: building its sdist failed: {cause}")
    return archives[0]


RUN_TEMPORARY_PREFIX = "beam_pipeline-run-"


class _RunTemporaryFolder:
    """One temporary folder for the runs of this process, removed with what was left in it when the last one
    ends (runs in threads share it; each makes its own files in it). In a process the tool owns (the command
    line, ``redirect``), it is also ``tempfile``'s default folder while the runs last, so what Beam's stager
    and TensorFlow leave there goes with it; a program that calls ``run_convert`` itself keeps its
    ``tempfile`` folder (its own threads' files must not be removed with the run's).

    A process that is killed (SIGKILL, the OOM killer) cannot remove its folder. It holds a lock in it
    (``resume.run_lock``) while its runs last, so the next process to start a run removes the folders whose
    lock is free and was taken on this host (``resume.run_state`` DEAD); a live run's, another host's and one
    without a lock file are left alone.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs = 0
        self._folder = ""
        self._before: str | None = None
        self._system = ""
        self._held: contextlib.ExitStack | None = None
        self._redirected = False

    def system_folder(self) -> str:
        """tempfile's folder outside the runs (for caches meant to outlive them)."""
        import tempfile

        with self._lock:
            return self._system if self._runs else tempfile.gettempdir()

    @contextlib.contextmanager
    def held(self, redirect: bool = False) -> Iterator[str]:
        import shutil
        import tempfile

        with self._lock:
            if self._runs == 0:
                self._system = tempfile.gettempdir()
                self._before = tempfile.tempdir
                self._folder = tempfile.mkdtemp(prefix=RUN_TEMPORARY_PREFIX)
                self._held = contextlib.ExitStack()
                self._held.enter_context(resume.run_lock(self._folder))
                _remove_dead_run_folders(self._system, self._folder)
                self._redirected = redirect
                if redirect:
                    tempfile.tempdir = self._folder
            self._runs += 1
            folder = self._folder
        try:
            yield folder
        finally:
            with self._lock:
                self._runs -= 1
                if self._runs == 0:
                    if self._redirected:
                        tempfile.tempdir = self._before
                    if self._held is not None:
                        self._held.close()  # the lock goes with the folder
                    shutil.rmtree(folder, ignore_errors=True)


def _remove_dead_run_folders(system: str, own: str) -> None:
    """Removes the run folders in ``system`` that processes killed on this host left (their lock is free)."""
    import shutil

    try:
        entries = [
            e.path
            for e in os.scandir(system)
            if e.name.startswith(RUN_TEMPORARY_PREFIX) and e.is_dir(follow_symlinks=False)
        ]
    except OSError:
        return
    for path in entries:
        try:
            mine = os.stat(path).st_uid == os.getuid()  # another user's folder is theirs to clean
        except (OSError, AttributeError):  # gone meanwhile; no uids (not POSIX)
            continue
        if mine and path != own and resume.run_state(path) == resume.DEAD:
            shutil.rmtree(path, ignore_errors=True)


_RUN_TEMPORARY_FOLDER = _RunTemporaryFolder()


def _options_for(cfg: ConvertConfig, beam_args: Sequence[str]) -> tuple[PipelineOptions, Any]:
    """make_options, checked against the run before anything is read or staged (Dataflow: no local path, its
    buckets answer), with the GCS credentials settled and FileSystems set to the same options."""
    options, runner = make_options(beam_args)
    check_dataflow_paths(cfg, options)
    _settle_gcs_credentials(cfg, options)
    # gs:// checks before the pipeline use the same options.
    FileSystems.set_options(options)
    check_dataflow_access(options)
    return options, runner


def run_convert(cfg: ConvertConfig, beam_args: Sequence[str], *, own_process: bool = False) -> dict[str, Any]:
    """Runs the whole conversion; returns dataset.json's content. ``own_process``: the process is the tool's (the
    command line), so the run may take over ``tempfile``'s folder (``_RunTemporaryFolder``)."""
    options, runner = _options_for(cfg, beam_args)
    # One run writes into an output at a time (lease.py): taken before anything reads or writes the output,
    # held (renewed) while the job runs, released when it ends; a submitted job's publish releases it.
    writes = not options.view_as(TestOptions).dry_run and not options.view_as(GoogleCloudOptions).template_location
    with contextlib.ExitStack() as held:
        # This process's temporary files, removed when the run returns: the workers' requirements file, and
        # what other code makes in tempfile's folder and leaves (Beam's stager: the sdist of --setup_file and
        # the pickled main session; TensorFlow's autograph: its generated modules). A scheduled launcher would
        # otherwise gather them run after run.
        local = held.enter_context(_RUN_TEMPORARY_FOLDER.held(redirect=own_process))

        def claim(output: str, run_id: str) -> None:
            try:
                held.enter_context(lease.held(output, run_id, detached=cfg.detach))
            except lease.LeaseHeld as e:
                raise UsageError(
                    f"--output {cfg.output}: {e} is writing into it; this run stops before touching it "
                    f"(a dead run's lease can be taken once it expires; if you know that run is dead, delete "
                    f"{lease.LEASE} in the output and run again)"
                ) from None

        cfg, layout = prepare(cfg, claim=claim if writes else None)
        return _run_claimed(cfg, layout, beam_args, options, runner, local)


def _run_claimed(
    cfg: ConvertConfig,
    layout: Layout,
    beam_args: Sequence[str],
    options: PipelineOptions,
    runner: Any,
    local: str,
) -> dict[str, Any]:
    """The run, once its output is claimed: the pipeline, then the post-steps unless the job does them.

    ``local``: a folder of this process's, removed when the run returns (the workers' requirements file goes
    there).
    """
    import tempfile

    from .pipeline import build_pipeline, build_plan_pipeline

    _LOG.info("input root %s, split source %s, label source %s", layout.root, layout.split_source, layout.label_source)
    if cfg.post_steps == "auto":
        cfg = dataclasses.replace(cfg, post_steps="launcher" if runner is not None else "job")
    if cfg.detach and (runner is not None or cfg.post_steps != "job"):
        raise UsageError("--detach needs a remote runner (e.g. --runner DataflowRunner) and --post-steps job")
    if runner is None:
        beam_args = with_worker_packages(cfg, beam_args, tempfile.mkdtemp(dir=local))
        options, runner = make_options(beam_args)
        FileSystems.set_options(options)
    if options.view_as(TestOptions).dry_run:
        return _dry_run(cfg, layout, options, runner)
    # While this process runs, its scratch folder is locked: a later run resumes from it, and
    # removes it after publishing, only once the lock is free (resume.py). Local outputs only.
    with resume.run_lock(layout.tmp_dir):
        wtt_shards = None
        try:
            if cfg.sink == "write_to_tfrecord":
                plan_path = FileSystems.join(layout.tmp_dir, "plan.json")
                _wait(build_plan_pipeline(cfg, layout, options, plan_path, runner=runner).run())
                wtt_shards = {s: d["num_shards"] for s, d in read_json(plan_path)["splits"].items()}
                options, runner = make_options(beam_args)
            pipeline = build_pipeline(cfg, layout, options, runner=runner, wtt_shards=wtt_shards)
            template = options.view_as(GoogleCloudOptions).template_location
            if template and runner is None:
                # Dataflow writes the full job request there instead of submitting it.
                pipeline.run()
                return {"template_location": template, "output": cfg.output}
            if cfg.detach:
                result = pipeline.run()
                job_id = getattr(result, "job_id", None)
                return {"detached": True, "job_id": job_id() if callable(job_id) else job_id, "output": cfg.output}
            with LiveProgress():
                _wait(pipeline.run())
        except PipelineError:
            raise
        except UsageError as e:  # found inside the pipeline (a JSONL row's column against a flag)
            raise UsageError(without_step(last_line(e))) from None
        except Exception as e:  # the runner wraps worker errors in assorted types
            raise PipelineError(last_line(e)) from e
        try:
            info = _after_pipeline(cfg, layout, beam_args)
        except (UsageError, RejectsError, PipelineError):
            raise
        except Exception as e:  # publish in this process: a lost lease, a staging folder refused
            raise PipelineError(last_line(e)) from e
        return _with_retention(cfg, layout, info)


def _with_retention(cfg: ConvertConfig, layout: Layout, info: dict[str, Any]) -> dict[str, Any]:
    """--keep-last after a run published here; with --post-steps job the job's last step does it (pipeline.py)."""
    if cfg.keep_last and cfg.post_steps == "launcher":
        from . import retention

        outcome = retention.apply(cfg, layout)
        if outcome is not None:
            info = {**info, "keep_last": outcome.as_dict(absolute(cfg.output_template or ""))}
    return info


def run_plan(cfg: ConvertConfig, beam_args: Sequence[str]) -> dict[str, Any]:
    """Lists and plans without reading pixels; nothing is written to the output. Returns the plan."""
    import tempfile

    from .pipeline import build_plan_pipeline

    options, runner = _options_for(cfg, beam_args)
    cfg, layout = prepare(cfg, check_output=False)
    with tempfile.TemporaryDirectory(prefix="beam_pipeline-plan-") as work:
        plan_path = os.path.join(work, "plan.json")
        try:
            _wait(build_plan_pipeline(cfg, layout, options, plan_path, runner=runner).run())
        except PipelineError:
            raise
        except UsageError as e:
            raise UsageError(without_step(last_line(e))) from None
        except Exception as e:
            raise PipelineError(last_line(e)) from e
        if not os.path.exists(plan_path):
            raise PipelineError("the planning run wrote no plan")
        plan = read_json(plan_path)
    for split, s in plan["splits"].items():
        n = s["num_shards"]
        s["files"] = [metadata.shard_name(cfg.name, split, i, n, cfg.compression) for i in range(n)]
    plan.update(output=cfg.output, name=cfg.name, target_shard_mb=cfg.target_shard_mb)
    return plan


def _dry_run(cfg: ConvertConfig, layout: Layout, options: PipelineOptions, runner: Any) -> dict[str, Any]:
    """Builds the job (Beam's --dry_run stops before submission) and describes it."""
    from .pipeline import build_pipeline

    if cfg.sink == "write_to_tfrecord":
        raise UsageError("--dry_run builds the planned sink only (write_to_tfrecord needs its planning run)")
    try:
        pipeline = build_pipeline(cfg, layout, options, runner=runner, wtt_shards=None)
        result = pipeline.run()
    except Exception as e:
        raise PipelineError(f"building the job: {last_line(e)}") from e
    gcp = options.view_as(GoogleCloudOptions)
    worker = options.view_as(WorkerOptions)
    setup = options.view_as(SetupOptions)
    job = getattr(result, "job", None)
    return {
        "dry_run": True,
        "runner": options.view_as(StandardOptions).runner or "DirectRunner",
        "job_name": gcp.job_name or (job.proto.name if job is not None else None),
        "project": gcp.project,
        "region": gcp.region,
        "temp_location": gcp.temp_location,
        "machine_type": worker.machine_type,
        "max_num_workers": worker.max_num_workers,
        "sdk_container_image": worker.sdk_container_image,
        "setup_file": setup.setup_file,
        "extra_packages": [os.path.basename(p) for p in setup.extra_packages or []],
        "steps": len(job.proto_pipeline.components.transforms) if job is not None else None,
        "post_steps": cfg.post_steps,
        "step_names": sorted(
            {t.unique_name.split("/")[0] for t in job.proto_pipeline.components.transforms.values()}
            if job is not None
            else []
        ),
        "output": cfg.output,
    }


def _after_pipeline(cfg: ConvertConfig, layout: Layout, beam_args: Sequence[str]) -> dict[str, Any]:
    """Reads finalize's verdict; runs the post-steps on the staging folder and publishes, unless the job did."""
    from .finalize import NO_OBJECT_KEPT, NOTHING_CONVERTED, OK, TOO_MANY_REJECTS
    from .poststeps import run_post_steps
    from .vocab.reasons import NO_LABEL

    staging_info = FileSystems.join(layout.tmp_dir, metadata.DATASET_JSON)
    success = FileSystems.join(cfg.output, metadata.SUCCESS)
    published_info = FileSystems.join(cfg.output, metadata.DATASET_JSON)
    staged = FileSystems.exists(staging_info)
    if staged:
        info, kept_old = read_json(staging_info), FileSystems.exists(success)
    elif FileSystems.exists(published_info):  # finalize published already (no post-steps, or a failed run)
        info, kept_old = read_json(published_info), False
        if info.get("run_id") != layout.run_id and not FileSystems.exists(success):
            raise PipelineError("the pipeline ended before finalize (dataset.json is an older run's)")
    else:
        raise PipelineError("the pipeline ended before finalize (no dataset.json)")
    status = info.get("status", OK)
    if status == OK and not staged:  # published by finalize or by the job's own post-steps
        return info
    if status != OK:
        rejects_at = layout.tmp_dir if kept_old else cfg.output
        reasons = ", ".join(f"{k} {v}" for k, v in list(info["rejects"]["by_reason"].items())[:3])
        total = info["rejects"]["total"]
        listed = total + info["examples"]
        kept_where = f"the dataset already in {cfg.output} is untouched, this run is in {layout.tmp_dir}"
        if status == TOO_MANY_REJECTS:
            where = kept_where if kept_old else f"shards written without _SUCCESS, see {rejects_at}/rejects.jsonl"
            raise RejectsError(
                f"{total} of {listed} inputs rejected ({reasons}): more than --max-reject-fraction "
                f"{cfg.max_reject_fraction:g} of them and {_past_allowance(total, cfg.reject_allowance)}; "
                f"{where}"
            )
        if status == NO_OBJECT_KEPT:
            objs = info["objects"]["rejects"]
            reasons = ", ".join(f"{k} {v}" for k, v in list(objs["by_reason"].items())[:3])
            where = kept_where if kept_old else "shards written without _SUCCESS"
            raise RejectsError(
                f"no object was kept: {objs['total']} annotations rejected ({reasons}; see "
                f"{rejects_at}/object_rejects.jsonl); {where}"
            )
        if status == NOTHING_CONVERTED:
            hint = ""
            if layout.label_source == "folder" and set(info["rejects"]["by_reason"]) == {NO_LABEL}:
                where = "the input" if layout.split_source != "folders" else "the input's split folders"
                hint = "; " + flat_folder_hint(where)
            raise RejectsError(
                f"no image was converted ({total} rejected: {reasons}; see {rejects_at}/rejects.jsonl){hint}"
            )
        skipped = ", ".join(f"{k} {v}" for k, v in info["skipped"]["by_reason"].items()) or "nothing at all"
        where = cfg.manifest or cfg.input
        raise UsageError(f"no images to convert in {where} (skipped: {skipped})")

    options, runner = make_options(beam_args)
    remote_temp = options.view_as(GoogleCloudOptions).temp_location if runner is None else None
    return run_post_steps(cfg, layout, info, options=options, runner=runner, temp_root=remote_temp)
