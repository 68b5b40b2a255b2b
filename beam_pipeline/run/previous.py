"""Previous runs: the dataset an incremental run reuses (``--incremental-from PATH`` or ``latest``).

A previous dataset serves only when it is complete and its label ids can be kept; otherwise the run
converts everything and says why in a ``note:`` line.

    previous, prior_labels = choose_previous(
        cfg, output=out, run_id=run_id, leased=True, labelled=True, first_look=False, labels=None, categories=None
    )
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from apache_beam.io.filesystems import FileSystems

from .. import failpoints, index, metadata, storage
from ..annotations.objects import labels_lines
from ..config import DATE_FIELD, LATEST, ConvertConfig, names_only_source
from ..errors import UsageError, last_line
from ..storage import read_json_object
from ..vocab.dataset_info import DatasetInfo
from .common import absolute, label_lines, note
from .publish import finish_cut_short

_LOG = logging.getLogger(__name__)


def previous_problem(path: str, labelled: bool) -> tuple[str | None, tuple[str, ...] | None]:
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
    twice = repeated(labels)
    if twice is not None:  # line k is id k: a label on two lines has no one id
        return f"its {metadata.LABELS_TXT} lists {twice!r} twice (damaged)", None
    broken = line_break_label(labels)
    if broken:  # written before such labels were rejects: this run would keep it in its labels.txt
        return f"its {metadata.LABELS_TXT}: {broken}; start a new dataset without --incremental-from", None
    return None, labels


def line_break_label(labels: Iterable[str]) -> str | None:
    """'label X holds …' for the first label holding a character str.splitlines() splits on, or None."""
    for label in labels:
        problem = metadata.line_break_problem(label)
        if problem:
            return f"label {label!r} {problem}"
    return None


def repeated(labels: Iterable[str]) -> str | None:
    """The first label listed twice, or None."""
    seen: set[str] = set()
    for label in labels:
        if label in seen:
            return label
        seen.add(label)
    return None


def other_coco_ids(
    cfg: ConvertConfig, previous: str, info: DatasetInfo | None, categories: Sequence[tuple[int, str]]
) -> str | None:
    """Why the previous output's category ids are not this --coco run's (its labels.txt is not the first lines of
    this run's), naming --coco-category-offset when that changed; None when they are (or it has no labels.txt)."""
    _, prior = previous_problem(previous, True)
    lines = labels_lines(categories)
    if prior is None or tuple(lines[: len(prior)]) == prior:
        return None
    old = (info.config.get("coco_category_offset") if info is not None else None) or 0
    if old != cfg.coco_category_offset:
        return (
            f"--coco-category-offset {cfg.coco_category_offset}: {previous} was converted with "
            f"--coco-category-offset {old} (other category ids)"
        )
    return f"--coco {cfg.coco}: other category ids than {previous}'s labels.txt"


def read_previous(path: str, labelled: bool) -> tuple[str, tuple[str, ...] | None]:
    """(previous output, its labels or None) for --incremental-from; a UsageError if it cannot serve."""
    problem, labels = previous_problem(path, labelled)
    if problem:
        raise UsageError(f"--incremental-from {path}: {problem}")
    return path, labels


def info_of(previous: str) -> DatasetInfo | None:
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
        if index.info_shape_problem(info):  # JSON, but not the shape this tool writes
            return None
        return DatasetInfo.from_json(info)
    except ValueError:  # not JSON, not an object, nested too deep, not UTF-8; or a block of another shape
        return None


def note_reuse(cfg: ConvertConfig, previous: str, info: DatasetInfo | None) -> bool:
    """One note when none of the previous output's records can be reused (its label ids still are kept).

    ``info``: its dataset.json (``previous_info``). False when that is damaged or missing under ``latest``:
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
    from ..retention import date_of

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
    if not storage.is_remote(template):
        return earlier_dated_folders(template, [m.path for m in FileSystems.match([pattern])[0].metadata_list], before)
    from ..retention import date_of

    head, _, rest = template.partition(DATE_FIELD)
    level = head.rpartition("/")[2] + DATE_FIELD + rest.split("/")[0]  # the folder name that holds {date}
    dates = {date_of(level, folder.rpartition("/")[2]) for folder in storage.subfolders(head)}
    for date in sorted((d for d in dates if d is not None and d < before), reverse=True):
        folder = template.replace(DATE_FIELD, date)
        if FileSystems.exists(FileSystems.join(folder, metadata.SUCCESS)):
            return [folder]
    return []


def latest_previous(cfg: ConvertConfig, labelled: bool) -> tuple[str | None, tuple[str, ...] | None]:
    """--incremental-from latest: the newest earlier date's complete folder, with its labels; or (None, None).

    The earlier dates that have ``_SUCCESS`` are found by a listing (on gs://,
    of the dated folders, not their files); the newest of them is the previous
    output, whatever it holds: its label ids are the ones a model trained last
    night knows. If its records cannot be reused (no
    index.jsonl, other code: ``note_reuse``), everything is converted with its
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
    problem, labels = previous_problem(folders[0], labelled)
    if problem is not None:
        note(f"--incremental-from {LATEST}: the newest earlier dataset, {folders[0]}: {problem}; converting everything")
        return None, None
    _LOG.info("--incremental-from %s: %s", LATEST, folders[0])
    return folders[0], labels


def choose_previous(
    cfg: ConvertConfig,
    *,
    output: str,
    run_id: str,
    leased: bool,
    labelled: bool,
    first_look: bool,
    labels: tuple[str, ...] | None,
    categories: tuple[tuple[int, str], ...] | None,
) -> tuple[str | None, tuple[str, ...] | None]:
    """The previous dataset whose records this run may reuse (None: convert everything), and the label ids
    that stay (its labels.txt), whatever becomes of its records.

    ``leased``: this run holds the output's lease, so a self-incremental run (``--incremental-from`` its own
    ``--output``) may first finish the publish of the run before it, killed while publishing.
    """
    if cfg.incremental_from == LATEST:
        previous, prior_labels = latest_previous(cfg, labelled)
    elif cfg.incremental_from:
        if leased and cfg.overwrite and absolute(cfg.incremental_from) == output:
            finish_cut_short(output, run_id)
        previous, prior_labels = read_previous(absolute(cfg.incremental_from), labelled)
    else:
        return None, None
    if previous is None:
        return None, prior_labels
    info = info_of(previous)
    if names_only_source(cfg):
        # the objects' class ids of the previous run (its labels.txt) stay; new names follow
        return _keeping_object_ids(cfg, previous, info, labels)
    if categories is not None:
        other = other_coco_ids(cfg, previous, info, categories)
        if other is not None:  # its records hold its ids: as for --labels-file, none is copied
            note(f"{other}; converting everything")
            return None, prior_labels
    elif not labelled and first_look and not cfg.labels_from and not cfg.label_regex:
        # A later row may have a label: the previous run's ids, if it has any, keep their lines then.
        _, prior_labels = previous_problem(previous, True)
    if not note_reuse(cfg, previous, info):
        return None, prior_labels  # its records are not reused; its label ids are kept
    return previous, prior_labels


def _keeping_object_ids(
    cfg: ConvertConfig, previous: str, info: DatasetInfo | None, labels: tuple[str, ...] | None
) -> tuple[str | None, tuple[str, ...] | None]:
    """A names-only object source (VOC, manifest objects) over a previous dataset: its object ids stay."""
    problem, prior_labels = previous_problem(previous, True)
    if problem is not None and (
        FileSystems.exists(FileSystems.join(previous, metadata.LABELS_TXT))
        or (info is not None and info.objects is not None)
    ):
        # A damaged (or deleted) labels.txt gives no ids to keep, and the records copied from that run hold
        # its ids (a record's object ids are not compared on reuse): fresh ids would disagree with them. A
        # previous dataset without objects and without labels.txt has no record this run could reuse.
        if cfg.incremental_from != LATEST:
            raise UsageError(f"--incremental-from {previous}: {problem}")
        where = f"--incremental-from {LATEST}: the newest earlier dataset, {previous}"
        note(f"{where}: {problem}; converting everything")
        return None, None
    if labels is not None and tuple(labels[: len(prior_labels or ())]) != tuple(prior_labels or ()):
        # its records hold its ids (an object's id is not compared on reuse): none may be copied
        note(f"--labels-file {cfg.labels_file}: other ids than {previous}'s labels.txt; converting everything")
        return None, None
    if not note_reuse(cfg, previous, info):
        return None, prior_labels
    return previous, prior_labels
