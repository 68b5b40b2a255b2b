"""Finalize and publish: make a run visible, correctly even when a step is run twice.

Finalize runs once, after every shard is written: temp shards get their final
names inside the run's staging folder (empty shards dropped, the rest
numbered), the rejects parts are streamed into one ``rejects.jsonl``, then
``labels.txt`` and ``dataset.json``.  Publish then moves the staging folder
into the output.

Every step may run again with the same inputs (Dataflow retries a bundle
that failed half-way, and re-runs a step whose output was lost):

- finalize's renames are "source gone and destination present = done", and
  what an earlier attempt wrote is rewritten the same;
- publish first writes a **manifest** into the staging folder (the run's
  files with their sizes, and the files of an older run to remove), then
  works only from it: a retry finds the manifest and finishes the same
  plan. The old ``_SUCCESS`` goes right before the first change, the run's
  files move in, the older run's files go, ``dataset.json`` moves last, every
  manifest entry is checked present with its size, and only then is
  ``_SUCCESS`` written. Shards and ``.idx`` files are linked (copied on GCS),
  not moved: they stay in the staging folder until it is removed, so a run
  killed inside its publish and run again takes them (resume.py);
- ``published_run()`` tells a retried step that its run is in the output
  already (``dataset.json`` names the run id) or half-published (the
  manifest exists): it finishes the publish instead of redoing the step.

A run that may not publish (nothing converted, more rejects than
``--max-reject-fraction``) leaves an existing dataset untouched; into an
empty folder it writes its files without ``_SUCCESS``.

Renames and deletes on GCS go in batches of ``BATCH`` (one HTTP batch call
each for the copies and the deletes) through one client per process; what
exists is learnt from one listing of the staging folder and one of the
output, not one request per file.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from . import failpoints, index, lease, metadata, resume, storage
from .annotations import coco, masks, objects
from .config import ConvertConfig, Layout
from .storage import delete_quietly, delete_tree, read_json, read_json_object, sizes_under, write_text
from .storage import files_under as _files_under
from .storage import remove_empty_dirs as _remove_empty_dirs

_LOG = logging.getLogger(__name__)

# Inside the staging folder, never published: the publish plan, and the
# rejects as part files (one per hash bucket of the path) until finalize
# streams them into rejects.jsonl.
PUBLISH_MANIFEST = "_publish.json"
REJECT_PARTS = "_rejects"
REJECT_BUCKETS = 256
# Scratch folders of other runs are removed only when their run started this
# long ago: a younger one may belong to a run still going on the same output.
STALE_TMP_AGE_S = 3 * 24 * 3600


def move_files(
    pairs: Sequence[tuple[str, str]],
    existing: set[str],
    point: str,
    guard: lease.Guard | None = None,
    kept: Iterable[str] = (),
) -> None:
    """storage.move_files with failpoint ``point`` hit before each file."""
    storage.move_files(pairs, existing, kept, lambda: failpoints.hit(point), guard)


def delete_files(paths: Sequence[str], point: str | None = None, guard: lease.Guard | None = None) -> None:
    """storage.delete_files with failpoint ``point`` (if any) hit before each file."""
    storage.delete_files(paths, (lambda: failpoints.hit(point)) if point else None, guard)


def run_started(run_id: str) -> float | None:
    """Seconds since the epoch when a run started: its id begins with the launcher's local time, YYYYmmdd-HHMMSS."""
    try:
        return time.mktime(time.strptime(run_id[:15], "%Y%m%d-%H%M%S"))
    except ValueError:
        return None


def stale_tmp_dirs(out_dir: str, keep: str = "", now: float | None = None) -> list[str]:
    """Scratch folders of runs of this tool in ``out_dir`` that started over STALE_TMP_AGE_S ago.

    A younger one may be a run still going (two runs on one output): it is
    left alone. ``keep`` (this run's own) is never listed.
    """
    try:
        folders = resume.scratch_folders(out_dir)  # names only, not every file under them
    except Exception:  # noqa: BLE001 - a listing that fails leaves them for the next run
        return []
    now = time.time() if now is None else now
    out = []
    for folder in folders:
        started = run_started(folder.rsplit("/", 1)[-1][len(metadata.TMP_PREFIX) :])
        if folder.rstrip("/") != keep.rstrip("/") and started is not None and now - started > STALE_TMP_AGE_S:
            out.append(folder)
    return out


# --- finalize ------------------------------------------------------------------


def choose_results(results: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], Mapping[str, Any]]:
    """One result per (split, shard); a duplicate (a retried writer) is resolved the same way every time."""
    chosen: dict[tuple[str, int], Mapping[str, Any]] = {}
    for result in sorted(results, key=lambda r: (r["split"], r["shard"], r["tmp_path"])):
        chosen.setdefault((result["split"], result["shard"]), result)
    return chosen


def final_layout(
    chosen: Mapping[tuple[str, int], Mapping[str, Any]], name: str, compression: str
) -> dict[str, list[tuple[str, Mapping[str, Any]]]]:
    """{split: [(final file name, result)]}, empty shards dropped, numbered from 0."""
    by_split: dict[str, list[Mapping[str, Any]]] = collections.defaultdict(list)
    for (split, _), result in sorted(chosen.items()):
        if result["records"] > 0:
            by_split[split].append(result)
    return {
        split: [
            (metadata.shard_name(name, split, i, len(results), compression), result) for i, result in enumerate(results)
        ]
        for split, results in sorted(by_split.items())
    }


