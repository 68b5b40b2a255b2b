"""tensorflow-transform analysis: one preprocessing graph for training and serving.

After the shards are written, a second, small pipeline runs
``tft_beam.AnalyzeDataset`` and writes ``transform_fn/``,
``transformed_metadata/`` and ``metadata/`` (the raw schema the graph reads)
into the output.  The graph maps a raw Example to:

- ``image``: ``image/encoded`` decoded to 3 channels (grey is repeated, alpha
  dropped), scaled to float32 in [0, 1], resized to ``image_size`` ×
  ``image_size`` keeping the aspect ratio and padding with zeros
  (``tf.image.resize_with_pad``: nothing is cropped);
- ``label``: ``image/class/text`` → id through the TFT vocabulary ``label``,
  which is exactly labels.txt (every listed label, in that order: the labels
  are passed as reserved tokens, so frequency never reorders them);
- with ``--image-stats``: ``image_normalized`` = (image − mean) / std, per
  channel, over every pixel of every train image as ``image`` shows it
  (resized and padded); they are also stored in dataset.json.

The statistics are a distributed Beam computation (``TrainPixelStats``):
one element per train shard, spread over the workers, each worker decoding
its shard's images and returning per-channel moments (count, mean, M2),
merged by a CombineGlobally. With ``--post-steps job`` it is part of the
main job, after finalize; with the post-steps in the launcher it is its own
pipeline on the run's runner. TFT then gets mean and std as constants, so
its analysis needs no image at all (only the label vocabulary's rows):
no worker re-reads the split alone.

TensorFlow and TFT are imported here only, and only when analysis runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypedDict

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from . import examples, storage
from .examples import parse_example
from .formats import registry
from .metadata import is_multi_label
from .storage import delete_tree, write_text
from .vocab.dataset_info import DatasetInfo

TRANSFORM_FN = "transform_fn"
TRANSFORMED_METADATA = "transformed_metadata"
# The raw schema the graph reads (TFTransformOutput.RAW_METADATA_DIR): raw_feature_spec() parses a serialized
# Example into exactly the graph's inputs, the usual serving pattern.
RAW_METADATA = "metadata"
LABEL_VOCABULARY = "label"
_MEAN, _STD = "image_mean", "image_std"

# Per-channel moments of a set of pixels: (count, mean per channel, sum of squared deviations per channel).
Moments = tuple[int, tuple[float, ...], tuple[float, ...]]


class PixelStats(TypedDict):
    """The train split's per-channel statistics (``--image-stats``), as the graph takes them."""

    image_mean: list[float]
    image_std: list[float]  # population std, as tft.var
    pixels: int


class TransformInfo(TypedDict, total=False):
    """What dataset.json's ``transform`` block records of the analysis (the post-steps add ``graph_key`` and
    ``files``); the statistics only with ``--image-stats``."""

    image_size: int
    aspect: str
    outputs: list[str]
    label_vocabulary: str | None
    image_mean: list[float]
    image_std: list[float]
    stats_split: str


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


def raw_feature_spec(labelled: bool, multi_label: bool = False) -> dict[str, Any]:
    """What the TFT graph reads of a record: the image bytes, and the label text (a list in a multi-label run)."""
    import tensorflow as tf

    spec = {examples.ENCODED: tf.io.FixedLenFeature([], tf.string)}
    if labelled:
        text = tf.io.VarLenFeature(tf.string) if multi_label else tf.io.FixedLenFeature([], tf.string)
        spec[examples.LABEL_TEXT] = text
    return spec


def decode_resized(encoded: Any, size: int) -> Any:
    """``image``: 3 channels, float32 in [0, 1], resized with padding to size × size.

    The one definition used by the TFT graph and by the pixel statistics, so
    the statistics describe exactly the images the graph produces.
    """
    import tensorflow as tf

    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    image = tf.image.convert_image_dtype(image, tf.float32)
    return tf.image.resize_with_pad(image, size, size)


