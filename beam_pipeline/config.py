"""The job's settings in one typed place.

``ConvertConfig`` holds what the user asked for (flags over ``--config`` YAML
over defaults).  ``Layout`` holds what the pre-flight checks found out about
the input before the pipeline starts (root, split and label sources, manifest
columns).  Both are frozen and travel to the workers inside the DoFns.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from .errors import UsageError

# The smallest --target-shard-mb: 100 bytes (a smaller one rounded to no bytes at all; tests cut tiny shards).
MIN_TARGET_SHARD_MB = 0.0001
# \Z, not $ (which also matches before a final newline); at most 64 characters: shard file names stay short
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}\Z")
# What --allow-split-names accepts: a shard name splits on "-" and ".", TFDS split specs
# use "[", "+" and "%"; letters, digits and _ are safe in both. TFDS reads "all" as every split.
SPLIT_RE = NAME_RE
RESERVED_SPLITS = frozenset({"all"})

# Split folder names accepted directly under the input root ("val" means validation).
SPLIT_FOLDERS = {"train": "train", "validation": "validation", "val": "validation", "test": "test"}
# The split names used without --allow-split-names (a typo must not silently make a split).
USUAL_SPLITS = ("train", "validation", "test")

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff"})
# Files operating systems leave in image folders; skipped, never rejected.
OS_FILES = frozenset({"thumbs.db", "desktop.ini", "ehthumbs.db", ".ds_store"})

COMPRESSIONS = ("none", "gzip")
# --format: formats.registry.FORMATS's names (a test keeps the two lists equal; this module imports no Beam)
OUTPUT_FORMATS = ("tfrecord", "array_record")
SINKS = ("planned", "write_to_tfrecord")
LABEL_SOURCES = ("folder", "none", "manifest", "regex")
UNSUPPORTED_POLICIES = ("convert", "reject")  # --on-unsupported
NEAR_DUPLICATE_MODES = ("report", "drop-leaks", "off")  # --near-duplicates (near_duplicates.py, leaks.py)
# bits of 64: the band join finds 56 % of pairs 12 bits apart, 10 % at 16 (near_duplicates.py, docs/leakage.md)
MAX_NEAR_DUPLICATE_DISTANCE = 12
POST_STEPS = ("auto", "launcher", "job")  # --post-steps
# --incremental-from latest: the newest complete dataset among the earlier dates of a dated --output.
LATEST = "latest"

# Where a path may be: on this machine or in a GCS bucket. Other stores Beam can reach (s3://, az://, hdfs://) need
# their own clients and credentials on every worker, which this tool neither installs nor tests.
SUPPORTED_LOCATIONS = "a local path or a gs:// URL"
URL_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
DATE_FIELD = "{date}"

MB = 1_000_000
# The largest --image-size: the TFT step holds each transformed image as side² × 3 float32 values (201 MB at
# 4096, against 0.6 MB at the default 224), several per batch; 16000 took 7 GB. Model inputs are far smaller
# (EfficientNet-B7 600, ViT-H/14 518).
MAX_IMAGE_SIZE = 4096


@dataclass(frozen=True)
class ConvertConfig:
    """What ``convert`` was asked to do (after flags, YAML and defaults are merged)."""

    output: str
    name: str
    input: str | None = None
    manifest: str | None = None
    labels_from: str | None = None  # None = the natural source for the input kind
    label_regex: str | None = None
    labels_file: str | None = None
    # Multi-label: a manifest's label cell holds several labels split on it (a JSONL list is taken as it is);
    # None = one label per image, a separator inside a label is part of it.
    label_separator: str | None = None
    coco: str | None = None  # COCO instances JSON: objects per image (annotations/coco.py)
    # Added to every COCO category id (categories and annotations): 1 makes a 0-based export (Label Studio) 1-based.
    coco_category_offset: int = 0
    # The manifest holds objects (annotations/table.py): "rows" (one row per object: xmin, ymin, xmax,
    # ymax, label) or "column" (an 'objects' column: a list per image); their boxes in BOX_UNITS.
    manifest_objects: str | None = None
    box_units: str = "pixels"
    voc: str | None = None  # Pascal VOC Annotations/ folder: one XML per image (annotations/voc.py)
    masks: str | None = None  # folder of label-map PNGs paired with the images by relative path (annotations/masks.py)
    incremental_from: str | None = None  # a previous complete output, or LATEST: its label ids stay, records reused
    # A dated run (--output with {date}): the --output as given, and the date put
    # in it. Where --incremental-from latest looks for the earlier dates.
    output_template: str | None = None
    run_date: str | None = None  # YYYY-MM-DD
    resume: bool = True  # take the shards earlier killed/failed runs of this output finished (resume.py)
    # After publishing a dated run: delete earlier dates' folders beyond the N newest complete (retention.py).
    keep_last: int | None = None
    split_ratios: tuple[tuple[str, float], ...] | None = None
    allow_split_names: bool = False  # split names beyond train/validation/test (SPLIT_RE)
    # A folder input's train/ validation/ (val/) test/ folders are its splits; False (--no-split-folders): they
    # are class folders like any other (a class named "train").
    split_folders: bool = True
    seed: int = 0
    target_shard_mb: float = 150.0
    compression: str = "none"
    format: str = "tfrecord"  # the shards' output format (formats/): tfrecord or array_record
    sink: str = "planned"
    overwrite: bool = False
    dedupe: bool = False  # one record per distinct content (sha256), across splits
    # report: near_duplicates.jsonl and dataset.json's counts; drop-leaks: also validation/test copies of train
    # images rejected before planning (leaks.py); off: no hash either
    near_duplicates: str = "report"
    near_duplicate_distance: int = 10  # bits of the 64-bit pHash (near_duplicates.DEFAULT_DISTANCE)
    report: bool = False  # report.html (report.py) written into the staged dataset and published with it
    # --incremental-from: a class count that moved by more than this share is a note (run/changes.py)
    change_share: float = 0.2
    max_class_drop: float | None = None  # --incremental-from: a class that lost more than this share stops the publish
    decode_threads: int = 0  # 0: one per core
    # Of listed inputs; above it nothing is published (exit 3). 1.0 = publish
    # whatever converted (a run that converts nothing still fails).
    max_reject_fraction: float = 0.05
    # Up to this many rejects never trip max_reject_fraction, unless they are most of the inputs
    # (finalize.outcome): a small folder with a few broken files publishes; a wrong input still stops.
    reject_allowance: int = 10
    transform: bool = True  # tensorflow-transform analysis after the shards
    image_size: int = 224
    image_stats: bool = False
    # Image policy (images.ImageOptions): limits, EXIF, resizing, re-encoding.
    max_pixels: int = 178_956_970  # per frame (images.DEFAULT_MAX_PIXELS)
    max_total_pixels: int = 2 * 178_956_970  # all frames of one image
    max_frames: int = 500
    max_file_mb: float = 256.0  # MB = 10^6 bytes, from the listing, before reading
    image_memory_mb: float = 1024.0  # images in flight per machine (writer.budget.Budget)
    min_size: int = 0
    apply_exif_orientation: bool = False
    strip_exif: bool = False
    resize_max_side: int = 0
    reencode: str | None = None  # "jpeg:QUALITY"
    on_unsupported: str = "convert"  # convert | reject
    max_mask_pixels: int = 4_000_000_000  # an annotated image's masks x its pixels (images.DEFAULT_MAX_MASK_PIXELS)
    tfds_metadata: bool = True  # written unless the shards are gzip (which TFDS cannot read)
    # Where TFT analysis, TFDS metadata and publishing run (run/poststeps.py):
    # auto = in the launching process for local runs, in the job for remote ones.
    post_steps: str = "auto"  # auto | launcher | job
    detach: bool = False  # submit a remote job and return without waiting (Flex Template launcher)

    @property
    def needs_post_steps(self) -> bool:
        """Whether the post-steps, not finalize, write _SUCCESS (after TFT artifacts / TFDS metadata)."""
        return self.transform or self.tfds_metadata

    @property
    def image_options(self) -> Any:
        from .images.options import ImageOptions

        return ImageOptions(
            max_pixels=self.max_pixels,
            max_total_pixels=self.max_total_pixels,
            max_frames=self.max_frames,
            # a tiny positive limit stays a limit (int() would make it 0: no limit)
            max_file_bytes=max(1, int(self.max_file_mb * MB)) if self.max_file_mb > 0 else 0,
            memory_budget_bytes=int(self.image_memory_mb * MB),
            min_size=self.min_size,
            apply_exif_orientation=self.apply_exif_orientation,
            strip_exif=self.strip_exif,
            resize_max_side=self.resize_max_side,
            reencode_quality=parse_reencode(self.reencode),
            on_unsupported=self.on_unsupported,
            max_mask_pixels=self.max_mask_pixels,
            perceptual_hash=self.near_duplicates != "off",
        )

    @property
    def target_shard_bytes(self) -> int:
        return int(self.target_shard_mb * MB)

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        if self.split_ratios is not None:
            out["split_ratios"] = dict(self.split_ratios)
        return out


@dataclass(frozen=True)
class Layout:
    """What the pre-flight look at the input decided."""

    root: str  # the input root: image/filename is relative to it
    pattern: str | None  # glob to list (folder/glob input); None for a manifest
    manifest: str | None
    manifest_format: str | None  # "csv" | "jsonl"
    manifest_columns: tuple[str, ...] = ()
    split_source: str = "default"  # manifest | folders | ratios | default
    label_source: str = "folder"  # folder | manifest | regex | none
    labels: tuple[str, ...] | None = None  # fixed order from --labels-file
    # --incremental-from: the previous output (absolute) and its labels.txt, whose ids stay.
    previous: str | None = None
    prior_labels: tuple[str, ...] | None = None
    tmp_dir: str = ""  # this run's scratch folder inside the output
    # Scratch folders of earlier runs of this output holding finished shards (resume.py), newest first.
    resume_from: tuple[str, ...] = ()
    run_id: str = ""
    leased: bool = False  # the launcher holds the output lease for run_id (lease.py): publish must find it still
    extra_columns: tuple[str, ...] = field(default=())
    # --coco: the file (absolute) and its categories as (id, name), read by the launcher (the rest is
    # streamed in the job). Categories set: a detection dataset (labels.txt, label_map.pbtxt, object keys).
    coco: str | None = None
    categories: tuple[tuple[int, str], ...] | None = None
    masks: str | None = None  # --masks: the label-map folder (absolute), listed and joined in the job
    # A names-only annotation source (VOC, CSV objects): its objects carry class names, and the run's
    # label list gives their ids (annotations.objects.name_labels: 0 background, then 1…N sorted, an
    # earlier run's ids kept); the categories are that list's. ``categories`` stays None then.
    object_names: bool = False
    voc: str | None = None  # --voc: the folder of XML files (absolute), read in the job


def names_only_source(cfg: ConvertConfig) -> bool:
    """Whether the run's objects come from a source that names classes without ids (VOC, CSV objects)."""
    return bool(cfg.voc) or bool(cfg.manifest_objects)