def rename_idempotent(src: str, dst: str) -> None:
    """Renames src → dst; a retry that finds src gone and dst present is done already."""
    existing = {p for p in (src, dst) if FileSystems.exists(p)}
    move_files([(src, dst)], existing, "finalize.rename")


def merge_counts(dicts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: collections.Counter[str] = collections.Counter()
    for d in dicts:
        total.update(d)
    return dict(sorted(total.items()))


def reject_bucket(path: str) -> int:
    """Which rejects part a reject goes to (a hash of its path: the same on every attempt)."""
    return int.from_bytes(hashlib.sha256(path.encode("utf-8", "surrogatepass")).digest()[:4], "big") % REJECT_BUCKETS


class WriteRejectPartFn(beam.DoFn):
    """(bucket, [reject]) → one part file of rejects.jsonl in the staging folder; yields its path.

    The part's name depends on the bucket only and its lines are sorted, so a
    retried bundle rewrites the same bytes. Memory: one bucket's rejects
    (1/REJECT_BUCKETS of them).
    """

    def __init__(self, staging: str, folder: str = "") -> None:
        self._staging = staging
        self._folder = folder  # "objects": parts of object_rejects.jsonl

    def process(self, element: tuple[int, Iterable[Mapping[str, str]]]) -> Iterator[str]:
        bucket, rejects = element
        path = FileSystems.join(self._staging, REJECT_PARTS, *filter(None, [self._folder]), f"part-{bucket:05d}.jsonl")
        failpoints.hit("rejects.write")
        write_text(path, metadata.rejects_jsonl(rejects))
        yield path


def concat_files(parts: Sequence[str], dest: str) -> None:
    """Streams the parts, in order, into one file (never more than a buffer in memory)."""
    with FileSystems.create(dest, compression_type="uncompressed") as out:
        for part in parts:
            with FileSystems.open(part, compression_type="uncompressed") as fh:
                shutil.copyfileobj(fh, out, 1 << 20)


# Files and folders a run publishes besides the shards; anything of these an
# older run left and this run did not make is removed when publishing.
PUBLISHED_FILES = (
    metadata.LABELS_TXT,
    index.INDEX_JSONL,
    metadata.REJECTS_JSONL,
    metadata.DATASET_JSON,
    "dataset_info.json",
    "features.json",
    "image.class.label.labels.txt",  # TFDS class names (tfds_metadata.LABEL_NAMES)
    "image-class-label.labels.txt",  # the same, as runs before flat TFDS keys named it
    "image.object-class-label.labels.txt",  # a detection dataset's (tfds_metadata.OBJECT_LABEL_NAMES)
    objects.LABEL_MAP_PBTXT,  # a detection dataset's (annotations)
    objects.OBJECT_REJECTS_JSONL,
)
TFT_DIRS = ("transform_fn", "transformed_metadata", "metadata")
PUBLISHED_DIRS = (*TFT_DIRS, index.IDX_DIR)

OK, TOO_MANY_REJECTS, NOTHING_CONVERTED, EMPTY_LISTING = "ok", "too_many_rejects", "nothing_converted", "empty"
NO_OBJECT_KEPT = "no_object_kept"  # annotations given, every one rejected: a mismatch, not a dataset of negatives


def too_many_rejects(examples: int, rejects: int, max_reject_fraction: float, reject_allowance: int) -> bool:
    """More than ``max_reject_fraction`` of the listed inputs rejected, and either more than
    ``reject_allowance`` rejects or more rejects than converted images: two broken files in a folder of 30
    publish, 25 of 30 (a wrong input, a wrong format) do not."""
    if rejects / (examples + rejects) <= max_reject_fraction:
        return False
    return rejects > reject_allowance or rejects > examples


def outcome(
    examples: int,
    rejects: int,
    max_reject_fraction: float,
    reject_allowance: int,
    objs: Mapping[str, Any] | None = None,
) -> str:
    """ok, or why the run must not publish (the launcher maps it to an exit code). ``objs``: a detection
    dataset's ``objects`` block (annotations given and every object rejected is a mismatch, not negatives)."""
    if examples == 0:
        return NOTHING_CONVERTED if rejects else EMPTY_LISTING
    if too_many_rejects(examples, rejects, max_reject_fraction, reject_allowance):
        return TOO_MANY_REJECTS
    if objs and not objs["kept"] and objs["rejects"]["total"]:
        return NO_OBJECT_KEPT
    return OK


# --- publish -------------------------------------------------------------------


def _is_published_name(rel: str, owned: Iterable[str] = ()) -> bool:
    """A path (relative to the output) of a file a run of this tool publishes (not _SUCCESS, not scratch).

    Under ``transform_fn/``, ``transformed_metadata/`` and ``metadata/`` only the files a run
    recorded (``owned``: dataset.json's ``transform.files``, or this run's own)
    count: a user's file there is never taken for a stale one.
    """
    top = rel.split("/", 1)[0]
    if top == index.IDX_DIR:
        return metadata.is_idx_file(rel)  # anything else in idx/ is not ours: never stale
    if top in TFT_DIRS:
        return "/" in rel and rel in set(owned)
    if "/" in rel:
        return False
    return metadata.is_shard_file(rel) or rel in PUBLISHED_FILES


def _output_sizes(out_dir: str) -> dict[str, int]:
    """{relative path: size} in the output, scratch folders and the lease left out (GCS lists them)."""
    return {
        rel: size
        for rel, size in sizes_under(out_dir).items()
        if not rel.startswith(metadata.TMP_PREFIX) and rel != lease.LEASE
    }


def recorded_tft_files(info: Mapping[str, Any] | None) -> list[str]:
    """The TFT files a dataset.json records as its own (``transform.files``; none before they were recorded, and
    none when it is not a list of paths: a damaged file names no file as its run's)."""
    transform = (info or {}).get("transform")
    files = transform.get("files") if isinstance(transform, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return []
    return list(files)


def expected_files(info: Mapping[str, Any]) -> list[str]:
    """The files a staged dataset.json says the run made (relative paths): publish refuses a folder missing one."""
    shards = [s["file"] for split in info.get("splits", {}).values() for s in split.get("shards", [])]
    want = [*shards, metadata.REJECTS_JSONL]
    if info.get("idx_files"):
        want += [info["idx_files"].format(file=f) for f in shards]
    if info.get("labels") is not None:
        want.append(metadata.LABELS_TXT)
    if info.get("categories") is not None:
        want += [metadata.LABELS_TXT, objects.LABEL_MAP_PBTXT, objects.OBJECT_REJECTS_JSONL]
    if shards and info.get("sink", "planned") == "planned":
        want.append(index.INDEX_JSONL)
    want += list(((info.get("tfds") or {}).get("files")) or [])
    want += recorded_tft_files(info)
    return sorted(set(want))


class StagingIncomplete(OSError):
    """A staging folder lacks files its own dataset.json lists (e.g. a late attempt recreated it): never published."""


def _check_staging(staging: str, staged: Mapping[str, int], info: Mapping[str, Any]) -> None:
    missing = [rel for rel in expected_files(info) if rel not in staged]
    if missing:
        raise StagingIncomplete(
            f"not publishing {staging}: {len(missing)} files its dataset.json lists are not there ({missing[0]}); "
            "a late attempt of a step whose run published already, or a damaged staging folder"
        )


def _make_manifest(staging: str, out_dir: str, complete: bool) -> dict[str, Any]:
    staged = {
        rel: size
        for rel, size in sizes_under(staging).items()
        if not rel.startswith((PUBLISH_MANIFEST, REJECT_PARTS + "/", index.INDEX_PARTS + "/", *resume.SCRATCH_ONLY))
    }
    if metadata.DATASET_JSON not in staged:
        raise FileNotFoundError(f"{staging}: no {metadata.DATASET_JSON} to publish")
    info = read_json(FileSystems.join(staging, metadata.DATASET_JSON))
    _check_staging(staging, staged, info)
    old = _output_sizes(out_dir)
    old_info = _old_info(FileSystems.join(out_dir, metadata.DATASET_JSON)) if metadata.DATASET_JSON in old else None
    in_tft = {rel for rel in old if rel.split("/", 1)[0] in TFT_DIRS}
    owned = runs_tft_files(out_dir, old, _recorded_tft(old_info, in_tft) or [], staging)
    if old_info != {}:  # a damaged dataset.json tells no file apart: this run's then replace what is there
        theirs = sorted(rel for rel in staged if rel in in_tft and rel not in owned)
        if theirs:
            raise ForeignFileInTheWay(
                f"publish into {out_dir}: {theirs[0]} is no run's of this tool (neither the dataset.json there nor "
                f"a publish cut short lists it: a file of yours, or one a killed run left after a damaged "
                f"dataset.json or an older version) and this run has a file of that name; move it away (or delete "
                f"the folder if it is no one's) and run the same command again (nothing was changed; this run's "
                f"files wait in {staging})"
            )
    stale = sorted(rel for rel in old if _is_published_name(rel, owned) and rel not in staged)
    return {
        "files": dict(sorted(staged.items())),
        "stale": stale,
        "owned": owned,
        "complete": complete,
        "run_id": info.get("run_id"),
    }


def _recorded_tft(info: Mapping[str, Any] | None, in_tft: Iterable[str]) -> list[str] | None:
    """The TFT files (of ``in_tft``, the output's) an output's dataset.json records as its run's; None when it
    cannot say: damaged (``{}``, see _old_info) or a "transform" of another shape. No dataset.json: none."""
    if info is None:
        return []
    if not info:
        return None
    transform = info.get("transform")
    if transform is None:  # a run without a transform
        return []
    if isinstance(transform, dict) and "files" not in transform:
        return sorted(in_tft)  # a dataset.json of a version that did not list them: its TFT folders are its run's
    recorded = recorded_tft_files(info)
    return recorded if recorded or (isinstance(transform, dict) and transform["files"] == []) else None


def untold_tft_files(out_dir: str) -> list[str]:
    """Files under the TFT folders of ``out_dir`` that neither its dataset.json (damaged, or naming no file)
    nor a publish cut short tells as a run's: an earlier run's, to be removed, or a user's, to be kept.

    Publish would leave them beside the new dataset (an old graph under a new ``_SUCCESS``): the launcher
    refuses such an output at the start instead. [] when the dataset.json tells, or there is none.
    """
    info_path = FileSystems.join(out_dir, metadata.DATASET_JSON)
    if not FileSystems.exists(info_path):
        return []
    info = _published_info(info_path) or {}
    sizes = {rel: size for rel, size in _output_sizes(out_dir).items() if rel.split("/", 1)[0] in TFT_DIRS}
    if not sizes or _recorded_tft(info, sizes) is not None:
        return []
    return sorted(set(sizes) - set(runs_tft_files(out_dir, sizes, [])))


class ForeignFileInTheWay(ValueError):
    """A file of this run would replace one in the output that no run of this tool wrote: nothing is published."""


def runs_tft_files(out_dir: str, sizes: Mapping[str, int], recorded: Iterable[str], staging: str = "") -> list[str]:
    """The files under the TFT folders of ``out_dir`` (``sizes``: its files) that are a run's: those its
    dataset.json records (``recorded``), and those another run's publish plan lists, while they have the size
    that run moved there (a user's file of the same name, a schema.pbtxt of their own, is not taken for it)."""
    planned = _tft_files_of_other_publishes(out_dir, staging)
    return sorted({rel for rel in recorded if rel in sizes} | {rel for rel, size in planned if sizes.get(rel) == size})


def _tft_files_of_other_publishes(out_dir: str, staging: str) -> list[tuple[str, int]]:
    """The TFT files (path, size) other runs' publish manifests list (runs of this output cut short inside their
    publish).

    Such a run's TFT files may be in the output while its dataset.json, moved last, never got there: the
    dataset.json there records none of them, yet they are a run's, not a user's, and must not stay beside this
    run's dataset (a reader would apply another run's graph).
    """
    files: list[tuple[str, int]] = []
    for folder in resume.scratch_folders(out_dir):
        if folder.rstrip("/") == staging.rstrip("/"):
            continue
        try:
            manifest = _read_manifest(folder)
        except ValueError:  # not a manifest of ours: it names nothing
            continue
        listed = (manifest or {}).get("files")
        if isinstance(listed, dict):
            files += [(rel, size) for rel, size in listed.items() if rel.split("/", 1)[0] in TFT_DIRS]
    return files


def _old_info(path: str) -> dict[str, Any]:
    """The dataset.json already in the output, or {} when it is damaged: then no TFT file there is known to be
    the old run's, so none is deleted (files of this run's own names are still replaced)."""
    try:
        return read_json_object(path)
    except ValueError as e:
        _LOG.warning("the dataset.json already in the output is damaged (%s): replacing it", e)
        return {}


def _published_info(info_path: str) -> dict[str, Any] | None:
    """The output's dataset.json, or None when it is damaged (no run's: no run id matches it)."""
    try:
        return read_json_object(info_path)
    except ValueError:
        return None


def _read_manifest(staging: str) -> dict[str, Any] | None:
    """The publish plan an earlier attempt wrote, or None if there is none.

    Only absence means "no plan yet": the manifest is written whole or not at
    all, so any other failure to read it (a transient storage error) must fail
    the step. Planning again from a half-moved staging folder would call this
    run's already-published files stale and delete them.
    """
    path = FileSystems.join(staging, PUBLISH_MANIFEST)
    if not FileSystems.exists(path):
        return None
    manifest = read_json(path)
    if not isinstance(manifest, dict) or "files" not in manifest:
        raise ValueError(f"{path}: not a publish manifest")
    return manifest


def _write_manifest(staging: str, manifest: Mapping[str, Any]) -> None:
    """Written whole or not at all: a GCS object appears complete; locally a rename makes it so."""
    failpoints.hit("publish.manifest")
    path = FileSystems.join(staging, PUBLISH_MANIFEST)
    storage.write_atomic(path, json.dumps(manifest, indent=1) + "\n")


class PublishConflict(RuntimeError):
    """Another run published into the same output while this one was publishing."""


def _check_still_ours(out_dir: str, run_id: str | None) -> None:
    """Raises PublishConflict unless the output's dataset.json is still this run's.

    Two runs publishing into one output at once can leave files of both; the
    last check before ``_SUCCESS`` is that the dataset.json there is the one
    this run moved. Then no ``_SUCCESS`` marks a mix complete (the other run's
    own check fails the same way, or it finished first and this one is the
    stale one). A narrow guard, not a lock: one run per output at a time.
    """
    if not run_id:  # a manifest from before run ids were recorded
        return
    there = (_published_info(FileSystems.join(out_dir, metadata.DATASET_JSON)) or {}).get("run_id")
    if there != run_id:
        raise PublishConflict(
            f"another run ({there}) published into {out_dir} while run {run_id} was publishing; not writing "
            f"{metadata.SUCCESS}: the folder may mix both runs' files. Run one conversion per output at a time "
            "and run again."
        )


def already_published(out_dir: str, run_id: str | None) -> dict[str, Any] | None:
    """dataset.json of the output when run ``run_id`` is published there (its run id, and ``_SUCCESS``), else None."""
    if not run_id or not FileSystems.exists(FileSystems.join(out_dir, metadata.SUCCESS)):
        return None
    info_path = FileSystems.join(out_dir, metadata.DATASET_JSON)
    if not FileSystems.exists(info_path):
        return None
    info = _published_info(info_path)
    return info if info is not None and info.get("run_id") == run_id else None


def _run_id_of(staging: str) -> str:
    return staging.rstrip("/").rsplit("/", 1)[-1][len(metadata.TMP_PREFIX) :]


def publish(
    staging: str,
    out_dir: str,
    complete: bool = True,
    *,
    leased: bool = False,
    holder: str | None = None,
    release: bool = True,
) -> None:
    """Moves a run from its staging folder into ``out_dir``; ``_SUCCESS`` last. Safe to run again.

    Until this starts, an older dataset in ``out_dir`` is untouched; its
    ``_SUCCESS`` goes right before the first change. A publish that dies at
    any point leaves no ``_SUCCESS``, and running it again (same staging
    folder) finishes it from the manifest. ``complete=False`` (a run over its
    reject budget) moves the files but writes no ``_SUCCESS``; a resumed
    publish keeps what the manifest says.

    Only the holder of the output lease changes the output (lease.py): it is
    checked before every change. ``leased``: the launcher took it for this
    run (a missing one means it was lost); else a free one is taken here.
    ``holder``: the run id holding it, when not the staged run's own (a run
    finishing a dead run's publish). ``release``: give it up at the end.
    A step whose run is published already (a late attempt) does nothing, and
    a staging folder missing a file its dataset.json lists is refused.
    """
    manifest = _read_manifest(staging)
    if manifest is None:
        staged_info = FileSystems.join(staging, metadata.DATASET_JSON)
        run_id = read_json(staged_info).get("run_id") if FileSystems.exists(staged_info) else None
        if already_published(out_dir, run_id or _run_id_of(staging)) is not None:
            cleanup_staging(staging, out_dir)  # what a late attempt left; the published run stays
            return
    else:
        run_id = manifest.get("run_id")
        if (info := already_published(out_dir, run_id)) is not None:  # only its clean-up was cut short
            cleanup_staging(staging, out_dir, taken_from(out_dir, info))
            return
    guard = lease.Guard(out_dir, holder or run_id or _run_id_of(staging), must_hold=leased)
    guard.start()
    try:
        _publish_under(guard, staging, out_dir, manifest, complete)
    except lease.LeaseLost:
        if guard.changed_late:  # a change may have landed in the new holder's dataset
            delete_quietly([FileSystems.join(out_dir, metadata.SUCCESS)])
        raise
    if release:
        guard.release()


def _publish_under(
    guard: lease.Guard, staging: str, out_dir: str, manifest: dict[str, Any] | None, complete: bool
) -> None:
    if manifest is None:
        manifest = _make_manifest(staging, out_dir, complete)
        _write_manifest(staging, manifest)
    files: dict[str, int] = manifest["files"]
    owned = set(files) | set(manifest.get("owned", ()))
    src = staging.rstrip("/") + "/"
    dst = out_dir.rstrip("/") + "/"

    in_staging = {src + rel for rel in sizes_under(staging)}
    output_now = _output_sizes(out_dir)
    in_output = {dst + rel for rel in output_now}
    existing = in_staging | in_output
    success = dst + metadata.SUCCESS
    # Stale: the plan's, and whatever of this tool's kinds the output holds now that this run does not publish.
    stale = sorted(set(manifest["stale"]) | {r for r in output_now if _is_published_name(r, owned) and r not in files})
    pending_moves = [rel for rel in files if src + rel in in_staging]
    pending_stale = [rel for rel in stale if dst + rel in in_output]
    if (pending_moves or pending_stale) and success in in_output:
        delete_files([success], "publish.delete", guard)

    # The run's files, dataset.json last; then the older run's files go. Shards and .idx files stay in the
    # staging folder too (linked, or copied on GCS) until _SUCCESS: a run killed in here, run again, takes them.
    order = sorted(files, key=lambda rel: (rel == metadata.DATASET_JSON, rel))
    body = [rel for rel in order if rel != metadata.DATASET_JSON]
    kept = [src + rel for rel in body if metadata.is_shard_file(rel) or metadata.is_idx_file(rel)]
    move_files([(src + rel, dst + rel) for rel in body], existing, "publish.move", guard, kept)
    delete_files([dst + rel for rel in pending_stale], "publish.delete", guard)
    for name in PUBLISHED_DIRS:
        _remove_empty_dirs(dst + name)
    move_files([(src + metadata.DATASET_JSON, dst + metadata.DATASET_JSON)], existing, "publish.move", guard)

    # Every file of this tool's kinds in the output is this run's, with its size, before _SUCCESS.
    now = _output_sizes(out_dir)
    missing = [rel for rel, size in files.items() if now.get(rel) != size]
    extra = [rel for rel in now if _is_published_name(rel, owned) and rel not in files]
    if missing or extra:
        raise OSError(
            f"publish into {out_dir} did not check out: {len(missing)} files missing or of another size "
            f"({(missing or extra)[0]}), {len(extra)} files of another run still there"
        )
    if manifest.get("complete", True):
        failpoints.hit("publish.success")
        _check_still_ours(out_dir, manifest.get("run_id"))
        guard.before()
        write_text(success, "")
        guard.after()
    cleanup_staging(staging, out_dir, taken_from(out_dir, read_json(FileSystems.join(out_dir, metadata.DATASET_JSON))))


def taken_from(out_dir: str, info: Mapping[str, Any]) -> list[str]:
    """The scratch folders (in ``out_dir``) of the earlier runs whose finished shards this run took (resume.py)."""
    runs = (info.get("resumed") or {}).get("from_runs") or []
    return [FileSystems.join(out_dir, metadata.TMP_PREFIX + run) for run in runs]


def cleanup_staging(staging: str, out_dir: str, taken: Sequence[str] = ()) -> None:
    """Deletes this run's staging folder (the manifest last) and scratch folders of dead runs.

    Dead: started days ago (STALE_TMP_AGE_S), or, among ``taken`` (the runs
    this one took finished shards from), local runs whose lock is free
    (resume.is_dead_local_run, asked right before each deletion). A dead run
    this one took nothing from keeps its folder until it is old.
    """
    manifest = FileSystems.join(staging, PUBLISH_MANIFEST)
    delete_files([p for p in _files_under(staging) if p != manifest])
    delete_files([manifest])
    storage.remove_folder(staging)
    for stale_tmp in stale_tmp_dirs(out_dir, keep=staging):  # left by killed runs, days ago
        delete_tree(stale_tmp)
    for folder in taken:
        if folder.rstrip("/") != staging.rstrip("/") and resume.is_dead_local_run(folder):
            delete_tree(folder)


def published_run(out_dir: str, staging: str, run_id: str, leased: bool = False) -> dict[str, Any] | None:
    """dataset.json of run ``run_id`` if a step already published it (a retried step), else None.

    A publish that stopped half-way (its manifest is in the staging folder)
    is finished first. A staging folder without a manifest was never
    published from, so None sends the caller through its step again.
    """
    if not run_id:
        return None
    info_path = FileSystems.join(out_dir, metadata.DATASET_JSON)
    if _read_manifest(staging) is not None:
        publish(staging, out_dir, leased=leased)
        return read_json(info_path)
    if not FileSystems.exists(info_path):
        return None
    info = _published_info(info_path)
    if info is None or info.get("run_id") != run_id:
        return None
    cleanup_staging(staging, out_dir, taken_from(out_dir, info))  # the manifest goes last: redone here if cut short
    return info


def incremental_summary(
    previous: str,
    changes: Mapping[str, int],
    layout: Mapping[str, list[tuple[str, Mapping[str, Any]]]],
    results: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """What an ``--incremental-from`` run took from the previous dataset, for dataset.json and ``inspect``.

    Listed files: ``added`` (neither in the previous index nor among its
    rejects), ``changed`` (size or mtime differ), ``unchanged``; ``dropped``:
    previous records whose file is no longer listed. Records: ``reused``
    (copied, not read or decoded) and ``converted`` (the rest; an unchanged
    file whose label id or extra columns differ is converted again).
    ``rejects_kept``: unchanged files the previous run rejected for their
    bytes, rejected again unread (``results``: every shard's, empty ones too).
    ``reconverted``: unchanged files whose previous record was gone or failed
    its checks (``index.read_previous``), converted afresh.
    ``unreadable_previous_lines`` (only when there are any): lines of the
    previous index.jsonl or rejects.jsonl that were damaged or not its own;
    their files were read and converted afresh.
    """
    records = sum(r["records"] for files in layout.values() for _, r in files)
    reused = sum(r.get("reused", 0) for files in layout.values() for _, r in files)
    kept = sum(r.get("rejects_kept", 0) for r in results)
    reconverted = sum(r.get("reconverted", 0) for r in results)
    counts = {k: int(changes.get(k, 0)) for k in ("added", "changed", "unchanged", "dropped")}
    summary = {
        "from": previous,
        "reused": reused,
        "converted": records - reused,
        "reconverted": reconverted,
        "rejects_kept": kept,
        **counts,
    }
    unreadable = int(changes.get("unreadable_previous_lines", 0))
    if unreadable:  # only then: an intact previous dataset gives the same dataset.json as before
        summary["unreadable_previous_lines"] = unreadable
    return summary


def resumed_summary(layout: Mapping[str, list[tuple[str, Mapping[str, Any]]]], staging: str) -> dict[str, Any]:
    """What this run took from earlier runs' finished shards (resume.py): shards, records, run ids; {} if none.

    A retried writer that took its own run's finished shard is not counted: a
    retry must not change dataset.json.
    """
    own = staging.rstrip("/")
    taken = [
        r
        for files in layout.values()
        for _, r in files
        if r.get("resumed_from") and str(r["resumed_from"]).rstrip("/") != own
    ]
    if not taken:
        return {}
    runs = {str(r["resumed_from"]).rstrip("/").rsplit("/", 1)[-1] for r in taken}
    return {
        "shards": len(taken),
        "records": sum(r["records"] for r in taken),
        "from_runs": sorted(name[len(metadata.TMP_PREFIX) :] for name in runs),
    }


def write_dataset_index(layout: Mapping[str, list[tuple[str, Mapping[str, Any]]]], staging: str) -> None:
    """index.jsonl from the chosen shards' index parts, in published shard order.

    Only the planned sink's writers make parts; without them (``--sink
    write_to_tfrecord``) there is no index. A retried finalize rewrites the
    same file: the parts stay until the staging folder is removed.
    """
    parts = [(r["index_path"], final) for files in layout.values() for final, r in files if r.get("index_path")]
    if not parts:
        return
    failpoints.hit("finalize.write")
    index.write_index(parts, FileSystems.join(staging, index.INDEX_JSONL))


def detection_summary(
    categories: Sequence[tuple[int, str]], object_counts: Sequence[tuple[str, int]]
) -> dict[str, Any]:
    """dataset.json's part for a detection dataset: categories, the object keys, object counts and rejects."""
    counts = objects.object_counts(object_counts)
    image_counters = (coco.OBJECTS_KEPT, coco.IMAGES_WITHOUT_OBJECTS, coco.IMAGES_ALL_REJECTED, objects.POLYGON_DROPPED)
    reasons = [(k, n) for k, n in counts.items() if k not in image_counters]
    by_reason = dict(sorted(reasons, key=lambda kv: (-kv[1], kv[0])))
    return {
        "categories": [{"id": cid, "name": name} for cid, name in categories],
        "objects": {
            "kept": counts.get(coco.OBJECTS_KEPT, 0),
            "rejects": {"total": sum(by_reason.values()), "by_reason": by_reason},
            coco.IMAGES_WITHOUT_OBJECTS: counts.get(coco.IMAGES_WITHOUT_OBJECTS, 0),
            coco.IMAGES_ALL_REJECTED: counts.get(coco.IMAGES_ALL_REJECTED, 0),
            "polygons_dropped": counts.get(objects.POLYGON_DROPPED, 0),
        },
    }


def write_detection_files(staging: str, categories: Sequence[tuple[int, str]], object_parts: Sequence[str]) -> None:
    """labels.txt (line k = category id k), label_map.pbtxt and object_rejects.jsonl into the staging folder."""
    failpoints.hit("finalize.write")
    lines = objects.labels_lines(categories)
    write_text(FileSystems.join(staging, metadata.LABELS_TXT), "".join(f"{name}\n" for name in lines))
    failpoints.hit("finalize.write")
    write_text(FileSystems.join(staging, objects.LABEL_MAP_PBTXT), objects.label_map_pbtxt(categories))
    failpoints.hit("finalize.write")
    concat_files(sorted(set(object_parts)), FileSystems.join(staging, objects.OBJECT_REJECTS_JSONL))


class FinalizeFn(beam.DoFn):
    """Runs once: names the shards, writes the metadata into the staging folder, publishes.

    Yields the dataset.json dict. With post-steps (TFT analysis, TFDS
    metadata) those publish after them; a run that may not publish (too many
    rejects, nothing converted) leaves an older dataset untouched.

    Side inputs stay small whatever the input size: one result per shard,
    one rejects part path per non-empty hash bucket, counts per reason.
    """

    def __init__(self, cfg: ConvertConfig, layout: Layout) -> None:
        self._cfg = cfg
        self._layout = layout

    def process(
        self,
        _: Any,
        results: Sequence[Mapping[str, Any]],
        reject_parts: Sequence[str],
        reject_counts: Sequence[tuple[str, int]],
        skipped_counts: Sequence[tuple[str, int]],
        labels: Sequence[str],
        extra_types: Mapping[str, str],
        split_label_counts: Mapping[str, Mapping[str, int]],
        changes: Mapping[str, int] | None = None,
        labelled: bool | None = None,  # whether the run is labelled, when the pipeline decided it (JSONL rows)
        object_parts: Sequence[str] = (),  # a detection dataset's object rejects parts
        object_counts: Sequence[tuple[str, int]] = (),  # and its object counts (annotations.coco.COUNTS)
    ) -> Iterator[dict[str, Any]]:
        cfg, out_dir, staging = self._cfg, self._cfg.output, self._layout.tmp_dir
        leased = self._layout.leased
        done = published_run(out_dir, staging, self._layout.run_id, leased)
        if done is not None:
            yield done
            return
        chosen = choose_results(results)
        layout = final_layout(chosen, cfg.name, cfg.compression)
        labelled = self._layout.label_source != "none" if labelled is None else labelled

        splits: dict[str, Any] = {}
        for split, files in layout.items():
            label_counts = split_label_counts.get(split) or merge_counts(r.get("labels", {}) for _, r in files)
            splits[split] = {
                "examples": sum(r["records"] for _, r in files),
                "bytes": sum(r["bytes"] for _, r in files),
                "num_shards": len(files),
                "shards": [{"file": f, "records": r["records"], "bytes": r["bytes"]} for f, r in files],
                "labels": dict(label_counts) if labelled else None,
            }
        rejects_by_reason = dict(sorted(reject_counts, key=lambda kv: (-kv[1], kv[0])))
        info = metadata.dataset_json(
            name=cfg.name,
            splits=splits,
            labels=list(labels) if labelled else None,
            extra_types=extra_types,
            compression=cfg.compression,
            seed=cfg.seed,
            config=cfg.as_dict(),
            rejects=rejects_by_reason,
            skipped=dict(sorted(skipped_counts, key=lambda kv: (-kv[1], kv[0]))),
            sink=cfg.sink,
            multi_label=cfg.label_separator is not None,
        )
        categories = self._layout.categories
        if self._layout.object_names:  # a names-only source: the run's label list names the ids
            # a --labels-file (the fixed list) is the prior list of its own gaps, as an earlier run's labels.txt
            prior = self._layout.labels or self._layout.prior_labels or ()
            categories = objects.categories_from_labels(labels, prior)
        if categories is not None:
            # the planned sink's writers counted the objects of the records they wrote, per shard
            written = [kv for files in layout.values() for _, r in files for kv in r.get("objects", {}).items()]
            info.update(detection_summary(categories, [*object_counts, *written]))
            info["features"] = dict(sorted({**info["features"], **objects.feature_spec()}.items()))
        if self._layout.masks:
            info["features"] = dict(sorted({**info["features"], **masks.feature_spec()}.items()))
        info["converted"] = merge_counts(r.get("converted", {}) for files in layout.values() for _, r in files)
        empty = sorted({split for split, _ in chosen} - set(layout))
        if empty:  # listed files, every one rejected: no shard, so no split, and a reader asking for it fails
            info["empty_splits"] = empty
        if any(r.get("idx_path") for files in layout.values() for _, r in files):
            info["idx_files"] = f"{index.IDX_DIR}/{{file}}.idx"  # per shard: offset and frame size of each record
        if self._layout.previous:
            info["incremental"] = incremental_summary(self._layout.previous, changes or {}, layout, chosen.values())
        resumed = resumed_summary(layout, staging)
        if resumed:
            info["resumed"] = resumed
        total_rejects = sum(rejects_by_reason.values())
        info["status"] = outcome(
            info["examples"], total_rejects, cfg.max_reject_fraction, cfg.reject_allowance, info.get("objects")
        )
        info["run_id"] = self._layout.run_id
        info_text = json.dumps(info, indent=2, ensure_ascii=False) + "\n"

        # Temp shards get their final names inside the staging folder (one
        # listing, batched renames); what a retried or empty writer left there
        # goes. The rejects parts stay until the staging folder is removed.
        prefix = staging.rstrip("/") + "/"
        in_staging = set(_files_under(staging))
        pairs = [
            (result["tmp_path"], FileSystems.join(staging, final))
            for files in layout.values()
            for final, result in files
        ]
        pairs += [
            (result["idx_path"], FileSystems.join(staging, index.IDX_DIR, final + ".idx"))
            for files in layout.values()
            for final, result in files
            if result.get("idx_path")
        ]
        # Where each shard goes, for a later run that resumes from this one if it dies before publishing.
        # Only while there is a shard to rename: a late attempt whose run published (and removed its staging
        # folder) meanwhile must not recreate that folder; an earlier attempt wrote it before renaming.
        if any(src in in_staging for src, _ in pairs):
            resume.write_atomic(
                FileSystems.join(staging, resume.DONE, resume.RENAMED),
                "".join(json.dumps({"from": src, "to": dst}) + "\n" for src, dst in pairs),
            )
        move_files(pairs, in_staging, "finalize.rename")
        keep = {dst for _, dst in pairs}
        parts = (REJECT_PARTS + "/", index.INDEX_PARTS + "/", *resume.SCRATCH_ONLY)
        delete_files([p for p in _files_under(staging) if p not in keep and not p[len(prefix) :].startswith(parts)])
        write_dataset_index(layout, staging)
        failpoints.hit("finalize.write")
        concat_files(sorted(set(reject_parts)), FileSystems.join(staging, metadata.REJECTS_JSONL))
        if labelled:
            failpoints.hit("finalize.write")
            write_text(FileSystems.join(staging, metadata.LABELS_TXT), "".join(f"{label}\n" for label in labels))
        if categories is not None:
            write_detection_files(staging, categories, object_parts)
        failpoints.hit("finalize.write")
        write_text(FileSystems.join(staging, metadata.DATASET_JSON), info_text)

        if info["status"] != OK:
            if not FileSystems.exists(FileSystems.join(out_dir, metadata.SUCCESS)):
                # Nothing to protect: the shards, rejects.jsonl and dataset.json
                # (which names the status) go where the user looks, but no
                # _SUCCESS marks them complete. An existing dataset stays
                # untouched and this run stays in its staging folder.
                publish(staging, out_dir, complete=False, leased=leased)
            elif cfg.detach:  # nothing to publish, and the launcher that took the lease is gone: give it up here
                lease.release(out_dir, self._layout.run_id)
        elif not cfg.needs_post_steps:
            publish(staging, out_dir, leased=leased)
        yield info
