"""Publish: make a run visible, correctly even when a step is run twice; the one owner of the protocol the
output's guarantee rests on.

``publish`` moves a run's staging folder into the output. It first writes a
**manifest** into the staging folder (the run's files with their sizes, and
the files of an older run to remove), then works only from it: a retry finds
the manifest and finishes the same plan. The old ``_SUCCESS`` goes right
before the first change, the run's files move in, the older run's files go,
``dataset.json`` moves last, every manifest entry is checked present with its
size, and only then is ``_SUCCESS`` written. Shards and ``.idx`` files are
linked (copied on GCS), not moved: they stay in the staging folder until it
is removed, so a run killed inside its publish and run again takes them
(resume.py).

Who calls it, once for each way a run can end:

- finalize (``run.finalize.FinalizeFn``), when the run has no post-steps: a
  complete run, or one that may not publish writing into an empty folder
  (without ``_SUCCESS``);
- the post-steps (``run.poststeps``), after TFT analysis and TFDS metadata,
  in the launcher or as the job's last step;
- ``published_run``: a retried step whose run is half-published finishes it;
- ``finish_cut_short``: a self-incremental run finishes the publish of the
  run before it, killed while publishing.

A run that may not publish (nothing converted, more rejects than
``--max-reject-fraction``) leaves an existing dataset untouched.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apache_beam.io.filesystems import FileSystems

from .. import failpoints, index, lease, metadata, resume, storage
from ..annotations import objects
from ..errors import UsageError, last_line
from ..storage import (
    delete_quietly,
    delete_tree,
    files_under,
    read_json,
    read_json_object,
    remove_empty_dirs,
    sizes_under,
    write_text,
)
from ..vocab.dataset_info import DatasetInfo
from .common import note
from .files import delete_files, move_files, stale_tmp_dirs

_LOG = logging.getLogger(__name__)


def finish_cut_short(output: str, run_id: str) -> None:
    """A self-incremental run (--incremental-from its own --output) whose last run was killed while publishing:
    that run's publish is finished first (its staging folder holds the plan), under this run's lease.

    Without it the output never has ``_SUCCESS`` again and every re-run of the same command is refused.
    """

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


# Inside the staging folder, never published: the publish plan, and the
# rejects as part files (one per hash bucket of the path) until finalize
# streams them into rejects.jsonl.
PUBLISH_MANIFEST = "_publish.json"
REJECT_PARTS = metadata.REJECT_PARTS


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
    metadata.NEAR_DUPLICATES_JSONL,
    metadata.REPORT_HTML,  # a run without --report removes an earlier run's page: it would describe the old data
)


TFT_DIRS = ("transform_fn", "transformed_metadata", "metadata")


PUBLISHED_DIRS = (*TFT_DIRS, index.IDX_DIR)


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


def recorded_tft_files(transform: object) -> list[str]:
    """The TFT files a dataset.json's ``transform`` block records as its run's (``files``; none before they were
    recorded, and none when it is not a list of paths: a damaged file names no file as its run's)."""
    files = transform.get("files") if isinstance(transform, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return []
    return list(files)


def expected_files(info: DatasetInfo) -> list[str]:
    """The files a staged dataset.json says the run made (relative paths): publish refuses a folder missing one."""
    shards = info.shard_files()
    want = [*shards, metadata.REJECTS_JSONL]
    if info.idx_files:
        want += [info.idx_files.format(file=f) for f in shards]
    if info.labels is not None:
        want.append(metadata.LABELS_TXT)
    if info.categories is not None:
        want += [metadata.LABELS_TXT, objects.LABEL_MAP_PBTXT, objects.OBJECT_REJECTS_JSONL]
    if shards and info.sink == "planned":
        want.append(index.INDEX_JSONL)
    if info.near_duplicates is not None:
        want.append(metadata.NEAR_DUPLICATES_JSONL)
    want += list((info.tfds.files if info.tfds is not None else None) or [])
    want += recorded_tft_files(info.transform)
    return sorted(set(want))


class StagingIncomplete(OSError):
    """A staging folder lacks files its own dataset.json lists (e.g. a late attempt recreated it): never published."""


def _check_staging(staging: str, staged: Mapping[str, int], info: DatasetInfo) -> None:
    missing = [rel for rel in expected_files(info) if rel not in staged]
    if missing:
        raise StagingIncomplete(
            f"not publishing {staging}: {len(missing)} files its dataset.json lists are not there ({missing[0]}); "
            "a late attempt of a step whose run published already, or a damaged staging folder"
        )


@dataclass(frozen=True)
class PublishPlan:
    """The publish manifest (``_publish.json`` in the staging folder): the run's files with their sizes, the
    output's files it replaces (``stale``), the TFT files it counts as a run's (``owned``), whether it ends with
    ``_SUCCESS``, and the run's id. A plan written by an earlier version reads with the keys it lacks defaulted."""

    files: dict[str, int]
    stale: tuple[str, ...] = ()
    owned: tuple[str, ...] = ()
    complete: bool = True
    run_id: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "files": dict(self.files),
            "stale": list(self.stale),
            "owned": list(self.owned),
            "complete": self.complete,
            "run_id": self.run_id,
        }

    @classmethod
    def from_json(cls, data: object, path: str) -> PublishPlan:
        """The plan; ValueError naming ``path`` for JSON of another shape (no plan of this tool's)."""
        if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
            raise ValueError(f"{path}: not a publish manifest")
        return cls(
            files=data["files"],
            stale=tuple(data.get("stale") or ()),
            owned=tuple(data.get("owned") or ()),
            complete=bool(data.get("complete", True)),
            run_id=data.get("run_id"),
        )


def _make_manifest(staging: str, out_dir: str, complete: bool) -> PublishPlan:
    staged = {
        rel: size
        for rel, size in sizes_under(staging).items()
        if not rel.startswith((PUBLISH_MANIFEST, REJECT_PARTS + "/", index.INDEX_PARTS + "/", *resume.SCRATCH_ONLY))
    }
    if metadata.DATASET_JSON not in staged:
        raise FileNotFoundError(f"{staging}: no {metadata.DATASET_JSON} to publish")
    info = _staged_info(staging)
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
    return PublishPlan(dict(sorted(staged.items())), tuple(stale), tuple(owned), complete, info.run_id)


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
    recorded = recorded_tft_files(transform)
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
    info = _raw_info(info_path) or {}
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
        if manifest is not None:
            files += [(rel, size) for rel, size in manifest.files.items() if rel.split("/", 1)[0] in TFT_DIRS]
    return files


def _old_info(path: str) -> dict[str, Any]:
    """The dataset.json already in the output, or {} when it is damaged: then no TFT file there is known to be
    the old run's, so none is deleted (files of this run's own names are still replaced)."""
    try:
        return read_json_object(path)
    except ValueError as e:
        _LOG.warning("the dataset.json already in the output is damaged (%s): replacing it", e)
        return {}


def _raw_info(info_path: str) -> dict[str, Any] | None:
    """The output's dataset.json as JSON, or None when it is not a JSON object (damaged).

    Kept as JSON (not a DatasetInfo): the file there may be any version's or a hand edit's, and is read only
    for the TFT files its ``transform`` block records, whatever the shape of the rest.
    """
    try:
        return read_json_object(info_path)
    except ValueError:
        return None


def _published_info(info_path: str) -> DatasetInfo | None:
    """The output's dataset.json, or None when it is damaged (no run's: no run id matches it)."""
    try:
        return DatasetInfo.from_json(read_json_object(info_path))
    except ValueError:
        return None


def _staged_info(staging: str) -> DatasetInfo:
    """The dataset.json a run wrote into its staging folder."""
    return DatasetInfo.from_json(read_json(FileSystems.join(staging, metadata.DATASET_JSON)))


def _read_manifest(staging: str) -> PublishPlan | None:
    """The publish plan an earlier attempt wrote, or None if there is none.

    Only absence means "no plan yet": the manifest is written whole or not at
    all, so any other failure to read it (a transient storage error) must fail
    the step. Planning again from a half-moved staging folder would call this
    run's already-published files stale and delete them.
    """
    path = FileSystems.join(staging, PUBLISH_MANIFEST)
    if not FileSystems.exists(path):
        return None
    return PublishPlan.from_json(read_json(path), path)


def _write_manifest(staging: str, manifest: PublishPlan) -> None:
    """Written whole or not at all: a GCS object appears complete; locally a rename makes it so."""
    failpoints.hit("publish.manifest")
    path = FileSystems.join(staging, PUBLISH_MANIFEST)
    storage.write_atomic(path, json.dumps(manifest.to_json(), indent=1) + "\n")


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
    published = _published_info(FileSystems.join(out_dir, metadata.DATASET_JSON))
    there = published.run_id if published is not None else None
    if there != run_id:
        raise PublishConflict(
            f"another run ({there}) published into {out_dir} while run {run_id} was publishing; not writing "
            f"{metadata.SUCCESS}: the folder may mix both runs' files. Run one conversion per output at a time "
            "and run again."
        )


def already_published(out_dir: str, run_id: str | None) -> DatasetInfo | None:
    """dataset.json of the output when run ``run_id`` is published there (its run id, and ``_SUCCESS``), else None."""
    if not run_id or not FileSystems.exists(FileSystems.join(out_dir, metadata.SUCCESS)):
        return None
    info_path = FileSystems.join(out_dir, metadata.DATASET_JSON)
    if not FileSystems.exists(info_path):
        return None
    info = _published_info(info_path)
    return info if info is not None and info.run_id == run_id else None


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
        run_id = _staged_info(staging).run_id if FileSystems.exists(staged_info) else None
        if already_published(out_dir, run_id or _run_id_of(staging)) is not None:
            cleanup_staging(staging, out_dir)  # what a late attempt left; the published run stays
            return
    else:
        run_id = manifest.run_id
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
    guard: lease.Guard, staging: str, out_dir: str, manifest: PublishPlan | None, complete: bool
) -> None:
    if manifest is None:
        manifest = _make_manifest(staging, out_dir, complete)
        _write_manifest(staging, manifest)
    files = manifest.files
    owned = set(files) | set(manifest.owned)
    src = staging.rstrip("/") + "/"
    dst = out_dir.rstrip("/") + "/"

    in_staging = {src + rel for rel in sizes_under(staging)}
    output_now = _output_sizes(out_dir)
    in_output = {dst + rel for rel in output_now}
    existing = in_staging | in_output
    success = dst + metadata.SUCCESS
    # Stale: the plan's, and whatever of this tool's kinds the output holds now that this run does not publish.
    stale = sorted(set(manifest.stale) | {r for r in output_now if _is_published_name(r, owned) and r not in files})
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
        remove_empty_dirs(dst + name)
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
    if manifest.complete:
        failpoints.hit("publish.success")
        _check_still_ours(out_dir, manifest.run_id)
        guard.before()
        write_text(success, "")
        guard.after()
    published = DatasetInfo.from_json(read_json(FileSystems.join(out_dir, metadata.DATASET_JSON)))
    cleanup_staging(staging, out_dir, taken_from(out_dir, published))