# --manifest-objects forms and --box-units (annotations/table.py reads them).
MANIFEST_OBJECTS = ("rows", "column")
BOX_UNITS = ("pixels", "normalized")


# COCO category ids a labels.txt line can stand for (line k = id k): beyond it a --coco file is refused
# (annotations/coco.py); also the largest --coco-category-offset.
MAX_CATEGORY_ID = 100_000

# Annotation sources: (flag, the ConvertConfig field, where its classes come from (None: the pixel values of
# a label map, which a --labels-* flag does not conflict with), what it reads its paths relative to).
_ANNOTATION_SOURCES = (
    ("--coco", "coco", "the COCO file", "--input (the folder its file_name values are relative to)"),
    ("--voc", "voc", "the XML files (ids 1…N by name)", "--input (the folder its <filename> values are relative to)"),
    ("--manifest-objects", "manifest_objects", "the manifest's 'label' of each object (ids 1…N by name)", None),
    ("--masks", "masks", None, "--input (the folder its label maps mirror)"),
)


def _validate_annotation_sources(cfg: ConvertConfig) -> None:
    """One annotation source per run; what each needs, and the flags that cannot go with it."""
    if cfg.coco_category_offset and not cfg.coco:
        raise UsageError("--coco-category-offset needs --coco (it renumbers a COCO file's categories)")
    if not 0 <= cfg.coco_category_offset <= MAX_CATEGORY_ID:
        raise UsageError(f"--coco-category-offset must be 0-{MAX_CATEGORY_ID} (it is added to every category id)")
    given = [source for source in _ANNOTATION_SOURCES if getattr(cfg, source[1])]
    if len(given) > 1:
        flags = " and ".join(flag for flag, *_ in given)
        raise UsageError(f"{flags}: give one annotation source per run")
    for flag, _, classes, needs in given:
        if needs and not cfg.input:
            raise UsageError(f"{flag} needs {needs}")
        # a names-only source's ids may be fixed by a --labels-file; COCO's come with their names
        fixed = cfg.labels_file and flag == "--coco"
        if classes and (cfg.labels_from not in (None, "none") or cfg.label_regex or fixed):
            what = "--labels-from/--label-regex/--labels-file" if flag == "--coco" else "--labels-from/--label-regex"
            raise UsageError(f"{flag} takes its classes from {classes}: drop {what}")
        if cfg.dedupe:
            raise UsageError(
                f"{flag} with --dedupe: one record per distinct content would merge copies of an image that carry "
                "different annotations (docs/detection.md)"
            )


