"""Preflight: everything a user can get wrong, checked before the pipeline starts.

The input (a folder, a glob or a manifest and its columns), the annotation sources (COCO, VOC, masks),
the labels file and the output folder are checked here and refused as one ``UsageError`` line naming
the flag or file. ``prepare`` runs the checks as named steps, claims the output (the lease) and finds
the previous dataset (``run.previous``), and returns the run's ``Layout``.

    cfg, layout = prepare(cfg, claim=claim)   # may raise UsageError
"""

from __future__ import annotations

import csv
import itertools
import posixpath
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

from apache_beam.io.filesystems import FileSystems

from .. import index, lease, metadata, resume, storage
from ..annotations.coco import read_categories
from ..annotations.objects import fixed_object_labels, is_background
from ..annotations.table import PIXELS, looks_normalized, required_columns
from ..config import LATEST, SPLIT_FOLDERS, ConvertConfig, Layout, names_only_source
from ..errors import UsageError, last_line
from ..sources.manifest import manifest_sources, open_text, read_manifest_rows
from ..sources.rules import LABEL_COLUMN, PATH_COLUMN
from .common import absolute, label_lines, note
from .previous import (
    choose_previous,
    line_break_label,
    repeated,
)
from .publish import PUBLISHED_DIRS, PUBLISHED_FILES, TFT_DIRS, untold_tft_files

GLOB_CHARS = re.compile(r"[*?\[]")  # what makes a path a glob


def _exists_any(pattern: str, flag: str, text: str) -> bool:
    """Whether anything matches ``pattern``. A listing that fails is a UsageError naming its cause, never
    "nothing there" (gs:// access itself was asked first, with a short deadline: _check_gcs_locations)."""
    try:
        return bool(FileSystems.match([pattern], limits=[1])[0].metadata_list)
    except Exception as e:  # noqa: BLE001 - named, not swallowed
        raise UsageError(f"{flag} {text}: cannot list {pattern}: {last_line(e)}") from None


def _has_any(folder: str, flag: str, text: str) -> bool:
    """storage.has_any, a failed listing a UsageError naming its cause (as _exists_any)."""
    try:
        return storage.has_any(folder)
    except Exception as e:  # noqa: BLE001 - named, not swallowed
        raise UsageError(f"{flag} {text}: cannot list it: {last_line(e)}") from None


def run_locations(cfg: ConvertConfig) -> list[tuple[str, str, bool]]:
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


def gcs_locations(cfg: ConvertConfig) -> list[tuple[str, str, bool]]:
    """(flag, value, is a folder) for each gs:// location the run names."""
    return [place for place in run_locations(cfg) if storage.is_remote(place[1])]


def ask_gcs(flag: str, value: str, *, folder: bool) -> bool:
    """storage.gcs_check of a location (a glob: the folder before its first wildcard); a UsageError naming the
    flag when GCS cannot be asked or refuses."""
    glob = GLOB_CHARS.search(value)
    path = value[: glob.start()].rsplit("/", 1)[0] if glob else value
    try:
        return storage.gcs_check(path, folder=folder)
    except storage.GcsAccessError as e:
        raise UsageError(f"{flag} {value}: {e}") from None


def _check_gcs_locations(cfg: ConvertConfig) -> None:
    """Asks GCS about every gs:// location of the run before anything else, each within seconds: no network,
    a missing bucket, missing credentials or a refused permission is one line naming the flag and the cause.
    A folder input with nothing under it, or a file that is not there, is said here too."""
    for flag, value, folder in gcs_locations(cfg):
        if ask_gcs(flag, value, folder=folder) or GLOB_CHARS.search(value):
            continue
        if not folder:
            raise UsageError(f"{flag} {value}: no such file")
        if flag in ("--input", "--voc", "--masks"):
            raise UsageError(f"{flag} {value}: nothing under it (the folder is empty or does not exist)")