def taken_from(out_dir: str, info: DatasetInfo) -> list[str]:
    """The scratch folders (in ``out_dir``) of the earlier runs whose finished shards this run took (resume.py)."""
    runs = info.resumed.from_runs if info.resumed is not None else ()
    return [FileSystems.join(out_dir, metadata.TMP_PREFIX + run) for run in runs]


def cleanup_staging(staging: str, out_dir: str, taken: Sequence[str] = ()) -> None:
    """Deletes this run's staging folder (the manifest last) and scratch folders of dead runs.

    Dead: started days ago (STALE_TMP_AGE_S), or, among ``taken`` (the runs
    this one took finished shards from), local runs whose lock is free
    (resume.is_dead_local_run, asked right before each deletion). A dead run
    this one took nothing from keeps its folder until it is old.
    """
    manifest = FileSystems.join(staging, PUBLISH_MANIFEST)
    delete_files([p for p in files_under(staging) if p != manifest])
    delete_files([manifest])
    storage.remove_folder(staging)
    for stale_tmp in stale_tmp_dirs(out_dir, keep=staging):  # left by killed runs, days ago
        delete_tree(stale_tmp)
    for folder in taken:
        if folder.rstrip("/") != staging.rstrip("/") and resume.is_dead_local_run(folder):
            delete_tree(folder)


def published_run(out_dir: str, staging: str, run_id: str, leased: bool = False) -> DatasetInfo | None:
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
        return DatasetInfo.from_json(read_json(info_path))
    if not FileSystems.exists(info_path):
        return None
    info = _published_info(info_path)
    if info is None or info.run_id != run_id:
        return None
    cleanup_staging(staging, out_dir, taken_from(out_dir, info))  # the manifest goes last: redone here if cut short
    return info