def _validate_manifest_objects(cfg: ConvertConfig) -> None:
    """--manifest-objects / --box-units usage errors (the manifest's columns are the launcher's to check)."""
    if cfg.box_units not in BOX_UNITS:
        raise UsageError(f"--box-units must be one of {', '.join(BOX_UNITS)}")
    if not cfg.manifest_objects:
        if cfg.box_units != "pixels":
            raise UsageError("--box-units needs --manifest-objects (it says how the manifest's boxes are given)")
        return
    if cfg.manifest_objects not in MANIFEST_OBJECTS:
        raise UsageError(f"--manifest-objects must be one of {', '.join(MANIFEST_OBJECTS)}")
    if not cfg.manifest:
        raise UsageError("--manifest-objects needs --manifest (the CSV/JSONL file that lists the objects)")


def dataset_name_from_output(output: str) -> str:
    """``photos-tfrecords`` → ``photos_tfrecords``; a valid TFDS name for any folder."""
    base = output.rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9_]", "_", base).strip("_")
    name = re.sub(r"_+", "_", name)
    if not name or not name[0].isalpha():
        name = "dataset_" + name if name else "dataset"
    return name


def is_date(text: str) -> bool:
    """``2026-11-22`` is; ``2026-02-30``, ``20261122`` and ``2026-1-2`` are not."""
    if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text):
        return False
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        return False
    return True