def _input_root_and_pattern(text: str) -> tuple[str, str]:
    """(root, glob): a folder lists recursively; a glob's root is the folder before its first wildcard."""
    if GLOB_CHARS.search(text):
        pattern = storage.absolute_pattern(text)
        prefix = pattern[: GLOB_CHARS.search(pattern).start()]
        root = prefix.rsplit("/", 1)[0] or "/"
        if not _exists_any(pattern, "--input", text):
            raise UsageError(f"--input {text}: no files match")
        return root, pattern
    root = absolute(text)
    kind = storage.kind(root)
    if kind is None:
        raise UsageError(f"--input {text}: no such folder")
    if kind == "file":
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
    from ..config import IMAGE_EXTENSIONS
    from ..sources.folders import FILES, _from_listed, _Lister

    images = 0
    for n, entry in enumerate(_Lister(root).one_level(root)):
        if isinstance(entry, str) or n >= _FLAT_CHECK_LIMIT:  # a sub-folder, or too many to look through here
            return False
        if getattr(entry, "tag", None) == FILES:
            images += posixpath.splitext(_from_listed(entry.value)[0])[1].lower() in IMAGE_EXTENSIONS
    return images > 0


def manifest_format(path: str) -> str:
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
                        twice = repeated(c for c in header if c)
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
    except csv.Error as e:  # a header field over sources.manifest.MAX_CSV_FIELD
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
    twice = repeated(labels)
    if twice is not None:
        raise UsageError(f"--labels-file {path}: label {twice!r} appears twice")
    broken = line_break_label(labels)
    if broken:
        raise UsageError(f"--labels-file {path}: {broken}")
    spaced = [label for label in labels if label != label.strip()]
    if spaced:
        more = f" (and {len(spaced) - 1} more)" if len(spaced) > 1 else ""
        note(f"--labels-file {path}: label {spaced[0]!r}{more} has leading or trailing spaces, kept as they are")
    return tuple(labels)


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
    output, input_root = storage.resolved(output), storage.resolved(input_root)
    inside = lambda a, b: a == b or a.startswith(b.rstrip("/") + "/")  # noqa: E731
    return inside(output, input_root) or inside(input_root, output)


def _check_output(cfg: ConvertConfig, input_root: str | None) -> str:
    """The absolute output folder; refuses one that is a file, overlaps a listed folder, or is occupied.

    ``input_root`` is None for a manifest: only its rows are inputs, so an
    output beside the manifest is never listed as input.
    """
    out = absolute(cfg.output)
    if GLOB_CHARS.search(out):
        # Beam's file systems would read them as a pattern wherever the output is listed.
        raise UsageError(f"--output {cfg.output}: the path may not hold [, * or ?")
    if storage.kind(out) == "file":
        raise UsageError(f"--output {cfg.output}: is a file, not a folder")
    if input_root is not None and _overlap(out, input_root):
        raise UsageError(f"--output {cfg.output}: must not be inside the input folder (or contain it)")
    try:
        entries = storage.entries(out, into=(index.IDX_DIR,))
    except Exception as e:  # noqa: BLE001 - a listing that failed is no empty output
        raise UsageError(f"--output {cfg.output}: cannot list it: {last_line(e)}") from None
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


@dataclass(frozen=True)
class _Input:
    """Where the images come from, as the preflight found it."""

    root: str
    pattern: str | None  # a folder or glob input's pattern; None for a manifest
    manifest: str | None = None
    manifest_format: str | None = None
    columns: tuple[str, ...] = ()
    split_source: str = "default"
    label_source: str = "folder"
    # A JSONL manifest's first rows may lack a column later rows have: the pipeline decides over every row
    # (sources.manifest.manifest_sources again); here a flag that conflicts with the first rows fails early.
    first_look: bool = False


@dataclass(frozen=True)
class _Annotations:
    """The annotation sources, checked: absolute paths, and COCO's categories."""

    coco: str | None = None
    categories: tuple[tuple[int, str], ...] | None = None
    voc: str | None = None
    masks: str | None = None


