"""Every command-line flag as data: one table per command, read top to bottom like its ``--help`` page.

``build_parser`` turns a table into the argparse parser; the ``--config``
keys (``CONFIG_KEYS``, what the Flex Template launcher passes on) come from
the same rows, so a flag, its YAML key and its type cannot drift apart.
tests/test_flags.py checks the rows against ``ConvertConfig``, ``validate``
and templates/metadata.json; scripts/gen_cli_reference.py writes the docs'
flag reference from the parsers.

    from beam_pipeline.flags import CONVERT, build_parser
    build_parser(CONVERT).print_help()
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from .config import (
    BOX_UNITS,
    COMPRESSIONS,
    DATE_FIELD,
    LABEL_SOURCES,
    LATEST,
    MANIFEST_OBJECTS,
    MAX_IMAGE_SIZE,
    MAX_NEAR_DUPLICATE_DISTANCE,
    NEAR_DUPLICATE_MODES,
    OUTPUT_FORMATS,
    POST_STEPS,
    SINKS,
    SUPPORTED_LOCATIONS,
    UNSUPPORTED_POLICIES,
    ConvertConfig,
    unsupported_scheme,
)
from .errors import UsageError


@dataclass(frozen=True)
class Flag:
    """One row: what ``add_argument`` gets, and whether the flag is a ``--config`` setting.

    The setting's key is the long name with ``_`` for ``-`` (``--max-file-mb`` → ``max_file_mb``),
    which is also argparse's dest and, for ``convert``, the ``ConvertConfig`` field.
    """

    name: str  # "--max-file-mb", or a positional's name ("output")
    help: str | None
    metavar: str | None = None
    type: type | None = None  # int or float; None: the value is a string
    choices: tuple[str, ...] | None = None
    switch: bool = False  # takes no value (store_true)
    short: str | None = None  # "-v"
    default: Any = None  # inspect/clean only; convert leaves an absent flag out (flags over YAML over defaults)
    # Append "(default: X)" to the help, X from ConvertConfig (never a copy that could drift) or this text.
    show_default: bool | str = False
    setting: bool = True  # a --config key (and a possible Flex Template parameter); False for --config, -v
    negates: str | None = None  # --no-resume: resume=False; a config file may say either
    location: bool = False  # a path, local or gs://: any other URL scheme (s3://, hdfs://, https://) is refused

    @property
    def key(self) -> str:
        """The setting's name: argparse's dest, the ``--config`` key, the template parameter."""
        return self.name.lstrip("-").replace("-", "_")

    @property
    def kind(self) -> type:
        """What a config value must become: bool for a switch, else the flag's type."""
        return bool if self.switch else self.type or str


@dataclass(frozen=True)
class Group:
    """A titled section of ``--help``; no title: argparse's own positional/options sections."""

    title: str | None
    flags: tuple[Flag, ...]


@dataclass(frozen=True)
class Command:
    """A whole ``--help`` page: usage, description, the groups of flags, the text after them."""

    prog: str
    groups: tuple[Group, ...]
    usage: str | None = None
    description: str | None = None
    epilog: str | None = None
    raw_text: bool = False  # description and epilog printed as written (line breaks kept)
    only_given: bool = False  # absent flags stay out of the namespace, so --config values show through

    @property
    def flags(self) -> tuple[Flag, ...]:
        return tuple(flag for group in self.groups for flag in group.flags)


class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ConvertConfig)}


def _help(flag: Flag) -> str:
    if not flag.show_default:
        return flag.help
    shown = flag.show_default if isinstance(flag.show_default, str) else _DEFAULTS[flag.key]
    return f"{flag.help} (default: {shown})"