def parse_reencode(text: str | None) -> int:
    """``jpeg:90`` → 90 (the JPEG quality); None → 0 (keep original bytes)."""
    if not text:
        return 0
    kind, _, quality = text.partition(":")
    if kind.strip().lower() not in ("jpeg", "jpg"):
        raise UsageError(f"--reencode {text!r}: only jpeg:QUALITY is supported")
    try:
        value = int(quality or 95)
    except ValueError:
        raise UsageError(f"--reencode {text!r}: quality must be a whole number") from None
    if not 1 <= value <= 100:
        raise UsageError(f"--reencode {text!r}: quality must be 1-100")
    return value


def split_name_problem(name: str, allow_any_name: bool = False) -> str | None:
    """Why ``name`` (after ``val`` → ``validation``) cannot name a split, with a hint; None if it can."""
    if name in USUAL_SPLITS:
        return None
    if allow_any_name and SPLIT_RE.match(name) and name.lower() not in RESERVED_SPLITS:
        return None
    if allow_any_name:
        return f"{name!r} cannot name a split (letters, digits and _, starting with a letter; not 'all')"
    guess = closest_split(name)
    hint = f"did you mean {guess}? " if guess else ""
    return (
        f"{name!r} is not a usual split name (train, validation (or val), test); "
        f"{hint}pass --allow-split-names to use other names"
    )


