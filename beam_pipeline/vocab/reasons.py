"""Every reject reason code, as one table: the code, what it means, the stages that emit it, its file.

The codes are stable: they appear in ``rejects.jsonl``, ``object_rejects.jsonl``
and ``dataset.json``, and users filter on them. docs/bad-input.md's table of
image rejects is generated from ``REASONS`` (``scripts/gen_docs_tables.py``; a
test fails while the page is stale), and a test checks that every code a
detection page's table names is here.

    from beam_pipeline.vocab import reasons
    raise Rejected(reasons.TOO_SMALL, "12 x 9")
    reasons.by_code(reasons.TOO_SMALL).meaning
"""

from __future__ import annotations

from dataclasses import dataclass

# The stages that emit rejects, in the order an input meets them.
LISTING = "listing"  # the folder lister and manifest reader: names, labels, splits, manifest rows
ANNOTATIONS = "annotations"  # a COCO, VOC, manifest-objects or masks source joined to the listed images
READ = "read"  # reading a file's bytes (storage), before any decode
CHECK = "check"  # the image check: headers, limits, a full decode (images)
DEDUPE = "dedupe"  # --dedupe: one record per distinct content
RECORD = "record"  # building the tf.train.Example: extra columns, and the objects against the decoded size
STAGES = (LISTING, ANNOTATIONS, READ, CHECK, DEDUPE, RECORD)

# Where a reject is written: the image is left out, or only the object is.
IMAGE = "rejects.jsonl"
OBJECT = "object_rejects.jsonl"


@dataclass(frozen=True)
class Reason:
    code: str
    meaning: str  # Markdown, as docs/bad-input.md shows it (links relative to docs/)
    stages: tuple[str, ...]
    file: str = IMAGE


# Image rejects any input can meet (docs/bad-input.md's table, in its order).
EMPTY = "empty"
TRUNCATED = "truncated"
NOT_AN_IMAGE = "not_an_image"
UNSUPPORTED_FORMAT = "unsupported_format"
DECODE_ERROR = "decode_error"
TOO_MANY_PIXELS = "too_many_pixels"
TOO_MANY_FRAMES = "too_many_frames"
TOO_MANY_SCANS = "too_many_scans"
TOO_MANY_CHUNKS = "too_many_chunks"
TOO_LARGE = "too_large"
TOO_SMALL = "too_small"
UNREADABLE = "unreadable"
MISSING = "missing"
DUPLICATE = "duplicate"
NEAR_DUPLICATE_LEAK = "near_duplicate_leak"  # --near-duplicates drop-leaks: outside its group's first split
DUPLICATE_ROW = "duplicate_row"  # a manifest row naming a file an earlier row (by canonical JSON) names too
NO_LABEL = "no_label"
UNKNOWN_LABEL = "unknown_label"
NO_SPLIT = "no_split"
BAD_SPLIT = "bad_split"  # a manifest split value outside the usual names (or no safe name at all)
BAD_LABEL = "bad_label"  # a label that cannot be a line of labels.txt (it holds a line break)
BAD_VALUE = "bad_value"
BAD_FILENAME = "bad_filename"
UNSUPPORTED_LOCATION = "unsupported_location"  # a manifest path or COCO file_name that is a URL of another store

# Image rejects of an annotation source (docs/detection.md).
MISSING_IMAGE = "missing_image"
DUPLICATE_IMAGE_ID = "duplicate_image_id"
DUPLICATE_FILE_NAME = "duplicate_file_name"
BAD_IMAGE_ENTRY = "bad_image_entry"
ANNOTATION_SIZE_MISMATCH = "annotation_size_mismatch"
MASKS_TOO_LARGE = "masks_too_large"
CONFLICTING_ROWS = "conflicting_rows"  # rows of one file disagree on split, an extra column, width or height
BAD_OBJECTS = "bad_objects"  # an 'objects' cell that is not a JSON list: the image's objects are unknown
BAD_IMAGE_SIZE = "bad_image_size"  # width/height columns that are not positive whole numbers
MISSING_MASK = "missing_mask"  # an image without its label map: it cannot train segmentation
DUPLICATE_MASK = "duplicate_mask"  # two files in DIR for one image (a/b.png and a/b.PNG)
MASK_NOT_SINGLE_CHANNEL = "mask_not_single_channel"  # RGB(A), grey + alpha: colours, not class ids
# A label map or an object's segmentation that cannot be read (per image for --masks, per object for COCO).
BAD_MASK = "bad_mask"
MASK_SIZE_MISMATCH = "mask_size_mismatch"  # a label map (--masks) or an RLE (COCO) of another size than its image

# Object rejects: the image stays (object_rejects.jsonl).
UNKNOWN_IMAGE_ID = "unknown_image_id"
UNKNOWN_CATEGORY = "unknown_category"
BAD_BOX = "bad_box"  # zero or negative width/height, NaN, not four numbers
BOX_OUTSIDE_IMAGE = "box_outside_image"  # more than EDGE_TOLERANCE pixels beyond an edge
BAD_ANNOTATION = "bad_annotation"  # not an object, or a field of the wrong kind (iscrowd, area)
DUPLICATE_OBJECT = "duplicate_object"  # the same box and class again for one image: one is kept