def prepare(
    cfg: ConvertConfig, *, check_output: bool = True, claim: Callable[[str, str], None] | None = None
) -> tuple[ConvertConfig, Layout]:
    """Resolves paths and input layout; raises UsageError for anything wrong.

    ``claim(output, run_id)`` takes the output lease (run.convert.run_convert), after the output's checks and
    before anything reads a previous dataset in it.
    """
    _check_gcs_locations(cfg)
    source = _manifest_input(cfg) if cfg.manifest else _folder_input(cfg)
    annotations = _annotation_sources(cfg)
    if annotations.coco or annotations.voc or (annotations.masks and not _labels_flag(cfg)):
        # a detection dataset (classes per object) or label maps whose pixel values are the classes
        source = replace(source, label_source="none")
    _check_labels_have_folders(cfg, source, annotations)
    labels = _labels_file(cfg)
    output = _check_output(cfg, None if source.manifest else source.root) if check_output else absolute(cfg.output)
    run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8]
    if claim is not None:
        _claim(cfg, output, run_id, claim, check_output)
    previous, prior_labels = choose_previous(
        cfg,
        output=output,
        run_id=run_id,
        leased=claim is not None,
        labelled=source.label_source != "none",
        first_look=source.first_look,
        labels=labels,
        categories=annotations.categories,
    )
    tmp_dir = FileSystems.join(output, metadata.TMP_PREFIX + run_id)
    # Earlier runs of this output that died holding finished shards (the same command run again).
    resume_from = (
        resume.resume_sources(output, tmp_dir) if check_output and cfg.resume and cfg.sink == "planned" else ()
    )
    cfg = replace(cfg, output=output, manifest=source.manifest, input=None if source.manifest else cfg.input)
    layout = Layout(
        root=source.root,
        pattern=source.pattern,
        manifest=source.manifest,
        manifest_format=source.manifest_format,
        manifest_columns=source.columns,
        split_source=source.split_source,
        label_source=source.label_source,
        labels=labels,
        previous=previous,
        prior_labels=prior_labels,
        tmp_dir=tmp_dir,
        run_id=run_id,
        resume_from=resume_from,
        leased=claim is not None,
        coco=annotations.coco,
        categories=annotations.categories,
        object_names=names_only_source(cfg),
        voc=annotations.voc,
        masks=annotations.masks,
    )
    return cfg, layout


def _labels_flag(cfg: ConvertConfig) -> bool:
    return bool(cfg.labels_from or cfg.label_regex or cfg.labels_file)


def _manifest_input(cfg: ConvertConfig) -> _Input:
    """A manifest: present, a CSV or JSONL file with a ``path`` column; its split and label sources."""
    manifest = absolute(cfg.manifest or "")
    if not storage.is_file(manifest):
        raise UsageError(f"--manifest {cfg.manifest}: no such file")
    fmt = manifest_format(manifest)
    columns = _manifest_columns(manifest, fmt)
    if PATH_COLUMN not in columns:
        found = ", ".join(columns) or "none"
        other = next((sep for sep in (";", "\t", "|") if len(columns) == 1 and sep in columns[0]), None)
        hint = f"; its columns look separated by {other!r}: a CSV manifest is separated by commas" if other else ""
        raise UsageError(f"--manifest {cfg.manifest}: no 'path' column (found: {found}){hint}")
    _check_object_columns(cfg, fmt, columns)
    _note_normalized_looking_boxes(cfg, manifest, fmt)
    first_look = fmt == "jsonl"
    seen = {*columns, LABEL_COLUMN} if first_look and cfg.labels_from == "manifest" else set(columns)
    split_source, label_source = manifest_sources(cfg, seen)
    root = posixpath.dirname(manifest)  # a path's folder, local or in a bucket
    return _Input(root, None, manifest, fmt, columns, split_source, label_source, first_look)