def closest_split(name: str) -> str | None:
    """The usual split a misspelt name most likely meant (``valid`` → validation, ``tset`` → test)."""
    import difflib

    lower = name.lower()
    for usual in (*USUAL_SPLITS, "val"):
        if len(lower) >= 3 and (usual.startswith(lower) or lower.startswith(usual)):
            return SPLIT_FOLDERS[usual]
    close = difflib.get_close_matches(lower, [*USUAL_SPLITS, "val"], n=1, cutoff=0.6)
    return SPLIT_FOLDERS[close[0]] if close else None


def case_twins(names: Iterable[str]) -> tuple[str, str] | None:
    """Two names that differ only in case (``Train``, ``train``), sorted, or None.

    Shard files are named after their split: on a case-insensitive file system (macOS, Windows, a Samba
    share) such splits would write into each other's files.
    """
    seen: dict[str, str] = {}
    for name in sorted(names):
        twin = seen.setdefault(name.casefold(), name)
        if twin != name:
            return twin, name
    return None


def case_twins_problem(names: Iterable[str]) -> str | None:
    """Why these split names cannot be one run's splits (two differ only in case), or None."""
    twins = case_twins(names)
    if twins is None:
        return None
    return (
        f"splits {twins[0]!r} and {twins[1]!r} differ only in case: their shard files would overwrite each "
        "other on a case-insensitive file system (macOS, Windows); spell them the same way"
    )