def build_parser(command: Command) -> Parser:
    """The argparse parser a table describes, groups in table order."""
    parser = Parser(
        prog=command.prog,
        usage=command.usage,
        description=command.description,
        epilog=command.epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter if command.raw_text else argparse.HelpFormatter,
        allow_abbrev=False,
        argument_default=argparse.SUPPRESS if command.only_given else None,
    )
    for group in command.groups:
        target = parser.add_argument_group(group.title) if group.title else parser
        for flag in group.flags:
            names = (flag.short, flag.name) if flag.short else (flag.name,)
            kwargs: dict[str, Any] = {"help": _help(flag)}
            if flag.switch:
                kwargs["action"] = "store_true"
            for field in ("metavar", "type", "choices", "default"):
                if getattr(flag, field) is not None:
                    kwargs[field] = getattr(flag, field)
            target.add_argument(*names, **kwargs)
    return parser


# --- convert (plan takes the same flags) -----------------------------------------------------------

CONVERT_EPILOG = """\
examples:
  beam-pipeline convert --input ./photos --output ./photos-tfrecords \\
      --split-ratios train=0.8,validation=0.1,test=0.1
  beam-pipeline convert --manifest list.csv --output gs://bucket/datasets/pets --name pets
  beam-pipeline convert --input 'shots/*.png' --label-regex '_([a-z]+)\\.png$' --output ./shots-tfrecords
  beam-pipeline convert --input ./photos --output './nightly/{date}' --name photos \\
      --incremental-from latest --keep-last 7 --overwrite
  beam-pipeline convert --config configs/dataflow.yaml --input gs://b/photos --output gs://b/ds/{date} \\
      --name photos --incremental-from latest

Beam options: any flag not listed above goes to Apache Beam's PipelineOptions
(--runner, --direct_running_mode, --project, --temp_location, ...); a flag that
neither this tool nor Beam knows is an error. Local runs use Beam's Python
engine (never Prism, which downloads a binary: --runner PrismRunner is refused).

exit codes:
  0  done: the dataset and _SUCCESS are in --output
  1  the pipeline failed, or a read or write around it (the error line says where;
     -v shows the traceback); nothing published is touched: run it again
  2  usage, config or input mistake, found before anything ran (one line)
  3  too many rejects (--max-reject-fraction, past --reject-allowance), nothing
     converted, or every object of the annotations rejected: no _SUCCESS
  130  interrupted (Ctrl-C): run the same command again to resume
"""

