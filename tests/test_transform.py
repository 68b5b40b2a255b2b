"""tensorflow-transform artifacts and the reader: the output feeds training directly."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from beam_pipeline import reader
from beam_pipeline.vocab.dataset_info import DatasetInfo

from .conftest import convert, load_info, run_cli
from .imagegen import image_bytes, write

pytestmark = pytest.mark.e2e

SIZE = 32


def make_manifest(base: Path) -> Path:
    """Images under ``base/img/`` and the manifest ``base/m.csv`` naming them with their splits: 'zebra'
    appears only in validation."""
    rows = ["path,label,split"]
    for i in range(24):
        label = ["cat", "dog", "owl"][i % 3]
        kind = ["jpeg", "png", "jpeg_gray", "png_rgba"][i % 4]
        write(str(base / "img" / f"{i}.img"), image_bytes(kind, 40 + i, 60, seed=i))
        rows.append(f"img/{i}.img,{label},{'validation' if i % 4 == 0 else 'train'}")
    write(str(base / "img" / "z.img"), image_bytes("jpeg", 50, 50, seed=99))
    rows.append("img/z.img,zebra,validation")
    (base / "m.csv").write_text("\n".join(rows) + "\n")
    return base / "m.csv"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A manifest-split dataset where 'zebra' appears only in validation."""
    base = tmp_path_factory.mktemp("tft")
    make_manifest(base)
    out = base / "out"
    (base / "tmp").mkdir()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TMPDIR", str(base / "tmp"))  # test_a_run_leaves_no_temporary_file
        convert(
            "--manifest", str(base / "m.csv"), "--output", str(out), "--image-size", str(SIZE), "--image-stats",
            transform=True,
        )  # fmt: skip
    return out


def test_a_run_leaves_no_temporary_file(dataset):
    """Nothing of the run stays in TMPDIR (TensorFlow's autograph leaves its generated modules in tempfile's
    folder; the run gives it one of its own and removes it): a scheduled job would gather them night after
    night."""
    left = sorted(p.name for p in (dataset.parent / "tmp").iterdir())
    assert left == []


def test_runs_in_threads_of_a_program_both_analyze_and_leave_the_programs_temporary_files(tmp_path):
    """A program calling run_convert from two threads: TFT's graph building is process-wide state, so the two
    analyses took turns failing ("AssertionError"); and the run took over tempfile's folder for the whole
    process, so a file the program's own thread made meanwhile was removed with the run's folder."""
    import os
    import tempfile
    import threading

    from beam_pipeline.cli import parse_convert
    from beam_pipeline.run.convert import run_convert

    for i in range(6):
        write(str(tmp_path / "in" / ["cat", "dog"][i % 2] / f"{i}.png"), image_bytes("png", 24, 20, seed=i))
    results: dict[str, object] = {}

    def run(name: str, *extra: str) -> None:
        cfg, flags, _ = parse_convert(
            ["--input", str(tmp_path / "in"), "--output", str(tmp_path / name), "--no-tfds-metadata", *extra]
        )
        try:
            info = run_convert(cfg, flags)
            assert isinstance(info, DatasetInfo)
            results[name] = info.examples
        except Exception as e:  # noqa: BLE001 - the test reports it
            results[name] = e

    before = tempfile.tempdir
    programs: list[str] = []

    def program() -> None:  # the program's own work while a run lasts
        import time

        from beam_pipeline.run.local import RUN_TEMPORARY_FOLDER as _RUN_TEMPORARY_FOLDER

        deadline = time.monotonic() + 120
        while not _RUN_TEMPORARY_FOLDER._runs and time.monotonic() < deadline:  # noqa: SLF001
            time.sleep(0.01)
        programs.append(tempfile.mkdtemp(prefix="program-"))

    threads = [threading.Thread(target=run, args=("a",)), threading.Thread(target=run, args=("b", "--seed", "3"))]
    threads.append(threading.Thread(target=program))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert results == {"a": 6, "b": 6}
    assert (tmp_path / "a" / "transform_fn").is_dir() and (tmp_path / "b" / "transform_fn").is_dir()
    [made] = programs
    assert os.path.isdir(made) and tempfile.tempdir == before
    os.rmdir(made)


def test_vocabulary_is_labels_txt_including_validation_only_labels(dataset):
    import tensorflow_transform as tft

    labels = (dataset / "labels.txt").read_text().splitlines()
    assert labels == ["cat", "dog", "owl", "zebra"]
    vocab = tft.TFTransformOutput(str(dataset)).vocabulary_by_name("label")
    assert [v.decode() for v in vocab] == labels
    assert (dataset / "_SUCCESS").exists() and (dataset / "transformed_metadata").is_dir()