_LABELS = "[Labels](input.md#labels)"
_SPLITS = "[Splits](input.md#splits)"

REASONS: tuple[Reason, ...] = (
    Reason(EMPTY, "zero bytes", (CHECK,)),
    Reason(TRUNCATED, "the data ends early", (CHECK,)),
    Reason(NOT_AN_IMAGE, "not a format Pillow recognises (text, random bytes)", (CHECK,)),
    Reason(
        UNSUPPORTED_FORMAT,
        "an image TensorFlow cannot read back, with `--on-unsupported reject`",
        (CHECK,),
    ),
    Reason(
        DECODE_ERROR,
        "any other decoding failure, and any error nobody foresaw while converting one file (the exception is in "
        "`detail`): one odd file never fails the job",
        (CHECK, RECORD),
    ),
    Reason(
        TOO_MANY_PIXELS,
        "a frame's canvas over `--max-pixels`, or all frames together over `--max-total-pixels` "
        "(see [Limits](#limits))",
        (CHECK,),
    ),
    Reason(TOO_MANY_FRAMES, "more frames or pages than `--max-frames`", (CHECK,)),
    Reason(
        TOO_MANY_SCANS,
        "a progressive JPEG of more than 256 scans, or whose scans × pixels pass 32 × 179 M (each scan revisits "
        "the whole image, ~1 ns a pixel)",
        (CHECK,),
    ),
    Reason(
        TOO_MANY_CHUNKS,
        "a PNG of more than 100,000 chunks, a JPEG whose header holds more than 100,000 segments and padding "
        "bytes, a TIFF of more than 100,000 tags over all its pages, a GIF of more than 100,000 extension "
        "sub-blocks or 1 MB of comments (see [Why these limits](#why-these-limits))",
        (CHECK,),
    ),
    Reason(TOO_LARGE, "a file over `--max-file-mb`, by its listed size: it is never read", (READ,)),
    Reason(TOO_SMALL, "shorter side under `--min-size`", (CHECK,)),
    Reason(
        UNREADABLE,
        "a directory named like an image, a dangling symlink, a file this job may not read (permissions; GCS "
        "403). A shard of 8 or more images that are all denied fails the job instead, naming the bucket or "
        "folder: the job's account lacks access",
        (LISTING, READ, ANNOTATIONS),
    ),
    Reason(
        MISSING,
        "a manifest row whose file does not exist, or a file gone before it was read (GCS 404)",
        (LISTING, READ),
    ),
    Reason(
        DUPLICATE,
        "with `--dedupe`: same bytes as a file whose relative path sorts first (the detail names it)",
        (DEDUPE,),
    ),
    Reason(
        NEAR_DUPLICATE_LEAK,
        "with `--near-duplicates drop-leaks`: an image of a near-duplicate group that spans splits, outside the "
        "group's first split (train, validation, test); the detail names the group's size and the first image "
        "that stays; not counted against `--max-reject-fraction` ([Leakage](leakage.md#dropping-leaks))",
        (DEDUPE,),
    ),
    Reason(
        DUPLICATE_ROW,
        "a manifest row naming a file another row names; the row kept is the first by canonical JSON (the "
        "detail shows both; see [Manifests](input.md#manifests))",
        (LISTING,),
    ),
    Reason(
        NO_LABEL,
        f"a labelled run's input without a label: outside the class folders, no regex match, an empty manifest "
        f"label (see {_LABELS})",
        (LISTING,),
    ),
    Reason(UNKNOWN_LABEL, f"a label that is not in `--labels-file` (see {_LABELS})", (LISTING,)),
    Reason(
        NO_SPLIT,
        f"an input with no split: a file outside the split folders, an empty manifest split (see {_SPLITS})",
        (LISTING,),
    ),
    Reason(BAD_SPLIT, f"a manifest split value that is not a usable split name (see {_SPLITS})", (LISTING,)),
    Reason(
        BAD_LABEL,
        "a label (a folder, regex or manifest value) holding a character `str.splitlines()` splits on (`\\n`, "
        "`\\r`, `\\x0b`, `\\x0c`, `\\x1c`–`\\x1e`, `\\x85`, U+2028, U+2029; the detail names it): `labels.txt` has "
        "one label per line, and a reader splitting it with `splitlines()` would shift the ids; with "
        "`--label-separator`, an empty label in the cell (two separators in a row, or one at an end) or a JSONL "
        "list item that is empty or not text; without it, a JSONL list ([Several labels per image]"
        "(input.md#several-labels-per-image-multi-label)); a JSONL label that is not text, when labels come from "
        "the manifest: an object, `true`/`false`, or a number that is not whole (`2.5`, `NaN`); a whole number "
        "is taken as its digits ([JSONL label values](input.md#jsonl-label-values))",
        (LISTING,),
    ),
    Reason(
        BAD_VALUE,
        "a manifest row's extra column holds a value the record cannot store (an integer column's value beyond "
        "int64); the detail names the column. Fixing the row makes the next incremental run convert the file",
        (RECORD,),
    ),
    Reason(
        BAD_FILENAME,
        "a file name that is not valid UTF-8 (records store names as text); its path in `rejects.jsonl` shows "
        "the odd bytes as `\\xNN`",
        (LISTING,),
    ),
    Reason(
        UNSUPPORTED_LOCATION,
        "a manifest row's path or a COCO `file_name` that is a URL of a store other than GCS (`s3://`, `az://`, "
        "`hdfs://`, `https://`): only local paths and `gs://` URLs are read ([Input](input.md#local-paths-and-gs))",
        (LISTING, ANNOTATIONS),
    ),
    # Annotation sources: docs/detection.md has each source's own table.
    Reason(MISSING_IMAGE, "an annotation names a file that is not under `--input`", (ANNOTATIONS,)),
    Reason(DUPLICATE_IMAGE_ID, "several COCO `images` entries have the same id", (ANNOTATIONS,)),
    Reason(DUPLICATE_FILE_NAME, "several annotation entries or files name the same image", (ANNOTATIONS,)),
    Reason(BAD_IMAGE_ENTRY, "a COCO `images` entry without a file name or a usable size", (ANNOTATIONS,)),
    Reason(
        ANNOTATION_SIZE_MISMATCH,
        "the image decodes to another size than its annotation says",
        (RECORD,),
    ),
    Reason(MASKS_TOO_LARGE, "an image's masks × its pixels are over `--max-mask-pixels`", (RECORD,)),
    Reason(CONFLICTING_ROWS, "manifest rows of one file disagree on its split, size or a column", (ANNOTATIONS,)),
    Reason(
        BAD_OBJECTS, "a manifest `objects` value that is not a list: the image's objects are unknown", (ANNOTATIONS,)
    ),
    Reason(BAD_IMAGE_SIZE, "manifest `width`/`height` that are not positive whole numbers", (ANNOTATIONS,)),
    Reason(BAD_ANNOTATION, "an annotation file that cannot be read (a VOC XML file)", (ANNOTATIONS,)),
    Reason(MISSING_MASK, "an image without its label map in `--masks`", (ANNOTATIONS,)),
    Reason(DUPLICATE_MASK, "two label maps in `--masks` for one image", (ANNOTATIONS,)),
    Reason(MASK_NOT_SINGLE_CHANNEL, "a label map with colours instead of class ids", (ANNOTATIONS,)),
    Reason(BAD_MASK, "a label map that is not a readable PNG of class ids", (ANNOTATIONS,)),
    Reason(MASK_SIZE_MISMATCH, "a label map of another size than its image", (ANNOTATIONS,)),
    Reason(UNKNOWN_IMAGE_ID, "a COCO annotation whose `image_id` has no `images` entry", (ANNOTATIONS,), OBJECT),
    Reason(UNKNOWN_CATEGORY, "an object's category is unknown, empty or reserved", (ANNOTATIONS,), OBJECT),
    Reason(BAD_BOX, "a box that is not four finite numbers of positive width and height", (ANNOTATIONS,), OBJECT),
    Reason(BOX_OUTSIDE_IMAGE, "a box edge more than 1 pixel outside the image", (ANNOTATIONS,), OBJECT),
    Reason(BAD_ANNOTATION, "an object, or a field of one, of the wrong kind", (ANNOTATIONS,), OBJECT),
    Reason(
        BAD_MASK,
        "an object's segmentation that is neither polygons nor an RLE covering the image",
        (ANNOTATIONS,),
        OBJECT,
    ),
    Reason(MASK_SIZE_MISMATCH, "an object's RLE of another size than its image", (ANNOTATIONS,), OBJECT),
    Reason(DUPLICATE_OBJECT, "the same box and label again for one image (one is kept)", (ANNOTATIONS,), OBJECT),
)

# The rows of docs/bad-input.md's table: rejects any input can meet, whatever its annotations.
GENERAL: tuple[Reason, ...] = REASONS[: REASONS.index(next(r for r in REASONS if r.code == MISSING_IMAGE))]


def by_code(code: str, file: str = IMAGE) -> Reason:
    """The table's row for ``code`` written to ``file``; KeyError for a code nobody emits."""
    for reason in REASONS:
        if reason.code == code and reason.file == file:
            return reason
    raise KeyError(code)


def markdown_table(rows: tuple[Reason, ...] = GENERAL) -> str:
    """``rows`` as docs/bad-input.md's table: a reason per line, with the stages that emit it."""
    lines = ["| reason | stage | meaning |", "|---|---|---|"]
    lines += [f"| `{r.code}` | {', '.join(r.stages)} | {r.meaning} |" for r in rows]
    return "\n".join(lines) + "\n"