def parse_split_ratios(text: str, allow_any_name: bool = False) -> tuple[tuple[str, float], ...]:
    """``train=0.8,validation=0.1,test=0.1`` → ordered pairs; must sum to 1.

    Names outside train/validation/test need ``allow_any_name`` (--allow-split-names).
    """
    pairs: list[tuple[str, float]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        name = SPLIT_FOLDERS.get(name, name)
        if not sep or not name:
            raise UsageError(f"--split-ratios: expected NAME=RATIO pairs, got {part!r}")
        problem = split_name_problem(name, allow_any_name)
        if problem:
            raise UsageError(f"--split-ratios: {problem}")
        try:
            ratio = float(value)
        except ValueError:
            raise UsageError(f"--split-ratios: {value.strip()!r} is not a number") from None
        if not 0 <= ratio <= 1:
            raise UsageError(f"--split-ratios: ratio for {name} must be between 0 and 1")
        if any(n == name for n, _ in pairs):
            raise UsageError(f"--split-ratios: split {name} is given twice")
        pairs.append((name, ratio))
    if not pairs:
        raise UsageError("--split-ratios: no splits given")
    twins = case_twins_problem(name for name, _ in pairs)
    if twins:
        raise UsageError(f"--split-ratios: {twins}")
    total = sum(r for _, r in pairs)
    if abs(total - 1.0) > 1e-6:
        raise UsageError(f"--split-ratios: ratios sum to {total:g}, not 1")
    return tuple(pairs)


def _validate_format(cfg: ConvertConfig) -> None:
    """--format: a known one, a compression it takes, a sink that writes it, its library installed."""
    if cfg.format not in OUTPUT_FORMATS:
        raise UsageError(f"--format must be one of {', '.join(OUTPUT_FORMATS)}")
    if cfg.format == "tfrecord":
        return
    from .formats import registry

    fmt = registry.get(cfg.format)
    if cfg.compression not in fmt.compressions:
        raise UsageError(
            f"--compression {cfg.compression}: --format {cfg.format} shards are not compressed as files "
            f"(use --compression {' or '.join(fmt.compressions)})"
        )
    if cfg.sink != "planned":
        raise UsageError(f"--sink {cfg.sink} writes TFRecord only: --format {cfg.format} needs the planned sink")
    problem = fmt.missing()
    if problem:
        raise UsageError(problem)


def _check_label_separator(cfg: ConvertConfig) -> None:
    """--label-separator: a non-empty separator, for labels a manifest's label column gives."""
    sep = cfg.label_separator or ""
    if not sep or sep != sep.strip() or "\n" in sep or "\r" in sep:
        raise UsageError(f"--label-separator {sep!r}: give one or more characters, not spaces or line breaks alone")
    if not cfg.manifest or cfg.labels_from not in (None, "manifest") or cfg.label_regex:
        raise UsageError("--label-separator splits a manifest's label column: it needs --manifest (labels from it)")
    if cfg.manifest_objects:
        raise UsageError("--label-separator is for multi-label images; an object of --manifest-objects has one class")


def validate(cfg: ConvertConfig) -> None:
    """Checks that need no file system access; raises UsageError."""
    if bool(cfg.input) == bool(cfg.manifest):
        raise UsageError("give exactly one of --input or --manifest")
    if not cfg.output:
        raise UsageError("--output is required")
    if not NAME_RE.match(cfg.name):
        raise UsageError(
            f"--name {cfg.name!r} is not a valid dataset name (letters, digits, _; starts with a letter; at most 64)"
        )
    for flag, value in (
        ("--target-shard-mb", cfg.target_shard_mb),
        ("--max-file-mb", cfg.max_file_mb),
        ("--image-memory-mb", cfg.image_memory_mb),
    ):
        if not math.isfinite(value):  # nan and inf pass every comparison below, then fail inside the job
            raise UsageError(f"{flag} must be a finite number")
    if cfg.target_shard_mb < MIN_TARGET_SHARD_MB:
        raise UsageError(f"--target-shard-mb must be at least {MIN_TARGET_SHARD_MB:g} (100 bytes)")
    if cfg.compression not in COMPRESSIONS:
        raise UsageError(f"--compression must be one of {', '.join(COMPRESSIONS)}")
    if cfg.sink not in SINKS:
        raise UsageError(f"--sink must be one of {', '.join(SINKS)}")
    _validate_format(cfg)
    if cfg.labels_from is not None and cfg.labels_from not in LABEL_SOURCES:
        raise UsageError(f"--labels-from must be one of {', '.join(LABEL_SOURCES)}")
    if cfg.label_regex is not None:
        if cfg.labels_from not in (None, "regex"):
            raise UsageError(f"--label-regex cannot be combined with --labels-from {cfg.labels_from}")
        try:
            compiled = re.compile(cfg.label_regex)
        except re.error as e:
            raise UsageError(f"--label-regex {cfg.label_regex!r}: {e}") from None
        if compiled.groups < 1:
            raise UsageError("--label-regex needs a capture group, e.g. '_([a-z]+)\\.png$'")
    elif cfg.labels_from == "regex":
        raise UsageError("--labels-from regex needs --label-regex")
    if cfg.labels_from == "manifest" and not cfg.manifest:
        raise UsageError("--labels-from manifest needs --manifest")
    if cfg.labels_file and cfg.labels_from == "none":
        raise UsageError("--labels-file cannot be combined with --labels-from none")
    if cfg.label_separator is not None:
        _check_label_separator(cfg)
    _validate_annotation_sources(cfg)
    _validate_manifest_objects(cfg)
    if cfg.incremental_from and cfg.sink != "planned":
        raise UsageError("--incremental-from needs the planned sink (write_to_tfrecord writes no index.jsonl)")
    if cfg.run_date is not None and not is_date(cfg.run_date):
        raise UsageError(f"--run-date {cfg.run_date!r}: expected a date as YYYY-MM-DD")
    if cfg.output_template is not None and (DATE_FIELD not in cfg.output_template or cfg.run_date is None):
        raise UsageError(f"--output {cfg.output_template}: a dated output needs {DATE_FIELD} and a run date")
    if cfg.keep_last is not None and cfg.keep_last < 1:
        raise UsageError("--keep-last must be 1 or more (the complete dated datasets to keep)")
    if cfg.keep_last is not None and cfg.output_template is None:
        raise UsageError(
            f"--keep-last needs {DATE_FIELD} in --output (it deletes earlier dates' folders); without dates "
            "there is nothing to keep or delete"
        )
    if cfg.incremental_from == LATEST and cfg.output_template is None:
        raise UsageError(
            f"--incremental-from {LATEST} needs {DATE_FIELD} in --output (it takes the newest earlier date's "
            "dataset); give the previous output's path instead"
        )
    parse_reencode(cfg.reencode)
    if not (math.isfinite(cfg.change_share) and cfg.change_share > 0):
        raise UsageError("--change-share must be a positive number (0.2: a class count that moved by 20 %)")
    if cfg.max_class_drop is not None:
        if not (math.isfinite(cfg.max_class_drop) and 0 < cfg.max_class_drop <= 1):
            raise UsageError("--max-class-drop must be above 0 and at most 1 (0.5: a class that lost half its images)")
        if not cfg.incremental_from:
            raise UsageError("--max-class-drop needs --incremental-from (the night it compares with)")
    if cfg.near_duplicates not in NEAR_DUPLICATE_MODES:
        raise UsageError(f"--near-duplicates must be one of {', '.join(NEAR_DUPLICATE_MODES)}")
    if not 0 <= cfg.near_duplicate_distance <= MAX_NEAR_DUPLICATE_DISTANCE:
        raise UsageError(
            f"--near-duplicate-distance must be 0 to {MAX_NEAR_DUPLICATE_DISTANCE} (bits of a 64-bit hash; "
            "past 12 the search finds fewer and fewer of the pairs: docs/leakage.md)"
        )
    if cfg.on_unsupported not in UNSUPPORTED_POLICIES:
        raise UsageError("--on-unsupported must be convert or reject")
    if cfg.post_steps not in POST_STEPS:
        raise UsageError("--post-steps must be auto, launcher or job")
    if cfg.image_memory_mb <= 0:
        raise UsageError("--image-memory-mb must be positive")
    for flag, value in (
        ("--max-pixels", cfg.max_pixels),
        ("--max-total-pixels", cfg.max_total_pixels),
        ("--max-frames", cfg.max_frames),
        ("--max-file-mb", cfg.max_file_mb),
        ("--min-size", cfg.min_size),
        ("--resize-max-side", cfg.resize_max_side),
        ("--max-mask-pixels", cfg.max_mask_pixels),
    ):
        if value < 0:
            raise UsageError(f"{flag} must be 0 or more")
    if not 0 <= cfg.max_reject_fraction <= 1:
        raise UsageError("--max-reject-fraction must be between 0 and 1")
    if cfg.reject_allowance < 0:
        raise UsageError("--reject-allowance must be 0 or more")
    if not 1 <= cfg.image_size <= MAX_IMAGE_SIZE:
        raise UsageError(
            f"--image-size must be 1-{MAX_IMAGE_SIZE} pixels (the transform step holds side² × 12 bytes per image: "
            f"{MAX_IMAGE_SIZE**2 * 12 // MB} MB at {MAX_IMAGE_SIZE})"
        )
    if cfg.image_stats and not cfg.transform:
        raise UsageError("--image-stats needs the transform step (drop --no-transform)")
    if cfg.decode_threads < 0:
        raise UsageError("--decode-threads must be 0 (one per core) or more")


_Settings = TypeVar("_Settings")


def settings_for(record: type[_Settings], cfg: ConvertConfig, **computed: Any) -> _Settings:
    """A worker's settings record (a dataclass of the few settings a step needs) filled from the run's config:
    each field is the config's attribute of the same name, unless ``computed`` gives it. Built on the launcher."""
    return record(**{f.name: computed[f.name] if f.name in computed else getattr(cfg, f.name) for f in fields(record)})


def unsupported_scheme(path: str) -> str | None:
    """The URL scheme of ``path`` (``s3``, ``https``) when it is a URL of a store other than GCS; None for a
    ``gs://`` URL or a local path."""
    match = URL_SCHEME_RE.match(path)
    return match.group(1) if match and match.group(1) != "gs" else None