@pytest.mark.smoke
def test_transformed_batches_carry_label_ids_and_resized_images(dataset, tf):
    labels = (dataset / "labels.txt").read_text().splitlines()
    raw = list(reader.load(str(dataset), "validation", shuffle_files=False))
    done = list(reader.load(str(dataset), "validation", transformed=True, shuffle_files=False))
    assert len(raw) == len(done) == load_info(dataset)["splits"]["validation"]["examples"]
    for r, t in zip(raw, done, strict=True):
        assert int(t["label"]) == labels.index(r["image/class/text"].numpy().decode())
        assert int(t["label"]) == int(r["image/class/label"])
        expected = tf.image.resize_with_pad(
            tf.image.convert_image_dtype(tf.io.decode_image(r["image/encoded"], channels=3), tf.float32), SIZE, SIZE
        )
        assert t["image"].shape == (SIZE, SIZE, 3)
        np.testing.assert_allclose(t["image"].numpy(), expected.numpy(), atol=1e-5)
        assert 0.0 <= float(tf.reduce_min(t["image"])) and float(tf.reduce_max(t["image"])) <= 1.0


def test_image_stats_are_train_split_channel_statistics(dataset, tf):
    info = load_info(dataset)["transform"]
    pixels = []
    for r in reader.load(str(dataset), "train", shuffle_files=False):
        image = tf.io.decode_image(r["image/encoded"], channels=3)
        image = tf.image.resize_with_pad(tf.image.convert_image_dtype(image, tf.float32), SIZE, SIZE)
        pixels.append(image.numpy().reshape(-1, 3))
    pixels = np.concatenate(pixels)
    np.testing.assert_allclose(info["image_mean"], pixels.mean(axis=0), atol=1e-4)
    np.testing.assert_allclose(info["image_std"], pixels.std(axis=0), atol=1e-4)
    batch = next(iter(reader.load(str(dataset), "train", transformed=True, batch_size=4)))
    np.testing.assert_allclose(
        batch["image_normalized"].numpy(), (batch["image"].numpy() - pixels.mean(0)) / pixels.std(0), atol=1e-3
    )


def test_a_keras_model_trains_on_the_transformed_output(dataset, tf):
    ds = reader.load(str(dataset), "train", transformed=True, batch_size=8, seed=0)
    ds = ds.map(lambda f: (f["image"], f["label"]))
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input((SIZE, SIZE, 3)),
            tf.keras.layers.Conv2D(4, 3, activation="relu"),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(4),
        ]
    )
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(ds, epochs=1, verbose=0)
    assert math.isfinite(history.history["loss"][0])
    _, labels = next(iter(ds))
    assert set(labels.numpy()) <= {0, 1, 2}  # train holds cat, dog, owl: ids 0-2


def test_raw_reader_parses_every_declared_feature(dataset):
    batch = next(iter(reader.load(str(dataset), "train", batch_size=5)))
    assert set(batch) == set(load_info(dataset)["features"])
    assert batch["image/encoded"].shape == (5,)


def test_no_transform_writes_no_tft_artifacts(tmp_path):
    write(str(tmp_path / "in" / "cat" / "a.jpg"), image_bytes("jpeg"))
    convert("--input", str(tmp_path / "in"), "--output", str(tmp_path / "o"))
    assert not (tmp_path / "o" / "transform_fn").exists()
    assert "transform" not in load_info(tmp_path / "o")
    result = run_cli("convert", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "o2"), "--no-transform",
                     "--image-stats")  # fmt: skip
    assert result.returncode == 2 and "--image-stats" in result.stderr


def test_post_steps_in_the_job_match_the_launcher_and_publish_from_the_job(dataset, tmp_path):
    """--post-steps job (the default on Dataflow): the job's last step analyses, writes TFDS metadata, publishes."""
    manifest = dataset.parent / "m.csv"
    out = tmp_path / "in-job"
    convert(
        "--manifest", str(manifest), "--output", str(out), "--image-size", str(SIZE), "--image-stats",
        "--post-steps", "job", transform=True, tfds=True,
    )  # fmt: skip
    info, launcher_info = load_info(out), load_info(dataset)
    assert info["config"]["post_steps"] == "job" and launcher_info["config"]["post_steps"] == "launcher"
    stats = ("image_mean", "image_std")  # float sums whose order differs run to run: equal to ~1e-6
    assert {k: v for k, v in info["transform"].items() if k not in stats} == {
        k: v for k, v in launcher_info["transform"].items() if k not in stats
    }
    for key in stats:
        assert info["transform"][key] == pytest.approx(launcher_info["transform"][key], abs=1e-5)
    assert info["tfds"]["files"] and (out / "dataset_info.json").exists()
    assert (out / "_SUCCESS").exists() and (out / "transform_fn" / "saved_model.pb").exists()
    vocab = (out / "transform_fn" / "assets" / "label").read_text()
    assert vocab == (dataset / "transform_fn" / "assets" / "label").read_text()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert len(list(reader.load(str(out), "validation", transformed=True))) == info["splits"]["validation"]["examples"]
    # TFT and TFDS files are this tool's own: a second run is told about the dataset, not about foreign files.
    again = run_cli("convert", "--manifest", str(manifest), "--output", str(out))
    assert again.returncode == 2 and "holds a complete dataset; pass --overwrite" in again.stderr, again.stderr