CONVERT = Command(
    prog="beam_pipeline convert",
    usage="beam_pipeline convert (--input FOLDER|GLOB | --manifest FILE) --output DIR [options] [Beam options]",
    description="Images in a folder, a glob, a gs:// prefix or a manifest -> a sharded, shuffled TFRecord\n"
    "dataset. Flags override --config FILE.yaml, which overrides the defaults shown.",
    epilog=CONVERT_EPILOG,
    raw_text=True,
    only_given=True,
    groups=(
        Group(
            "required (as flags or in --config)",
            (
                Flag(
                    "--input",
                    "folder (listed recursively) or quoted glob of images; or --manifest",
                    metavar="FOLDER|GLOB",
                    location=True,
                ),
                Flag(
                    "--manifest",
                    "CSV (header row) or JSONL with a 'path' column; or --input",
                    metavar="FILE",
                    location=True,
                ),
                Flag(
                    "--output", "output folder, local or gs://; {date} becomes --run-date", metavar="DIR", location=True
                ),
            ),
        ),
        Group(
            "annotations (object detection)",
            (
                Flag(
                    "--coco",
                    "COCO instances JSON (local or gs://) whose images are under --input: boxes, category ids, "
                    "crowd flags and areas become the TF Object Detection API keys (see docs/detection.md)",
                    metavar="FILE",
                    location=True,
                ),
                Flag(
                    "--coco-category-offset",
                    "add N to every --coco category id, in categories and annotations alike: 1 converts an export "
                    "numbered from 0 (Label Studio), whose category 0 would be the background, with ids from 1",
                    metavar="N",
                    type=int,
                    show_default=True,
                ),
                Flag(
                    "--voc",
                    "Pascal VOC Annotations/ folder (one XML per image, local or gs://) whose images are under "
                    "--input: boxes, class names (ids 1…N by name), difficult, truncated and pose "
                    "(see docs/detection.md)",
                    metavar="DIR",
                    location=True,
                ),
                Flag(
                    "--manifest-objects",
                    "the --manifest lists objects: rows = one row per object (columns xmin, ymin, xmax, ymax and "
                    "label, the object's class name; empty box cells: an image without objects), column = an "
                    "'objects' column holding a list of {xmin, ymin, xmax, ymax, label} per image (JSON text in "
                    "a CSV); class ids 1…N by name (see docs/detection.md)",
                    choices=MANIFEST_OBJECTS,
                ),
                Flag(
                    "--box-units",
                    "how --manifest-objects boxes are given: pixels (0-based corners, xmax/ymax exclusive, of the "
                    "image file as stored) or normalized (fractions of its width and height, 0-1)",
                    choices=BOX_UNITS,
                    show_default=True,
                ),
                Flag(
                    "--masks",
                    "folder (local or gs://) of label-map PNGs mirroring --input (a/b.jpg <-> DIR/a/b.png): "
                    "pixel value = class id, stored as image/segmentation/class/encoded (see docs/detection.md)",
                    metavar="DIR",
                    location=True,
                ),
            ),
        ),
        Group(
            "labels and splits",
            (
                Flag(
                    "--labels-from",
                    "where labels come from (default: folder for --input; manifest if it has a 'label' column, "
                    "else none); regex needs --label-regex, which implies it",
                    choices=LABEL_SOURCES,
                ),
                Flag("--label-regex", "label = first group of RE searched in the file name", metavar="RE"),
                Flag(
                    "--labels-file",
                    "fixed label order, one per line (line k = id k; objects of --voc/--manifest-objects: ids 1…N)",
                    metavar="FILE",
                    location=True,
                ),
                Flag(
                    "--label-separator",
                    "multi-label: a manifest's label cell holds several labels split on SEP (e.g. 'cat|dog'; a "
                    "JSONL row may give a JSON list), written as an image/class/label list (default: one label "
                    "per image, SEP kept as text)",
                    metavar="SEP",
                ),
                Flag(
                    "--split-ratios",
                    "e.g. train=0.8,validation=0.1,test=0.1, by a seedless hash of the path (default: a manifest "
                    "'split' column, else train/ validation/ (or val/) test/ folders, else everything in train)",
                    metavar="SPEC",
                ),
                Flag(
                    "--no-split-folders",
                    "a folder input's top folders named train, validation, val or test are class folders like "
                    "the others, not splits (default: they are its splits)",
                    switch=True,
                    negates="split_folders",
                ),
                Flag(
                    "--allow-split-names",
                    "accept split names other than train, validation (val) and test in --split-ratios and a "
                    "manifest's split column (letters, digits, _); without it such a name is a usage error, or a "
                    "bad_split reject for a manifest row (default: off)",
                    switch=True,
                ),
            ),
        ),
        Group(
            "output",
            (
                Flag("--name", "dataset name in shard file names (default: from --output's folder name)"),
                Flag(
                    "--seed",
                    "shuffle seed; changes the order only, never the splits",
                    metavar="N",
                    type=int,
                    show_default=True,
                ),
                Flag(
                    "--target-shard-mb",
                    "target shard size, MB = 10^6 bytes",
                    metavar="MB",
                    type=float,
                    show_default="150",
                ),
                Flag(
                    "--compression",
                    "shard compression; gzip shards are not loaded by TFDS nor reused by --incremental-from",
                    choices=COMPRESSIONS,
                    show_default=True,
                ),
                Flag(
                    "--format",
                    "shard format: tfrecord (tf.data), or array_record (random access for Grain and TFDS data "
                    "sources; the same Example records, needs the array_record extra)",
                    choices=OUTPUT_FORMATS,
                    show_default=True,
                ),
                Flag(
                    "--sink",
                    "planned: bounded memory, everywhere (Dataflow too); write_to_tfrecord: Beam's WriteToTFRecord, "
                    "kept for compatibility: holds every record in memory on the local runner, and writes no "
                    "index.jsonl, --incremental-from or resume",
                    choices=SINKS,
                    show_default=True,
                ),
                Flag(
                    "--max-reject-fraction",
                    "above this share of rejected inputs (once past --reject-allowance): exit 3, no _SUCCESS; 1 "
                    "turns it off",
                    metavar="F",
                    type=float,
                    show_default=True,
                ),
                Flag(
                    "--reject-allowance",
                    "this many rejects never stop a run, unless they outnumber the converted images: a small "
                    "folder with a few broken files publishes",
                    metavar="N",
                    type=int,
                    show_default=True,
                ),
                Flag(
                    "--dedupe",
                    "keep one copy of identical files, by sha256 (reads every file once more) (default: off)",
                    switch=True,
                ),
                Flag(
                    "--near-duplicates",
                    "report: find groups of near-duplicate images (perceptual hashes within "
                    "--near-duplicate-distance bits, confirmed by a second measure), list them in "
                    "near_duplicates.jsonl and count them by the splits they span in dataset.json (planned sink); "
                    "drop-leaks: also reject, before the shards are planned, the images of a group spanning splits "
                    "outside its first split (train, validation, test; each image is read and checked once more); "
                    "off: no hash, no search",
                    choices=NEAR_DUPLICATE_MODES,
                    show_default=True,
                ),
                Flag(
                    "--near-duplicate-distance",
                    "bits (of 64) two images' perceptual hashes may differ in and still be near-duplicates (if a "
                    f"second measure agrees too), 0 to {MAX_NEAR_DUPLICATE_DISTANCE}",
                    metavar="N",
                    type=int,
                    show_default=True,
                ),
                Flag(
                    "--report",
                    "also write report.html into --output, published with the dataset: the page of inspect "
                    "--report (splits, sizes, rejects, near-duplicate groups side by side, a strip per class), "
                    "from 400 sampled records (default: off)",
                    switch=True,
                ),
                Flag(
                    "--decode-threads",
                    "decode threads per shard writer (default: 0 = one per core)",
                    metavar="N",
                    type=int,
                ),
            ),
        ),
        Group(
            "reruns",
            (
                Flag(
                    "--incremental-from",
                    "a previous complete output of this tool: its labels keep their ids (new ones are added after "
                    "them) and files unchanged since it (same path, size and mtime) are not read again; "
                    f"{LATEST} (needs {DATE_FIELD} in --output): the newest complete dataset of an earlier date, "
                    "or a full run if there is none",
                    metavar=f"OUTPUT|{LATEST}",
                    location=True,
                ),
                Flag(
                    "--change-share",
                    "with --incremental-from: a class whose image count moved by more than this share since the "
                    "previous dataset is a note in the summary and in dataset.json's changes",
                    metavar="F",
                    type=float,
                    show_default=True,
                ),
                Flag(
                    "--max-class-drop",
                    "with --incremental-from: a class that lost more than this share of its images (1: only one "
                    "that vanished) stops the publish (exit 3; the previous dataset stays) (default: off)",
                    metavar="F",
                    type=float,
                ),
                Flag(
                    "--no-resume",
                    "write every shard again, even those an earlier killed or failed run of --output finished with "
                    "the same inputs (default: those are taken as they are)",
                    switch=True,
                    negates="resume",
                ),
                Flag(
                    "--overwrite",
                    "replace a complete dataset of this tool in --output, once the new one is complete (never a "
                    "folder holding other files) (default: off)",
                    switch=True,
                ),
                Flag(
                    "--run-date",
                    "put where --output says {date}; names the Dataflow job too (default: today, UTC)",
                    metavar="YYYY-MM-DD",
                ),
                Flag(
                    "--keep-last",
                    f"with {DATE_FIELD} in --output: once this run is published, delete earlier dates' folders "
                    "beyond the N newest complete ones (never one holding other files, one a run is writing in, or "
                    "this run's --incremental-from) (default: keep all)",
                    metavar="N",
                    type=int,
                ),
            ),
        ),
        Group(
            "images",
            (
                Flag(
                    "--max-pixels",
                    "reject larger images from the header, 0 = no limit",
                    metavar="N",
                    type=int,
                    show_default=True,
                ),
                Flag(
                    "--max-total-pixels",
                    "reject images with more pixels over all frames, from the headers",
                    metavar="N",
                    type=int,
                    show_default=True,
                ),
                Flag(
                    "--max-frames",
                    "reject animations and multi-page files with more frames or pages",
                    metavar="N",
                    type=int,
                    show_default=True,
                ),
                Flag(
                    "--max-mask-pixels",
                    "reject annotated images whose masks x image pixels are more (instance masks), 0 = no limit",
                    metavar="N",
                    type=int,
                    show_default=True,
                ),
                Flag(
                    "--max-file-mb",
                    "reject larger files from the listing, before reading them (0: no limit)",
                    metavar="MB",
                    type=float,
                    show_default=True,
                ),
                Flag(
                    "--image-memory-mb",
                    "memory for image bytes and pixels in flight, per machine",
                    metavar="MB",
                    type=float,
                    show_default=True,
                ),
                Flag(
                    "--min-size",
                    "reject images whose shorter side is smaller",
                    metavar="PX",
                    type=int,
                    show_default=True,
                ),
                Flag(
                    "--apply-exif-orientation",
                    "rotate/flip the pixels as the EXIF orientation says (re-encodes those images) (default: off)",
                    switch=True,
                ),
                Flag(
                    "--strip-exif",
                    "drop EXIF (GPS included), XMP and text metadata; pixels untouched (default: off)",
                    switch=True,
                ),
                Flag(
                    "--resize-max-side",
                    "shrink images whose longer side is larger; JPEG sources stay JPEG, others become PNG "
                    "(default: 0 = never)",
                    metavar="PX",
                    type=int,
                ),
                Flag("--reencode", "store every image as a JPEG of quality Q (default: off)", metavar="jpeg:Q"),
                Flag(
                    "--on-unsupported",
                    "images TensorFlow cannot read back: convert (to PNG; JPEG with --reencode) or reject",
                    choices=UNSUPPORTED_POLICIES,
                    show_default=True,
                ),
            ),
        ),
        Group(
            "after the shards: tensorflow-transform and TFDS",
            (
                Flag(
                    "--no-transform",
                    "skip the TFT analysis (transform_fn/); skipped anyway, with a note, when tensorflow-transform "
                    "is not installed",
                    switch=True,
                    negates="transform",
                ),
                Flag(
                    "--image-size",
                    f"side of the transformed image, 1-{MAX_IMAGE_SIZE}",
                    metavar="PX",
                    type=int,
                    show_default=True,
                ),
                Flag(
                    "--image-stats",
                    "per-channel mean/std over the train split (reads it again) (default: off)",
                    switch=True,
                ),
                Flag(
                    "--no-tfds-metadata",
                    "skip dataset_info.json/features.json for tfds.builder_from_directory (default: written, "
                    "unless the shards are gzip)",
                    switch=True,
                    negates="tfds_metadata",
                ),
                Flag(
                    "--post-steps",
                    "where TFT analysis, TFDS metadata and publishing run; auto = here for local runs, in the job "
                    "on remote runners",
                    choices=POST_STEPS,
                    show_default=True,
                ),
                Flag(
                    "--detach",
                    "remote runners: submit the job and exit; the job writes _SUCCESS (default: off)",
                    switch=True,
                ),
            ),
        ),
        Group(
            "general",
            (
                Flag(
                    "--config",
                    "settings: long flag names with _ for -, plus pipeline_options:",
                    metavar="FILE.yaml",
                    setting=False,
                    location=True,
                ),
                Flag(
                    "--verbose",
                    "show Beam's and TensorFlow's logs and tracebacks",
                    short="-v",
                    switch=True,
                    setting=False,
                ),
            ),
        ),
    ),
)