def make_preprocessing_fn(
    labels: Sequence[str] | None,
    image_size: int,
    pixel_stats: Mapping[str, Any] | None = None,
    multi_label: bool = False,
) -> Callable:
    """The TFT preprocessing_fn for this dataset (labels None = unlabelled).

    ``multi_label``: ``label`` is a multi-hot float32 vector over the label
    list (1.0 at each of the image's label ids), what a sigmoid output trains on.

    ``pixel_stats`` ({"image_mean": [3], "image_std": [3]}, from
    ``TrainPixelStats``) adds ``image_normalized``; mean and std enter the
    graph as constants.
    """
    import tensorflow as tf
    import tensorflow_transform as tft

    size = int(image_size)

    def decode(encoded: tf.Tensor) -> tf.Tensor:
        return decode_resized(encoded, size)

    def preprocessing_fn(inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        images = tf.map_fn(
            decode, inputs[examples.ENCODED], fn_output_signature=tf.TensorSpec([size, size, 3], tf.float32)
        )
        outputs = {"image": images}
        if labels is not None:
            text = inputs[examples.LABEL_TEXT]
            vocab = tft.vocabulary(text, reserved_tokens=list(labels), vocab_filename=LABEL_VOCABULARY)
            ids = tft.apply_vocabulary(text, vocab, default_value=-1)
            outputs["label"] = _multi_hot(ids, len(labels)) if multi_label else ids
        if pixel_stats is not None:
            mean = tf.constant(pixel_stats[_MEAN], tf.float32)
            std = tf.constant(pixel_stats[_STD], tf.float32)
            outputs["image_normalized"] = (images - mean) / tf.maximum(std, 1e-6)
            batch = tf.shape(images)[0]
            outputs[_MEAN] = tf.broadcast_to(mean, [batch, 3])
            outputs[_STD] = tf.broadcast_to(std, [batch, 3])
        return outputs

    return preprocessing_fn


def _multi_hot(ids: Any, depth: int) -> Any:
    """A SparseTensor of label ids per row → [rows, depth] float32, 1.0 at each id (an unknown id, -1: none)."""
    import tensorflow as tf

    dense = tf.sparse.to_dense(ids, default_value=-1)
    return tf.minimum(tf.reduce_sum(tf.one_hot(dense, depth, dtype=tf.float32), axis=1), 1.0)


def _placeholder_png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buf, "PNG")
    return buf.getvalue()


# ---- per-channel pixel statistics of the train split, distributed ------------


def merge_moments(a: Moments, b: Moments) -> Moments:
    """Two (count, mean, M2) per-channel moments as one (Chan et al.'s parallel update)."""
    (na, ma, m2a), (nb, mb, m2b) = a, b
    if na == 0:
        return b
    if nb == 0:
        return a
    n = na + nb
    delta = [y - x for x, y in zip(ma, mb, strict=True)]
    mean = tuple(x + d * nb / n for x, d in zip(ma, delta, strict=True))
    m2 = tuple(x + y + d * d * na * nb / n for x, y, d in zip(m2a, m2b, delta, strict=True))
    return n, mean, m2


EMPTY_MOMENTS: Moments = (0, (0.0, 0.0, 0.0), (0.0, 0.0, 0.0))


def moments_of(pixels: Any) -> Moments:
    """(count, mean, M2) per channel of an (N, 3) array, in float64."""
    import numpy as np

    values = np.asarray(pixels, dtype=np.float64).reshape(-1, 3)
    if not len(values):
        return EMPTY_MOMENTS
    mean = values.mean(axis=0)
    m2 = ((values - mean) ** 2).sum(axis=0)
    return len(values), tuple(float(v) for v in mean), tuple(float(v) for v in m2)


def stats_from_moments(moments: Moments) -> PixelStats:
    """{"image_mean", "image_std" (population, as tft.var), "pixels"}."""
    n, mean, m2 = moments
    return {
        _MEAN: list(mean),
        _STD: [math.sqrt(v / n) if n else 0.0 for v in m2],
        "pixels": n,
    }


class _ShardMoments(beam.DoFn):
    """shard file → (count, mean, M2) per channel over its images, decoded and resized as ``image``."""

    def __init__(self, image_size: int) -> None:
        self._size = int(image_size)

    def setup(self) -> None:
        import_tft()
        import tensorflow as tf

        size = self._size
        self._decode = tf.function(
            lambda encoded: decode_resized(encoded, size), input_signature=[tf.TensorSpec([], tf.string)]
        )

    def process(self, path: str) -> Iterator[Moments]:
        moments = EMPTY_MOMENTS
        for record in registry.of_shard(path).records(path):  # its format by its name (gzip: .gz)
            encoded = parse_example(record)[examples.ENCODED][0]
            moments = merge_moments(moments, moments_of(self._decode(encoded).numpy()))
        yield moments


