"""tensorflow-transform analysis: one preprocessing graph for training and serving.

After the shards are written, a second, small pipeline runs
``tft_beam.AnalyzeDataset`` and writes ``transform_fn/`` and
``transformed_metadata/`` into the output.  The graph maps a raw Example to:

- ``image``: ``image/encoded`` decoded to 3 channels (grey is repeated, alpha
  dropped), scaled to float32 in [0, 1], resized to ``image_size`` ×
  ``image_size`` keeping the aspect ratio and padding with zeros
  (``tf.image.resize_with_pad``: nothing is cropped);
- ``label``: ``image/class/text`` → id through the TFT vocabulary ``label``,
  which is exactly labels.txt (every listed label, in that order: the labels
  are passed as reserved tokens, so frequency never reorders them);
- with ``--image-stats``: ``image_normalized`` = (image − mean) / std, per
  channel, mean and std computed by TFT analyzers over the train split only;
  they are also stored in dataset.json.

TensorFlow and TFT are imported here only, and only when analysis runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from . import examples
from .examples import parse_example
from .finalize import delete_tree

TRANSFORM_FN = "transform_fn"
TRANSFORMED_METADATA = "transformed_metadata"
LABEL_VOCABULARY = "label"
_MEAN, _STD = "image_mean", "image_std"


@contextlib.contextmanager
def quiet_native_logs() -> Iterator[None]:
    """Silences what TensorFlow's C++ side prints while it loads (unless logging at INFO).

    TF 2.21 writes oneDNN/CUDA notices to file descriptor 2 before its log
    settings apply, so TF_CPP_MIN_LOG_LEVEL alone does not quiet them.
    """
    if logging.getLogger().isEnabledFor(logging.INFO):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def import_tft() -> None:
    """Imports TensorFlow and TFT once, quietly."""
    quiet = not logging.getLogger().isEnabledFor(logging.INFO)
    with quiet_native_logs():
        import tensorflow  # noqa: F401
        import tensorflow_transform  # noqa: F401
        import tensorflow_transform.beam  # noqa: F401
    if quiet:  # absl resets its logger's level when it loads
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
        logging.getLogger("absl").setLevel(logging.ERROR)


def raw_feature_spec(labelled: bool) -> dict[str, Any]:
    import tensorflow as tf

    spec = {examples.ENCODED: tf.io.FixedLenFeature([], tf.string)}
    if labelled:
        spec[examples.LABEL_TEXT] = tf.io.FixedLenFeature([], tf.string)
    return spec


def make_preprocessing_fn(labels: Sequence[str] | None, image_size: int, image_stats: bool) -> Callable:
    """The TFT preprocessing_fn for this dataset (labels None = unlabelled)."""
    import tensorflow as tf
    import tensorflow_transform as tft

    size = int(image_size)

    def decode(encoded: tf.Tensor) -> tf.Tensor:
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        image.set_shape([None, None, 3])
        image = tf.image.convert_image_dtype(image, tf.float32)
        return tf.image.resize_with_pad(image, size, size)

    def preprocessing_fn(inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        images = tf.map_fn(
            decode, inputs[examples.ENCODED], fn_output_signature=tf.TensorSpec([size, size, 3], tf.float32)
        )
        outputs = {"image": images}
        if labels is not None:
            text = inputs[examples.LABEL_TEXT]
            vocab = tft.vocabulary(text, reserved_tokens=list(labels), vocab_filename=LABEL_VOCABULARY)
            outputs["label"] = tft.apply_vocabulary(text, vocab, default_value=-1)
        if image_stats:
            pixels = tf.reshape(images, [-1, 3])  # every pixel is an instance: per-channel statistics
            mean = tft.mean(pixels, reduce_instance_dims=False, name="image_mean")
            std = tf.sqrt(tft.var(pixels, reduce_instance_dims=False, name="image_var"))
            outputs["image_normalized"] = (images - mean) / tf.maximum(std, 1e-6)
            batch = tf.shape(images)[0]
            outputs[_MEAN] = tf.broadcast_to(mean, [batch, 3])
            outputs[_STD] = tf.broadcast_to(std, [batch, 3])
        return outputs

    return preprocessing_fn


def _placeholder_png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buf, "PNG")
    return buf.getvalue()


def _train_rows(record: bytes, labelled: bool) -> dict[str, bytes]:
    ex = parse_example(record)
    row = {examples.ENCODED: ex[examples.ENCODED][0]}
    if labelled:
        row[examples.LABEL_TEXT] = ex[examples.LABEL_TEXT][0]
    return row


def copy_tree(src_dir: str, dest: str) -> None:
    """Copies a folder (local or gs://) into ``dest`` (local or gs://) through Beam FileSystems."""
    prefix = src_dir.rstrip("/") + "/"
    for meta in FileSystems.match([FileSystems.join(src_dir, "**")])[0].metadata_list:
        rel = meta.path[len(prefix) :]
        with (
            FileSystems.open(meta.path, compression_type="uncompressed") as fh,
            FileSystems.create(FileSystems.join(dest, rel), compression_type="uncompressed") as out,
        ):
            shutil.copyfileobj(fh, out)


def run_analysis(
    output_dir: str,
    info: dict[str, Any],
    *,
    image_size: int,
    image_stats: bool,
    options: Any,
    runner: Any,
    temp_root: str | None = None,
) -> dict[str, Any]:
    """Analyzes the written dataset, writes the TFT artifacts into ``output_dir``.

    Returns what dataset.json records about the transform.
    """
    import_tft()
    import tensorflow_transform.beam as tft_beam
    from tensorflow_transform.tf_metadata import dataset_metadata

    labels = info.get("labels")
    labelled = labels is not None
    spec = raw_feature_spec(labelled)
    preprocessing_fn = make_preprocessing_fn(labels, image_size, image_stats)
    train = info["splits"].get("train")
    stats_split_files = [FileSystems.join(output_dir, s["file"]) for s in train["shards"]] if train else []
    if image_stats and not stats_split_files:
        raise ValueError("--image-stats needs a train split")
    compression = "gzip" if info["compression"] == "gzip" else "uncompressed"

    # TFT's scratch must be shared by the workers: under --temp_location on a
    # remote runner, a local temp folder otherwise.
    if temp_root and "://" in temp_root:
        work = FileSystems.join(temp_root, f"beam_pipeline-tft-{uuid.uuid4().hex}")
    else:
        work = tempfile.mkdtemp(prefix="beam_pipeline-tft-", dir=temp_root)
    try:
        local_out = FileSystems.join(work, "out")
        with (
            beam.Pipeline(runner=runner, options=options) as p,
            tft_beam.Context(temp_dir=FileSystems.join(work, "tmp")),
        ):
            if image_stats:
                records = (
                    p
                    | "TrainShards" >> beam.Create(stats_split_files)
                    | "ReadTrain" >> beam.io.ReadAllFromTFRecord(compression_type=compression)
                )
                rows = records | "ToRawRows" >> beam.Map(_train_rows, labelled)
            else:
                # Only the label vocabulary needs data, and its tokens are the
                # label list itself: no image has to be read again. TFT runs
                # the whole graph on each row, so each row carries a valid
                # 1x1 placeholder image.
                pixel = _placeholder_png()
                seed_rows = [{examples.ENCODED: pixel, examples.LABEL_TEXT: label.encode()} for label in labels or []]
                if not labelled:
                    seed_rows = [{examples.ENCODED: pixel}]
                rows = p | "LabelRows" >> beam.Create(seed_rows)
            metadata = dataset_metadata.DatasetMetadata.from_feature_spec(spec)
            transform_fn = (rows, metadata) | "Analyze" >> tft_beam.AnalyzeDataset(preprocessing_fn)
            _ = transform_fn | "WriteTransformFn" >> tft_beam.WriteTransformFn(local_out)

        result: dict[str, Any] = {
            "image_size": image_size,
            "aspect": "resize_with_pad",
            "outputs": sorted(_outputs(local_out)),
            "label_vocabulary": LABEL_VOCABULARY if labelled else None,
        }
        if image_stats:
            result.update(_stats(local_out, stats_split_files[0], compression))
        for name in (TRANSFORM_FN, TRANSFORMED_METADATA):
            dest = FileSystems.join(output_dir, name)
            delete_tree(dest)
            copy_tree(FileSystems.join(local_out, name), dest)
        return result
    finally:
        if "://" in work:
            delete_tree(work)
        else:
            shutil.rmtree(work, ignore_errors=True)


def _outputs(local_out: str) -> Iterator[str]:
    import tensorflow_transform as tft

    yield from tft.TFTransformOutput(local_out).transformed_feature_spec()


def _stats(local_out: str, first_shard: str, compression: str) -> dict[str, Any]:
    """Reads the analyzer results (mean, std per channel) back out of the graph."""
    import tensorflow as tf
    import tensorflow_transform as tft

    with FileSystems.open(first_shard) as fh:
        from apache_beam.io.tfrecordio import _TFRecordUtil

        record = _TFRecordUtil.read_record(fh)
    ex = parse_example(record)
    raw = {examples.ENCODED: tf.constant([ex[examples.ENCODED][0]])}
    if examples.LABEL_TEXT in ex:
        raw[examples.LABEL_TEXT] = tf.constant([ex[examples.LABEL_TEXT][0]])
    out = tft.TFTransformOutput(local_out).transform_raw_features(raw, drop_unused_features=True)
    return {
        "image_mean": [round(float(v), 6) for v in out[_MEAN][0].numpy()],
        "image_std": [round(float(v), 6) for v in out[_STD][0].numpy()],
        "stats_split": "train",
    }