# --config keys → the type a value must have. The positive form of a --no-X switch is a key too
# (``resume: false`` reads better in a file than ``no_resume: true``).
CONFIG_KEYS: dict[str, type] = {flag.key: flag.kind for flag in CONVERT.flags if flag.setting} | {
    flag.negates: bool for flag in CONVERT.flags if flag.negates
}
# --no-X switch key → the setting it turns off.
NEGATIONS: dict[str, str] = {flag.key: flag.negates for flag in CONVERT.flags if flag.negates}


def config_flag(key: str) -> Flag | None:
    """The convert flag behind a --config key (None for the positive form of a --no-X switch)."""
    return next((flag for flag in CONVERT.flags if flag.setting and flag.key == key), None)


# --- inspect and clean -------------------------------------------------------------------------------

TILE_SIZES = (32, 1024)  # a contact sheet's tile: a label still fits under it / 64 tiles stay under 70 MP

INSPECT = Command(
    prog="beam_pipeline inspect",
    groups=(
        Group(
            None,
            (
                Flag("output", "a converted dataset folder (local or gs://)", location=True),
                Flag("--split", "only this split"),
                Flag(
                    "--verify",
                    "read every record: CRCs, parse, sha256, decode, counts, index.jsonl, idx/",
                    switch=True,
                ),
                Flag("--contact-sheet", "write a PNG grid of random examples", location=True),
                Flag(
                    "--report",
                    "write one self-contained HTML page about the dataset (splits x classes, sizes, formats, "
                    "rejects, near-duplicate groups side by side, a strip per class, objects, changes; local or "
                    "gs://); always of the whole dataset (--split and --n do not apply) from 400 records sampled "
                    "by --seed",
                    metavar="FILE.html",
                    location=True,
                ),
                Flag("--n", "examples on the contact sheet (64)", type=int, default=64),
                Flag(
                    "--tile-size",
                    f"pixels per contact-sheet tile, {TILE_SIZES[0]}-{TILE_SIZES[1]} (128); larger shows boxes and "
                    "outlines better",
                    type=int,
                    default=128,
                ),
                Flag("--seed", "which random examples (0)", type=int, default=0),
                Flag("--verbose", None, short="-v", switch=True),
            ),
        ),
    ),
)