class MergeMoments(beam.CombineFn):
    """Moments → the merged moments (an empty input gives zero pixels)."""

    def create_accumulator(self) -> Moments:
        return EMPTY_MOMENTS

    def add_input(self, acc: Moments, moments: Moments) -> Moments:
        return merge_moments(acc, moments)

    def merge_accumulators(self, accs: Iterable[Moments]) -> Moments:
        out = EMPTY_MOMENTS
        for acc in accs:
            out = merge_moments(out, acc)
        return out

    def extract_output(self, acc: Moments) -> Moments:
        return acc


def train_shard_paths(info: DatasetInfo, staging: str, output: str) -> list[str]:
    """The train shards of a finalized run: in the staging folder, or already in the output
    (a retried step after the run was published)."""
    paths = []
    for file in info.shard_files("train"):
        staged = FileSystems.join(staging, file)
        paths.append(staged if FileSystems.exists(staged) else FileSystems.join(output, file))
    return paths


class TrainPixelStats(beam.PTransform):
    """finalize's dataset.json dict → one {"image_mean", "image_std", "pixels"} over the train split.

    One element per train shard crosses a Reshuffle, so different workers
    decode different shards; only three-number moments come back.
    """

    def __init__(self, staging: str, output: str, image_size: int) -> None:
        super().__init__()
        self._staging = staging
        self._output = output
        self._size = image_size

    def expand(self, infos: beam.PCollection) -> beam.PCollection:
        staging, output = self._staging, self._output
        return (
            infos
            | "TrainShardPaths" >> beam.FlatMap(lambda info: train_shard_paths(info, staging, output))
            | "SpreadTrainShards" >> beam.Reshuffle()
            | "ShardMoments" >> beam.ParDo(_ShardMoments(self._size))
            | "MergeMoments" >> beam.CombineGlobally(MergeMoments())
            | "PixelStats" >> beam.Map(stats_from_moments)
        )


def compute_pixel_stats(
    shard_paths: Sequence[str], image_size: int, *, options: Any, runner: Any, work: str
) -> PixelStats:
    """``TrainPixelStats`` as a pipeline of its own (post-steps in the launcher), on the run's runner."""
    result_path = FileSystems.join(work, "pixel_stats.json")
    with beam.Pipeline(runner=runner, options=options) as p:
        _ = (
            p
            | "TrainShards" >> beam.Create(list(shard_paths))
            | "SpreadTrainShards" >> beam.Reshuffle()
            | "ShardMoments" >> beam.ParDo(_ShardMoments(image_size))
            | "MergeMoments" >> beam.CombineGlobally(MergeMoments())
            | "PixelStats" >> beam.Map(stats_from_moments)
            | "WriteStats" >> beam.Map(lambda stats: write_text(result_path, json.dumps(stats)))
        )
    with FileSystems.open(result_path, compression_type="uncompressed") as fh:
        return json.loads(fh.read().decode("utf-8"))


def train_pixel_stats(
    staging: str, info: DatasetInfo, image_size: int, *, options: Any, runner: Any, temp_root: str | None
) -> PixelStats:
    """The train split's statistics, by ``compute_pixel_stats`` on the run's runner (post-steps in the
    launcher), before the graph they enter is looked up or built."""
    files = [FileSystems.join(staging, file) for file in info.shard_files("train")]
    if not files:
        raise ValueError("--image-stats needs a train split")
    work = storage.make_temp_folder(temp_root, "beam_pipeline-stats-")
    try:
        return compute_pixel_stats(files, image_size, options=options, runner=runner, work=work)
    finally:
        storage.remove_temp_folder(work)


def copy_tree(src_dir: str, dest: str) -> None:
    """Copies a folder (local or gs://) into ``dest`` (local or gs://) through Beam FileSystems."""
    prefix = src_dir.rstrip("/") + "/"
    for meta in FileSystems.match([FileSystems.join(src_dir, "**")])[0].metadata_list:
        storage.copy_file(meta.path, FileSystems.join(dest, meta.path[len(prefix) :]))


