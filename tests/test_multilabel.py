"""Multi-label classification (--label-separator): several labels per manifest row → image/class/label lists.

Real conversions through the CLI, read back with TensorFlow (``tf.io.VarLenFeature``),
TFDS and ``reader.load``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from beam_pipeline import resume
from beam_pipeline.config import ConvertConfig, Layout
from beam_pipeline.sources.rules import make_ref, split_labels

from .conftest import convert, load_info, run_cli
from .imagegen import image_bytes, write

pytestmark = pytest.mark.e2e

NO_BUDGET = ("--max-reject-fraction", "1")

# file → the CSV label cell; None: an empty cell
CSV_ROWS = {
    "a.jpg": "cat|dog",
    "b.jpg": " dog | cat |dog ",  # spaces around labels go, a repeated label counts once
    "c.jpg": "fox",
    "d.jpg": "cat||dog",  # an empty label between separators: bad_label
    "e.jpg": None,  # no label: no_label, as in a single-label run
    "f.jpg": "fox|",  # an empty last label: bad_label
    "g.jpg": "dog|fox|cat",
}
# what the records must say, by file: label names sorted by id (ids sorted)
CSV_WANT = {
    "a.jpg": ["cat", "dog"],
    "b.jpg": ["cat", "dog"],
    "c.jpg": ["fox"],
    "g.jpg": ["cat", "dog", "fox"],
}
CSV_REJECTS = {"d.jpg": "bad_label", "e.jpg": "no_label", "f.jpg": "bad_label"}


def _images(root: Path, names: list[str]) -> None:
    for i, name in enumerate(names):
        write(str(root / name), image_bytes("jpeg", seed=i))


def _csv_manifest(tmp_path: Path, rows: dict[str, str | None] = CSV_ROWS) -> Path:
    root = tmp_path / "photos"
    _images(root, sorted(rows))
    lines = ["path,label"] + [f'photos/{name},"{cell or ""}"' for name, cell in sorted(rows.items())]
    manifest = tmp_path / "list.csv"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def _by_file(out: Path, tf) -> dict[str, dict[str, list]]:
    """Every record, parsed with TensorFlow: {file name: {"ids": [...], "text": [...]}}."""
    spec = {
        "image/filename": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.VarLenFeature(tf.int64),
        "image/class/text": tf.io.VarLenFeature(tf.string),
    }
    info = load_info(out)
    rows = {}
    for s in info["splits"].values():
        for shard in s["shards"]:
            for raw in tf.data.TFRecordDataset(str(out / shard["file"])):
                ex = tf.io.parse_single_example(raw, spec)
                name = Path(ex["image/filename"].numpy().decode()).name
                rows[name] = {
                    "ids": ex["image/class/label"].values.numpy().tolist(),
                    "text": [t.decode() for t in ex["image/class/text"].values.numpy().tolist()],
                }
    return rows


def _rejects(out: Path) -> dict[str, tuple[str, str]]:
    rows = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    return {Path(r["path"]).name: (r["reason"], r["detail"]) for r in rows}


def test_csv_manifest_several_labels_per_row(tmp_path, tf):
    manifest = _csv_manifest(tmp_path)
    out = tmp_path / "out"
    convert("--manifest", str(manifest), "--output", str(out), "--label-separator", "|", *NO_BUDGET)
    labels = (out / "labels.txt").read_text().splitlines()
    assert labels == ["cat", "dog", "fox"]
    got = _by_file(out, tf)
    assert got == {name: {"ids": [labels.index(n) for n in want], "text": want} for name, want in CSV_WANT.items()}
    assert {name: reason for name, (reason, _) in _rejects(out).items()} == CSV_REJECTS
    assert "empty label" in _rejects(out)["d.jpg"][1]
    info = load_info(out)
    assert info["features"]["image/class/label"] == {"dtype": "int64", "shape": [None]}
    assert info["features"]["image/class/text"] == {"dtype": "string", "shape": [None]}
    train = info["splits"]["train"]
    # an image counts under each of its labels; examples are images
    assert train["examples"] == 4 and info["examples"] == 4
    assert train["labels"] == {"cat": 3, "dog": 3, "fox": 2}
    index = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    a = next(e for e in index if e["path"].endswith("a.jpg"))
    assert a["label"] == ["cat", "dog"] and a["label_id"] == [0, 1]


def test_without_the_flag_a_separator_is_part_of_the_label(tmp_path):
    manifest = _csv_manifest(tmp_path, {"a.jpg": "cat|dog", "b.jpg": "cat"})
    out = tmp_path / "out"
    convert("--manifest", str(manifest), "--output", str(out))
    assert (out / "labels.txt").read_text().splitlines() == ["cat", "cat|dog"]
    assert load_info(out)["features"]["image/class/label"] == {"dtype": "int64", "shape": []}


def test_labels_file_orders_ids_and_rejects_unknown_labels(tmp_path, tf):
    manifest = _csv_manifest(tmp_path, {"a.jpg": "cat|dog", "b.jpg": "fox|cow", "c.jpg": "fox|cat"})
    labels_file = tmp_path / "labels.txt"
    labels_file.write_text("fox\ndog\ncat\n")
    out = tmp_path / "out"
    convert(
        "--manifest", str(manifest), "--output", str(out), "--label-separator", "|",
        "--labels-file", str(labels_file), *NO_BUDGET,
    )  # fmt: skip
    assert (out / "labels.txt").read_text() == "fox\ndog\ncat\n"
    # ids sorted, names in the ids' order
    assert _by_file(out, tf) == {
        "a.jpg": {"ids": [1, 2], "text": ["dog", "cat"]},
        "c.jpg": {"ids": [0, 2], "text": ["fox", "cat"]},
    }
    reason, detail = _rejects(out)["b.jpg"]
    assert reason == "unknown_label" and "'cow'" in detail


@pytest.mark.unit
def test_split_labels_rules():
    assert split_labels("b | a|b", "|") == (("a", "b"), "")
    assert split_labels(["dog", " cat", "dog"], "|") == (("cat", "dog"), "")
    assert split_labels(["a|b"], "|") == (("a|b",), "")  # list items are not split
    assert split_labels("", "|") == ((), "")
    assert split_labels(None, "|") == ((), "")
    assert split_labels([], "|") == ((), "")
    for bad in ("a||b", "|a", "a|", " | "):
        assert split_labels(bad, "|")[1]
    assert "text" in split_labels(["a", 3], "|")[1]
    assert "--label-separator" in split_labels(["a"], None)[1]


@pytest.mark.unit
def test_a_multi_label_ref_holds_its_labels_as_a_tuple():
    cfg = ConvertConfig(output="o", name="d", manifest="m.csv", label_separator=";")
    layout = Layout(root="/r", pattern=None, manifest="/r/m.csv", manifest_format="csv", label_source="manifest")
    ref = make_ref("/r/a.jpg", "a.jpg", 10, cfg, layout, label_value="x;y")
    assert ref.label == ("x", "y")
    single = make_ref("/r/a.jpg", "a.jpg", 10, ConvertConfig(output="o", name="d", manifest="m.csv"), layout,
                      label_value="x;y")  # fmt: skip
    assert single.label == "x;y"


@pytest.mark.parametrize(
    "args, message",
    [
        (("--input", "photos", "--label-separator", "|"), "--label-separator"),
        (("--manifest", "list.csv", "--label-separator", " "), "--label-separator"),
        (("--manifest", "list.csv", "--label-separator", "|", "--labels-from", "none"), "--label-separator"),
        # an object's label is one class: "cat | dog" must not become one class named so, silently
        (("--manifest", "list.csv", "--label-separator", "|", "--manifest-objects", "rows"), "one class"),
    ],
)
def test_label_separator_usage_errors(tmp_path, args, message):
    result = run_cli("convert", *args, "--output", str(tmp_path / "o"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# file → the JSONL "label" value
JSONL_ROWS = {
    "a.png": ["dog", "cat"],  # a JSON list: taken item by item
    "b.png": "fox|cat",  # text is split as in a CSV
    "c.png": ["cat", "cat"],
    "d.png": [],  # no labels: no_label
    "e.png": ["cat", ""],  # an empty item: bad_label
    "f.png": ["cat", 3],  # an item that is not text: bad_label
    "g.png": "fox",
}
JSONL_WANT = {"a.png": ["cat", "dog"], "b.png": ["cat", "fox"], "c.png": ["cat"], "g.png": ["fox"]}
JSONL_REJECTS = {"d.png": "no_label", "e.png": "bad_label", "f.png": "bad_label"}


def _jsonl_manifest(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    for i, name in enumerate(sorted(JSONL_ROWS)):
        write(str(root / name), image_bytes("png", 20 + i, 24, seed=i))
    manifest = tmp_path / "list.jsonl"
    manifest.write_text(
        "".join(json.dumps({"path": f"photos/{n}", "label": v}) + "\n" for n, v in sorted(JSONL_ROWS.items()))
    )
    return manifest


def test_jsonl_manifest_with_tfds_reader_transform_and_verify(tmp_path, tf):
    """One conversion with default post-steps (TFT analysis, TFDS metadata), read every way a user reads it."""
    import tensorflow_datasets as tfds

    from beam_pipeline import reader

    manifest = _jsonl_manifest(tmp_path)
    out = tmp_path / "out"
    convert(
        "--manifest", str(manifest), "--output", str(out), "--label-separator", "|", *NO_BUDGET,
        transform=True, tfds=True,
    )  # fmt: skip
    labels = (out / "labels.txt").read_text().splitlines()
    assert labels == ["cat", "dog", "fox"]
    want = {name: {"ids": [labels.index(n) for n in names], "text": names} for name, names in JSONL_WANT.items()}
    assert _by_file(out, tf) == want
    assert {name: reason for name, (reason, _) in _rejects(out).items()} == JSONL_REJECTS
    assert load_info(out)["splits"]["train"]["labels"] == {"cat": 3, "dog": 1, "fox": 2}

    # TFDS: Sequence(ClassLabel) with the names of labels.txt
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.features["image/class/label"].feature.names == labels
    from_tfds = {
        Path(ex["image/filename"].numpy().decode()).name: ex["image/class/label"].numpy().tolist()
        for ex in builder.as_dataset(split="train")
    }
    assert from_tfds == {name: w["ids"] for name, w in want.items()}

    # reader.load: a vector of ids per record, a ragged batch
    loaded = {
        Path(ex["image/filename"].numpy().decode()).name: ex["image/class/label"].numpy().tolist()
        for ex in reader.load(str(out), "train", shuffle=False)
    }
    assert loaded == {name: w["ids"] for name, w in want.items()}
    batch = next(iter(reader.load(str(out), "train", shuffle=False, batch_size=4)))
    assert sorted(map(sorted, batch["image/class/label"].to_list())) == sorted(w["ids"] for w in want.values())

    # the TFT graph: label as a multi-hot vector over labels.txt
    transformed = {
        tuple(ex["label"].numpy().tolist()) for ex in reader.load(str(out), "train", transformed=True, shuffle=False)
    }
    assert transformed == {tuple(float(i in w["ids"]) for i in range(3)) for w in want.values()}

    result = run_cli("inspect", str(out), "--verify")
    assert result.returncode == 0, result.stderr


def test_a_json_list_without_the_flag_is_a_bad_label(tmp_path):
    manifest = _jsonl_manifest(tmp_path)
    out = tmp_path / "out"
    convert("--manifest", str(manifest), "--output", str(out), *NO_BUDGET)
    rejects = _rejects(out)
    assert {n for n, (reason, _) in rejects.items() if reason == "bad_label"} >= {"a.png", "c.png"}
    assert "--label-separator" in rejects["a.png"][1]
    assert (out / "labels.txt").read_text().splitlines() == ["fox", "fox|cat"]


def _shard_bytes(out: Path) -> dict[str, bytes]:
    return {s["file"]: (out / s["file"]).read_bytes() for v in load_info(out)["splits"].values() for s in v["shards"]}


def test_incremental_run_reuses_a_record_only_while_its_labels_are_the_same(tmp_path, tf):
    rows = {f"{i:02d}.jpg": ["cat|dog", "dog", "fox|cat", "dog|fox"][i % 4] for i in range(12)}
    manifest = _csv_manifest(tmp_path, rows)
    opts = (
        "--manifest",
        str(manifest),
        "--label-separator",
        "|",
        "--split-ratios",
        "train=0.7,test=0.3",
        "--name",
        "ds",
    )
    first, second, full = tmp_path / "first", tmp_path / "second", tmp_path / "full"
    convert(*opts, "--output", str(first))
    assert load_info(first)["examples"] == 12

    changed = {**rows, "00.jpg": "cat", "01.jpg": "dog|eel", "02.jpg": "cat|fox"}  # 02: the same labels, reordered
    lines = ["path,label"] + [f'photos/{name},"{cell}"' for name, cell in sorted(changed.items())]
    manifest.write_text("\n".join(lines) + "\n")
    convert(*opts, "--output", str(second), "--incremental-from", str(first))
    assert (second / "labels.txt").read_text() == "cat\ndog\nfox\neel\n"  # earlier ids stay, the new label follows
    assert load_info(second)["incremental"]["reused"] == 10 and load_info(second)["incremental"]["converted"] == 2
    got = _by_file(second, tf)
    assert got["00.jpg"] == {"ids": [0], "text": ["cat"]}
    assert got["01.jpg"] == {"ids": [1, 3], "text": ["dog", "eel"]}
    assert got["02.jpg"] == {"ids": [0, 2], "text": ["cat", "fox"]}

    # the same bytes as converting everything afresh with those ids
    convert(*opts, "--output", str(full), "--labels-file", str(second / "labels.txt"))
    assert _shard_bytes(second) == _shard_bytes(full)
    assert (second / "index.jsonl").read_text() == (full / "index.jsonl").read_text()


def test_a_single_label_run_reuses_nothing_of_a_multi_label_one(tmp_path):
    """The label features differ (a list, one value): every record is converted again."""
    manifest = _csv_manifest(tmp_path, {"a.jpg": "cat", "b.jpg": "dog"})
    first, second = tmp_path / "first", tmp_path / "second"
    convert("--manifest", str(manifest), "--output", str(first), "--label-separator", "|")
    convert("--manifest", str(manifest), "--output", str(second), "--incremental-from", str(first))
    assert load_info(second)["incremental"]["reused"] == 0
    assert load_info(second)["features"]["image/class/label"]["shape"] == []


@pytest.mark.smoke
def test_write_to_tfrecord_sink_and_plan_count_examples_once_and_labels_each(tmp_path, tf):
    """The WriteToTFRecord sink counts labels from its records, `plan` from the listing: both the same way."""
    manifest = _csv_manifest(tmp_path)
    opts = ("--manifest", str(manifest), "--label-separator", "|")
    plan = run_cli("plan", *opts, "--output", str(tmp_path / "p"), "--max-reject-fraction", "1")
    assert plan.returncode == 0, plan.stderr
    out = tmp_path / "wtt"
    convert(*opts, "--output", str(out), "--sink", "write_to_tfrecord", *NO_BUDGET)
    labels = (out / "labels.txt").read_text().splitlines()
    got = _by_file(out, tf)
    assert got == {name: {"ids": [labels.index(n) for n in want], "text": want} for name, want in CSV_WANT.items()}
    train = load_info(out)["splits"]["train"]
    assert train["examples"] == 4 and train["labels"] == {"cat": 3, "dog": 3, "fox": 2}
    assert re.search(r"train\s+4 examples", plan.stdout) and "cat 3, dog 3, fox 2" in plan.stdout, plan.stdout


def test_a_killed_multi_label_run_resumes_and_rewrites_a_shard_whose_labels_changed(tmp_path, monkeypatch):
    """Killed after 3 finished shards; one taken image's labels change in the manifest before the re-run: that
    shard is written again, the other two are taken, and the output is a never-killed run's."""
    rows = {f"{i:02d}.jpg": ["cat|dog", "dog", "fox|cat", "dog|fox"][i % 4] for i in range(16)}
    manifest = _csv_manifest(tmp_path, rows)
    opts = ("--manifest", str(manifest), "--label-separator", "|", "--name", "ds", "--target-shard-mb", "0.004")
    out, ref = tmp_path / "out", tmp_path / "ref"
    monkeypatch.setenv("BEAM_PIPELINE_FAILPOINTS", "writer.result:3:kill")
    killed = run_cli("convert", *opts, "--output", str(out), "--no-transform", "--no-tfds-metadata")
    monkeypatch.delenv("BEAM_PIPELINE_FAILPOINTS")
    assert killed.returncode != 0 and not (out / "_SUCCESS").exists()
    [scratch] = [p for p in out.iterdir() if p.name.startswith(".beam_pipeline-tmp-")]
    done = sorted(p for p in (scratch / resume.DONE).glob("*.json") if p.name != resume.RENAMED)
    taken = [json.loads(p.read_text())["result"] for p in done]
    assert len(taken) == 3
    first = json.loads(Path(taken[0]["index_path"]).read_text().splitlines()[0])
    name = Path(first["path"]).name
    # other labels, the same label list (every shard's digest covers it) and the same planned bytes
    rows[name] = {"dog": "cat", "cat|dog": "dog|fox"}.get(rows[name], "cat|dog")
    manifest.write_text("\n".join(["path,label"] + [f'photos/{n},"{c}"' for n, c in sorted(rows.items())]) + "\n")

    convert(*opts, "--output", str(ref))  # never killed, the changed manifest
    convert(*opts, "--output", str(out))  # the same command again
    assert _shard_bytes(out) == _shard_bytes(ref)
    assert (out / "index.jsonl").read_text() == (ref / "index.jsonl").read_text()
    assert load_info(out)["resumed"]["shards"] == 2