def clean_command(stale_days: float) -> Command:
    """``clean``'s page; ``stale_days`` is finalize.STALE_TMP_AGE_S in days (finalize imports Beam, so the
    caller passes it in when it builds the parser, not when this module is imported)."""
    return Command(
        prog="beam_pipeline clean",
        description="Removes the scratch folders (.beam_pipeline-tmp-*) that killed or failed runs left in "
        "OUTPUT; never one whose run is live (a local run holds a lock on its folder).",
        groups=(
            Group(
                None,
                (
                    Flag("output", "a dataset folder (local or gs://)", location=True),
                    Flag(
                        "--older-than",
                        "where nothing tells whether a run is live (GCS, no lock), remove folders older than this "
                        f"(e.g. 6h, 2d; default {stale_days:g}d)",
                        metavar="AGE",
                        default=f"{stale_days:g}d",
                    ),
                    Flag("--force", "remove those whatever their age (no run of OUTPUT is going)", switch=True),
                    Flag("--dry-run", "only say what would be removed", switch=True),
                    Flag("--verbose", None, short="-v", switch=True),
                ),
            ),
        ),
    )


def check_locations(command: Command, values: dict[str, Any]) -> None:
    """UsageError for a path flag whose value is a URL of a store other than GCS (``--input s3://b/photos``):
    before anything is listed, read or written."""
    for flag in command.flags:
        value = values.get(flag.key)
        scheme = unsupported_scheme(value) if flag.location and isinstance(value, str) else None
        if scheme:
            name = flag.name if flag.name.startswith("-") else flag.name.upper()
            raise UsageError(f"{name} {value}: {scheme}:// is not supported; give {SUPPORTED_LOCATIONS}")