# tensorflow-transform keeps process-wide state while it builds a graph (annotators' object tracker): runs in
# threads of one process take turns at the analysis.
_TFT_LOCK = threading.Lock()


def run_analysis(output_dir: str, info: DatasetInfo, **settings: Any) -> TransformInfo:
    """``_analyze`` (the TFT artifacts into ``output_dir``; what dataset.json records), one run at a time."""
    with _TFT_LOCK:
        return _analyze(output_dir, info, **settings)


def _analyze(
    output_dir: str,
    info: DatasetInfo,
    *,
    image_size: int,
    image_stats: bool,
    options: Any,
    runner: Any,
    temp_root: str | None = None,
    pixel_stats: Mapping[str, Any] | None = None,
) -> TransformInfo:
    """Analyzes the written dataset, writes the TFT artifacts into ``output_dir``.

    With ``image_stats``, ``pixel_stats`` is what ``TrainPixelStats``
    computed in the job; without it (post-steps in the launcher) they are
    computed here by a pipeline of their own on ``runner``.

    Returns what dataset.json records about the transform.
    """
    import_tft()
    import tensorflow_transform.beam as tft_beam
    from tensorflow_transform.tf_metadata import dataset_metadata

    labels = info.labels
    labelled = labels is not None
    multi_label = is_multi_label(info)
    spec = raw_feature_spec(labelled, multi_label)
    stats_split_files = [FileSystems.join(output_dir, file) for file in info.shard_files("train")]
    if image_stats and not stats_split_files:
        raise ValueError("--image-stats needs a train split")

    # TFT's scratch must be shared by the workers: under --temp_location on a
    # remote runner, a local temp folder otherwise.
    work = storage.make_temp_folder(temp_root, "beam_pipeline-tft-")
    try:
        if image_stats and pixel_stats is None:
            pixel_stats = compute_pixel_stats(stats_split_files, image_size, options=options, runner=runner, work=work)
        preprocessing_fn = make_preprocessing_fn(labels, image_size, pixel_stats if image_stats else None, multi_label)
        local_out = FileSystems.join(work, "out")
        with (
            beam.Pipeline(runner=runner, options=options) as p,
            tft_beam.Context(temp_dir=FileSystems.join(work, "tmp")),
        ):
            # Only the label vocabulary needs data, and its tokens are the
            # label list itself: no image has to be read again (the pixel
            # statistics are constants by now). TFT runs the whole graph on
            # each row, so each row carries a valid 1x1 placeholder image.
            pixel = _placeholder_png()
            seed_rows = [
                {examples.ENCODED: pixel, examples.LABEL_TEXT: [label.encode()] if multi_label else label.encode()}
                for label in labels or []
            ]
            if not labelled:
                seed_rows = [{examples.ENCODED: pixel}]
            rows = p | "LabelRows" >> beam.Create(seed_rows)
            metadata = dataset_metadata.DatasetMetadata.from_feature_spec(spec)
            transform_fn = (rows, metadata) | "Analyze" >> tft_beam.AnalyzeDataset(preprocessing_fn)
            _ = transform_fn | "WriteTransformFn" >> tft_beam.WriteTransformFn(local_out)
            _ = metadata | "WriteRawMetadata" >> tft_beam.WriteMetadata(FileSystems.join(local_out, RAW_METADATA), p)

        result: TransformInfo = {
            "image_size": image_size,
            "aspect": "resize_with_pad",
            "outputs": sorted(_outputs(local_out)),
            "label_vocabulary": LABEL_VOCABULARY if labelled else None,
        }
        if image_stats and pixel_stats is not None:
            result.update(
                image_mean=[round(float(v), 6) for v in pixel_stats[_MEAN]],
                image_std=[round(float(v), 6) for v in pixel_stats[_STD]],
                stats_split="train",
            )
        for name in (TRANSFORM_FN, TRANSFORMED_METADATA, RAW_METADATA):
            dest = FileSystems.join(output_dir, name)
            delete_tree(dest)
            copy_tree(FileSystems.join(local_out, name), dest)
        return result
    finally:
        storage.remove_temp_folder(work)


def _outputs(local_out: str) -> Iterator[str]:
    import tensorflow_transform as tft

    yield from tft.TFTransformOutput(local_out).transformed_feature_spec()
