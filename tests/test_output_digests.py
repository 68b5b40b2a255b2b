"""Digests of the complete output of 12 representative conversions: moving code around (issue #34) must not
change a byte the user gets.

    .venv/bin/python -m pytest tests/test_output_digests.py -q
    BEAM_PIPELINE_RECORD_DIGESTS=1 .venv/bin/python -m pytest tests/test_output_digests.py  # re-record

The second form rewrites ``tests/output_digests.json`` (the scenarios it ran; others stay as they were). A
change that alters output on purpose re-records them in its own commit, saying why.

Each scenario builds its input afresh in a temp folder of its own (fixed names, seeds and image bytes, and
fixed file mtimes: an input file's mtime is part of what the tool lists and writes to index.jsonl and
rejects.jsonl) and runs ``convert``, in this process except the run the resume scenario kills. Its digest
is every output file's relative path with the sha256 of its content, byte for byte except for what differs
between two runs of the same command in two temp folders (each checked so, and each needed):

- the temp folder (and for gs:// the bucket prefix standing for it), replaced by ``<ROOT>`` in the JSON and
  JSONL files: dataset.json (config paths, incremental.from), rejects.jsonl and object_rejects.jsonl
  (sources, annotation files), TFDS's dataset_info.json;
- in dataset.json: ``run_id`` and the killed run's id in ``resumed.from_runs`` (start time and a random
  part); and ``versions``, stable between runs but ``beam_pipeline_code`` is a digest of the package's
  source, which moving code changes by definition (library versions change with the environment), and
  ``transform.graph_key``, a digest of them among the graph's inputs;
- rejects.jsonl is compared sorted by line: its order follows a hash of each reject's path, and a
  rejected annotation file's path is absolute (VOC's), so the order moves with the temp folder;
- gs:// input: the ``mtime`` fields of index.jsonl and rejects.jsonl (the emulator's upload time);
- TFT's ``transform_fn/saved_model.pb`` and ``fingerprint.pb``: present only (same size, other bytes in
  each run);
- ``--sink write_to_tfrecord``: Beam's WriteToTFRecord deals records to shards from a random start, so its
  shards are present only, plus a digest of the sorted (split, record) pairs of all its shards, and the
  per-shard ``records`` and ``bytes`` in dataset.json are placeholders.

Shards, .idx files, index.jsonl and every other file are digested byte for byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import BUCKET, run_cli
from .imagegen import broken_bytes, image_bytes, write
from .test_coco import make_coco
from .test_convert_e2e import make_folder
from .test_incremental import make_images
from .test_manifest_objects import ROWS, write_csv
from .test_manifest_objects import make_images as make_object_images
from .test_masks import make_mask_set
from .test_multilabel import _csv_manifest
from .test_resume import make_source
from .test_transform import make_manifest
from .test_voc import make_voc

pytestmark = pytest.mark.e2e

DIGESTS = Path(__file__).with_name("output_digests.json")
RECORD = os.environ.get("BEAM_PIPELINE_RECORD_DIGESTS") == "1"
MTIME = 1_700_000_000  # every input file's mtime (a changed file's: later)
QUICK = ("--no-transform", "--no-tfds-metadata")
NO_BUDGET = ("--max-reject-fraction", "1")
PRESENT = "present"  # the digest of a file whose bytes are not stable from run to run
UNSTABLE_TFT = ("transform_fn/saved_model.pb", "transform_fn/fingerprint.pb")
SORTED_LINES = ("rejects.jsonl",)
ROOT = "<ROOT>"


# ---- running convert --------------------------------------------------------------------------------------


def fix_mtimes(root: Path, mtime: int = MTIME) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, (mtime, mtime))


def convert_here(*args: str) -> str:
    """``convert ARGS`` in this process (no interpreter and import start-up); its stderr, for a failure."""
    from beam_pipeline.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["convert", *args])
    assert code == 0, f"convert {' '.join(args)} failed ({code}):\n{err.getvalue()}\n{out.getvalue()}"
    return err.getvalue()


# ---- the scenarios: each builds its input under base and returns the output folder ------------------------


def folder(base: Path) -> Path:
    root = base / "photos"
    make_folder(root)
    fix_mtimes(root)
    out = base / "photos-tfrecords"
    convert_here("--input", str(root), "--output", str(out), "--split-ratios", "train=0.6,validation=0.2,test=0.2",
                 "--seed", "1", "--target-shard-mb", "0.05", *QUICK)  # fmt: skip
    return out


def manifest(base: Path) -> Path:
    """A CSV with labels, splits and extra columns (one row's path absolute, one file missing), and a JSONL
    without labels: one output each, under one scenario."""
    root = base / "photos"
    make_images(root, {"cat": 6, "dog": 6})
    fix_mtimes(root)
    rel = sorted(str(p.relative_to(root)) for p in root.rglob("*.png"))
    lines = ["path,label,split,weight,score,photographer"]
    for i, r in enumerate(rel):
        path = str(root / r) if i == 0 else f"photos/{r}"
        lines.append(f'"{path}",{r.split("/")[0]},{["train", "val", "test"][i % 3]},{i},{i / 4},"Doe, J{i}"')
    lines.append("photos/cat/does-not-exist.jpg,cat,train,1,1.0,x")
    (base / "list.csv").write_text("\ufeff" + "\n".join(lines) + "\n")
    (base / "list.jsonl").write_text("".join(json.dumps({"path": f"photos/{r}", "id": n}) + "\n" for n, r in
                                             enumerate(rel[:5])))  # fmt: skip
    out = base / "manifests"
    convert_here("--manifest", str(base / "list.csv"), "--output", str(out / "csv"), *NO_BUDGET, *QUICK)
    convert_here("--manifest", str(base / "list.jsonl"), "--output", str(out / "jsonl"), *QUICK)
    return out


def gcs_folder(base: Path, gcs: Any) -> Path:
    """A folder and its output on the GCS emulator under gs://BUCKET/<the temp folder>/; the output
    downloaded to base/pets."""
    root = base / "photos"
    make_images(root, {"cat": 5, "dog": 5})
    write(str(root / "cat" / "broken.jpg"), broken_bytes("truncated"))
    prefix = gs_prefix(base)  # the bucket is the session's: a prefix of this scenario's own
    bucket = gcs.bucket(BUCKET)
    for path in sorted(root.rglob("*")):
        if path.is_file():
            bucket.blob(f"{prefix}/in/{path.relative_to(root).as_posix()}").upload_from_filename(str(path))
    gs = f"gs://{BUCKET}/{prefix}"
    convert_here("--input", f"{gs}/in", "--output", f"{gs}/pets", "--no_auth", "--seed", "5",
                 "--split-ratios", "train=0.5,test=0.5", "--target-shard-mb", "0.004", *NO_BUDGET, *QUICK)  # fmt: skip
    out = base / "pets"
    for blob in gcs.list_blobs(BUCKET, prefix=f"{prefix}/pets/"):
        write(str(out / blob.name[len(f"{prefix}/pets/") :]), blob.download_as_bytes())
    return out


def gs_prefix(base: Path) -> str:
    return "output-digests" + str(base)


def coco(base: Path) -> Path:
    root = base / "images"
    (base / "instances.json").write_text(json.dumps(make_coco(root)))
    fix_mtimes(root)
    out = base / "det"
    convert_here("--input", str(root), "--coco", str(base / "instances.json"), "--output", str(out),
                 *NO_BUDGET, *QUICK)  # fmt: skip
    return out


def voc(base: Path) -> Path:
    images, annotations = make_voc(base)
    fix_mtimes(base)
    out = base / "det"
    convert_here("--input", str(images), "--voc", str(annotations), "--output", str(out), *NO_BUDGET, *QUICK)
    return out


def masks(base: Path) -> Path:
    root, mdir, _ = make_mask_set(base)
    fix_mtimes(base)
    out = base / "seg"
    convert_here("--input", str(root), "--masks", str(mdir), "--output", str(out), *NO_BUDGET, *QUICK)
    return out


def manifest_objects(base: Path) -> Path:
    root = base / "objects"
    make_object_images(root)
    write_csv(root / "objects.csv", ROWS)
    fix_mtimes(root)
    out = base / "det"
    convert_here("--manifest", str(root / "objects.csv"), "--manifest-objects", "rows", "--output", str(out),
                 *NO_BUDGET, *QUICK)  # fmt: skip
    return out


def multilabel(base: Path) -> Path:
    manifest = _csv_manifest(base)
    fix_mtimes(base)
    out = base / "tags"
    convert_here("--manifest", str(manifest), "--output", str(out), "--label-separator", "|", *NO_BUDGET, *QUICK)
    return out


def incremental(base: Path) -> Path:
    """A night that builds on the previous one: files added (one in a new label), changed, deleted, renamed."""
    src, first, out = base / "src", base / "night1", base / "night2"
    make_images(src, {"cat": 8, "dog": 8})
    write(str(src / "dog" / "broken.png"), b"not an image")
    fix_mtimes(src)
    args = ("--name", "ds", "--split-ratios", "train=0.7,test=0.3", "--seed", "3", "--target-shard-mb", "0.004",
            *NO_BUDGET, *QUICK)  # fmt: skip
    convert_here("--input", str(src), "--output", str(first), *args)
    make_images(src, {"cat": 3, "eel": 2}, start=50)
    write(str(src / "cat" / "cat_000.png"), image_bytes("png", height=41, width=17, seed=999))
    (src / "dog" / "dog_001.png").unlink()
    (src / "dog" / "dog_002.png").rename(src / "dog" / "renamed.png")
    for path in src.rglob("*"):
        if path.stat().st_mtime != MTIME and path.is_file():  # the files added or changed tonight
            os.utime(path, (MTIME + 86400, MTIME + 86400))
    convert_here("--input", str(src), "--output", str(out), *args, "--incremental-from", str(first))
    return out


def resumed(base: Path) -> Path:
    """A run killed (SIGKILL) as its 3rd shard finishes, then the same command again: it takes that run's
    finished shards."""
    src, out = base / "src", base / "ds"
    make_source(src)
    fix_mtimes(src)
    args = ("--input", str(src), "--output", str(out), "--name", "ds", "--seed", "3", "--target-shard-mb", "0.004",
            *NO_BUDGET, *QUICK)  # fmt: skip
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BEAM_PIPELINE_FAILPOINTS", "writer.result:3:kill")
        killed = run_cli("convert", *args)
    assert killed.returncode != 0 and not (out / "_SUCCESS").exists(), killed
    convert_here(*args)
    return out


def write_to_tfrecord(base: Path) -> Path:
    src = base / "src"
    make_source(src)
    fix_mtimes(src)
    out = base / "ds"
    convert_here("--input", str(src), "--output", str(out), "--sink", "write_to_tfrecord", "--seed", "3",
                 "--split-ratios", "train=0.7,test=0.3", "--target-shard-mb", "0.004", *NO_BUDGET, *QUICK)  # fmt: skip
    return out


def transform(base: Path) -> Path:
    """TFT analysis and TFDS metadata on (convert's defaults), image stats."""
    manifest = make_manifest(base)
    fix_mtimes(base)
    out = base / "tft"
    convert_here("--manifest", str(manifest), "--output", str(out), "--image-size", "32", "--image-stats")
    return out


SCENARIOS: dict[str, Callable[..., Path]] = {
    "folder": folder,
    "manifest": manifest,
    "gcs": gcs_folder,
    "coco": coco,
    "voc": voc,
    "masks": masks,
    "manifest_objects": manifest_objects,
    "multilabel": multilabel,
    "incremental": incremental,
    "resumed": resumed,
    "write_to_tfrecord": write_to_tfrecord,
    "transform": transform,
}


# ---- digests -------------------------------------------------------------------------------------------------


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tfrecords(data: bytes) -> list[bytes]:
    """The records of a TFRecord file (uncompressed): length, its CRC, data, its CRC."""
    out, at = [], 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        out.append(data[at + 12 : at + 12 + length])
        at += 12 + length + 4
    return out


def normal_dataset_json(text: str, wtt: bool) -> str:
    """dataset.json with run ids, versions (and the write_to_tfrecord sink's per-shard counts) as placeholders.

    Written back as the product writes it; a file it does not write that way is left as it is (so a change of
    layout shows as a different digest)."""
    info = json.loads(text)
    if json.dumps(info, indent=2, ensure_ascii=False) + "\n" != text:
        return text
    info["run_id"] = "<RUN_ID>"
    info["versions"] = {k: "<VERSION>" for k in info.get("versions", {})}
    if "graph_key" in (info.get("transform") or {}):  # a digest of the versions and the code, as above
        info["transform"]["graph_key"] = "<GRAPH_KEY>"
    if "resumed" in info:
        info["resumed"]["from_runs"] = ["<RUN_ID>" for _ in info["resumed"]["from_runs"]]
    if wtt:
        for split in info["splits"].values():
            for shard in split["shards"]:
                shard.update(records="<RECORDS>", bytes="<BYTES>")
    return json.dumps(info, indent=2, ensure_ascii=False) + "\n"


def digest(out: Path, roots: tuple[str, ...], *, gs: bool = False, wtt: bool = False) -> dict[str, Any]:
    """{"files": {relative path: sha256 of its normalised content, or "present"}} (+ "records" for the
    write_to_tfrecord sink)."""
    files: dict[str, str] = {}
    records: list[tuple[str, str]] = []
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = path.relative_to(out).as_posix()
        data = path.read_bytes()
        if rel.endswith(UNSTABLE_TFT):
            files[rel] = PRESENT
            continue
        if wtt and ".tfrecord-" in rel and "/" not in rel:
            split = rel.split(".tfrecord-")[0].rsplit("-", 1)[1]
            records += [(split, sha(r)) for r in tfrecords(data)]
            files[rel] = PRESENT
            continue
        if rel.endswith((".json", ".jsonl")):
            text = data.decode("utf-8")
            for root in roots:
                text = text.replace(root, ROOT)
            if rel.endswith("dataset.json"):
                text = normal_dataset_json(text, wtt)
            elif gs and rel.endswith(".jsonl"):  # the objects' upload time
                text = re.sub(r'"mtime": [0-9.e+-]+', '"mtime": "<MTIME>"', text)
            if rel.endswith(SORTED_LINES):
                text = "".join(sorted(text.splitlines(keepends=True)))
            data = text.encode("utf-8")
        files[rel] = sha(data)
    result: dict[str, Any] = {"files": files}
    if wtt:
        result["records"] = sha(json.dumps(sorted(records)).encode())
    return result


def differences(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    lines = []
    w, g = want["files"], got["files"]
    lines += [f"  recorded, not written now: {f}" for f in sorted(set(w) - set(g))]
    lines += [f"  written now, not recorded: {f}" for f in sorted(set(g) - set(w))]
    lines += [f"  other content: {f}" for f in sorted(set(w) & set(g)) if w[f] != g[f]]
    if want.get("records") != got.get("records"):
        lines.append("  other records: the sorted records of all shards")
    return lines


# ---- the test ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded():
    """The recorded digests; when re-recording, the ones of this run written back at the end."""
    if RECORD and os.environ.get("PYTEST_XDIST_WORKER"):
        # each worker would write back its own scenarios over the others': record in one process
        pytest.fail("re-record without pytest-xdist (no -n): BEAM_PIPELINE_RECORD_DIGESTS=1 pytest -p no:xdist ...")
    digests = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
    yield digests
    if RECORD:
        DIGESTS.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")


@pytest.fixture(scope="module", params=list(SCENARIOS))
def scenario(request, tmp_path_factory) -> tuple[str, dict[str, Any]]:
    """One scenario's conversion(s), run in a temp folder of its own; its name and digest."""
    name = request.param
    base = tmp_path_factory.mktemp(name)
    if name == "gcs":
        out = gcs_folder(base, request.getfixturevalue("gcs"))
    else:
        out = SCENARIOS[name](base)
    roots = (f"gs://{BUCKET}/{gs_prefix(base)}", str(base)) if name == "gcs" else (str(base),)
    return name, digest(out, roots, gs=name == "gcs", wtt=name == "write_to_tfrecord")


def test_the_output_is_the_recorded_one(scenario, recorded):
    name, got = scenario
    if RECORD:
        recorded[name] = got
        return
    assert name in recorded, f"{name}: no recorded digests (BEAM_PIPELINE_RECORD_DIGESTS=1 records them)"
    diff = differences(recorded[name], got)
    assert not diff, f"scenario {name}: output differs from {DIGESTS.name}:\n" + "\n".join(diff)