def _folder_input(cfg: ConvertConfig) -> _Input:
    """A folder or glob: its root and pattern; split folders or ratios, and where labels come from."""
    root, pattern = _input_root_and_pattern(cfg.input or "")
    folders = cfg.split_folders and _has_split_folders(root)
    split_source = "folders" if folders else ("ratios" if cfg.split_ratios else "default")
    if cfg.split_ratios and split_source == "folders":
        raise UsageError(
            "--split-ratios conflicts with the input: the input has split folders (train/, validation/, "
            "val/ or test/; if those are classes, pass --no-split-folders)"
        )
    label_source = "regex" if cfg.label_regex else (cfg.labels_from or "folder")
    return _Input(root, pattern, split_source=split_source, label_source=label_source)


def _annotation_sources(cfg: ConvertConfig) -> _Annotations:
    """--coco (its categories read here, the rest streamed in the job), --voc and --masks: present and usable."""
    coco, categories = None, None
    if cfg.coco:
        coco = absolute(cfg.coco)
        if not storage.is_file(coco):
            raise UsageError(f"--coco {cfg.coco}: no such file")
        categories = _coco_categories(cfg, coco)
    voc = None
    if cfg.voc:  # a detection dataset whose classes are named in the XML files (ids from the run's label list)
        voc = absolute(cfg.voc)
        if not storage.is_folder(voc):
            raise UsageError(f"--voc {cfg.voc}: no such folder")
        if not FileSystems.match([FileSystems.join(voc, "**.xml")], limits=[1])[0].metadata_list:
            raise UsageError(f"--voc {cfg.voc}: no .xml files in it (the Annotations/ folder of a VOC set)")
    masks = None
    if cfg.masks:
        masks = absolute(cfg.masks)
        if not _has_any(masks, "--masks", cfg.masks):
            raise UsageError(f"--masks {cfg.masks}: no such folder (or nothing in it)")
    return _Annotations(coco, categories, voc, masks)


def _coco_categories(cfg: ConvertConfig, coco: str) -> tuple[tuple[int, str], ...]:
    """The COCO file's categories as (id, name); notes what the run leaves out or a reader may confuse."""
    found = read_categories(coco, cfg.coco_category_offset)
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
    return found.pairs


def _check_labels_have_folders(cfg: ConvertConfig, source: _Input, annotations: _Annotations) -> None:
    """Labels from class folders need folders: files directly in the input root have none."""
    if source.label_source != "folder" or source.pattern is None:
        return
    if not _only_files_directly_in(source.root, source.pattern):
        return
    if annotations.masks and cfg.labels_file:  # --labels-from none would conflict with it: say what it is for
        raise UsageError(
            f"--labels-file {cfg.labels_file}: with --masks it names the images' class folders, and the files "
            f"directly in {source.root} have none (a label map's classes are its pixel values: drop --labels-file)"
        )
    raise UsageError(f"--input {cfg.input}: {flat_folder_hint(source.root)} for an unlabelled dataset")


def _labels_file(cfg: ConvertConfig) -> tuple[str, ...] | None:
    """--labels-file's labels; for a names-only object source, its objects' ids (0 background, then 1…N)."""
    if not cfg.labels_file:
        return None
    labels = _read_labels_file(absolute(cfg.labels_file))
    if names_only_source(cfg):
        fixed = fixed_object_labels(labels)
        if isinstance(fixed, str):
            raise UsageError(f"--labels-file {cfg.labels_file}: {fixed}")
        labels = fixed
    return labels


def _claim(cfg: ConvertConfig, output: str, run_id: str, claim: Callable[[str, str], None], check_output: bool) -> None:
    """Takes the output's lease; checks again under it: another run may have published since the check."""
    claim(output, run_id)
    if check_output and not cfg.overwrite and FileSystems.exists(FileSystems.join(output, metadata.SUCCESS)):
        raise UsageError(f"--output {cfg.output}: holds a complete dataset; pass --overwrite to replace it")