def test_detach_is_for_remote_runners_only(tmp_path):
    write(str(tmp_path / "in" / "cat" / "a.jpg"), image_bytes("jpeg"))
    result = run_cli("convert", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "o"), "--detach")
    assert result.returncode == 2 and "--detach needs a remote runner" in result.stderr


@pytest.mark.unit
def test_pixel_moments_merge_like_one_pass():
    from beam_pipeline.analysis import EMPTY_MOMENTS, merge_moments, moments_of, stats_from_moments

    rng = np.random.default_rng(0)
    pixels = rng.random((5000, 3)) * [1.0, 0.5, 0.1] + [0.0, 0.25, 0.9]
    merged = EMPTY_MOMENTS
    for part in np.split(pixels, [7, 7, 1000, 4321]):  # uneven parts, one empty
        merged = merge_moments(merged, moments_of(part))
    stats = stats_from_moments(merged)
    assert stats["pixels"] == 5000
    np.testing.assert_allclose(stats["image_mean"], pixels.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats["image_std"], pixels.std(axis=0), rtol=1e-12)


def test_train_pixel_stats_transform_reads_each_shard_and_matches_dataset_json(dataset, tf):
    """The distributed statistics (one element per train shard) over the published shards (the staging folder
    is gone: a retried step after publishing) equal what the run recorded and a NumPy pass over the images."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that

    from beam_pipeline.analysis import TrainPixelStats

    from .conftest import local_pipeline

    info = load_info(dataset)
    assert info["splits"]["train"]["num_shards"] >= 1
    recorded = info["transform"]
    pixels = []
    for r in reader.load(str(dataset), "train", shuffle_files=False):
        image = tf.io.decode_image(r["image/encoded"], channels=3)
        image = tf.image.resize_with_pad(tf.image.convert_image_dtype(image, tf.float32), SIZE, SIZE)
        pixels.append(image.numpy().reshape(-1, 3))
    pixels = np.concatenate(pixels)

    def check(outputs):
        [stats] = outputs
        assert stats["pixels"] == len(pixels) == info["splits"]["train"]["examples"] * SIZE * SIZE
        np.testing.assert_allclose(stats["image_mean"], recorded["image_mean"], atol=1e-6)
        np.testing.assert_allclose(stats["image_std"], recorded["image_std"], atol=1e-6)
        np.testing.assert_allclose(stats["image_mean"], pixels.mean(axis=0), atol=1e-5)
        np.testing.assert_allclose(stats["image_std"], pixels.std(axis=0), atol=1e-5)

    with local_pipeline() as p:
        stats = (
            p
            | beam.Create([DatasetInfo.from_json(info)])
            | TrainPixelStats(str(dataset / ".gone-staging"), str(dataset), SIZE)
        )
        assert_that(stats, check)


def test_serving_parses_examples_with_the_raw_feature_spec_and_applies_the_graph(dataset, tf):
    """The usual TFT serving pattern: metadata/ holds the raw schema, so TFTransformOutput.raw_feature_spec()
    parses serialized Examples into exactly the graph's inputs, and transform_features_layer() maps them."""
    import tensorflow_transform as tft

    output = tft.TFTransformOutput(str(dataset))
    spec = output.raw_feature_spec()
    assert set(spec) == {"image/encoded", "image/class/text"}
    shards = [str(dataset / s["file"]) for s in load_info(dataset)["splits"]["validation"]["shards"]]
    serialized = list(tf.data.TFRecordDataset(shards).batch(64).take(1))[0]
    transformed = output.transform_features_layer()(tf.io.parse_example(serialized, spec))
    texts = [t.decode() for t in tf.io.parse_example(serialized, spec)["image/class/text"].numpy()]
    labels = (dataset / "labels.txt").read_text().splitlines()
    assert transformed["label"].numpy().tolist() == [labels.index(t) for t in texts]
    assert tuple(transformed["image"].shape[1:]) == (SIZE, SIZE, 3)
    assert "metadata/schema.pbtxt" in load_info(dataset)["transform"]["files"]
