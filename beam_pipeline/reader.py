"""Reading a converted dataset back as a ``tf.data.Dataset``.

    from beam_pipeline import reader
    ds = reader.load("photos-tfrecords", "train", batch_size=32)                    # raw features
    ds = reader.load("photos-tfrecords", "train", transformed=True, batch_size=32)  # image, label
    ds = reader.load("photos-tfrecords", "validation", shuffle=False)               # stored order
    ds = reader.load("coco-tfrecords", "train", objects=True, masks=True)          # image, boxes, classes, ...

Raw mode parses every feature ``dataset.json`` declares (manifest extras that
a record lacks get 0, 0.0 or b""). Transformed mode applies the saved TFT
``transform_fn`` (``TFTransformOutput.transform_features_layer()``), the same
graph a serving model can embed. Compression and shard list come from
``dataset.json``.

The shards hold one permutation fixed at conversion time, so reading them in
order gives the same sequence every epoch. By default (``shuffle=True``) each
epoch therefore reads the shards in a new order, interleaved, through a
shuffle buffer that is reshuffled on every iteration; ``seed`` makes that
sequence of epochs reproducible. ``shuffle=False`` (evaluation) reads shard
0, then shard 1, ..., each in stored order.

Objects mode (``objects=True``, a ``--coco`` dataset) decodes each record
for a detection input pipeline (Keras, KerasCV, Model Garden), with the
names Model Garden's ``TfExampleDecoder`` gives them: ``image`` (uint8, H x
W x 3), ``boxes`` ([N, 4] float32, ymin, xmin, ymax, xmax, normalized to
[0, 1]: the order of TensorFlow's own box ops, ``tf.image.crop_and_resize``,
``draw_bounding_boxes``, ``non_max_suppression``, of TFDS's ``BBoxFeature``
and of Model Garden's ``groundtruth_boxes``), ``classes`` ([N] int64, the
category ids, line k of labels.txt), ``is_crowd`` ([N] bool), ``area`` ([N]
float32, pixels), ``difficult`` ([N] bool), ``source_id``, ``height`` and
``width``; with ``masks=True`` also ``masks`` ([N, H, W] uint8, 0/1; [0, H,
W] for a record written without masks). Images and object counts differ
from record to record, so ``batch_size`` batches with
``Dataset.ragged_batch``: every value is then a ``tf.RaggedTensor`` (boxes
[B, (N), 4], images [B, (H), (W), 3]). For fixed-size batches, map a resize
(and box padding) of your own over the unbatched dataset, then
``padded_batch``.

An ArrayRecord output (``--format array_record``) is read by position, as
JAX input pipelines read: ``source(output, split)`` is a random-access source
(``len``, record *i*) that Grain takes as it is
(``grain.MapDataset.source(reader.source(out, "train"))``), and
``decode(record)`` turns a record into numpy arrays without TensorFlow (image,
label; ``objects=True``/``masks=True`` the detection values above, with the
same names and dtypes). ``load`` and ``records`` read TFRecord outputs and say
so in one line on an ArrayRecord one. docs/grain.md has a whole training loop.

Raw mode needs only TensorFlow, which is all the base install
(``pip install beam_pipeline``) adds beside it: no Apache Beam, no
tensorflow-transform import. Transformed mode needs the ``[transform]`` extra;
without it, ``MissingExtraError`` (an ImportError) names the install command.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .annotations import keys as obj_keys
from .errors import MissingExtraError
from .vocab.dataset_info import DatasetInfo, SplitInfo

_DTYPES = {"string": "string", "int64": "int64", "float32": "float32"}

# The default shuffle buffer holds about this many bytes of records (from the
# split's average record size), within the bounds below: big enough to mix
# neighbours from several shards, small enough for multi-MB photos.
SHUFFLE_BUFFER_BYTES = 256 * 1024 * 1024
SHUFFLE_BUFFER_MIN, SHUFFLE_BUFFER_MAX = 64, 10_000
# Shards read at once while shuffling (also the interleave's parallelism).
MAX_CYCLE = 16


def read_info(output_dir: str) -> DatasetInfo:
    """The dataset's dataset.json, as a record."""
    import tensorflow as tf

    with tf.io.gfile.GFile(f"{output_dir.rstrip('/')}/dataset.json") as fh:
        return DatasetInfo.from_json(json.load(fh))


def _typed(info: DatasetInfo | Mapping[str, Any]) -> DatasetInfo:
    """The record; a dataset.json already parsed (a dict, as read_info returned before it was typed) is read."""
    return info if isinstance(info, DatasetInfo) else DatasetInfo.from_json(info)


def feature_spec(info: DatasetInfo | Mapping[str, Any]) -> dict[str, Any]:
    """tf.io parsing spec for the raw records, from dataset.json (a list feature, shape [None], as a ragged one:
    a multi-label run's ids and names, a vector per record, a RaggedTensor per batch)."""
    import tensorflow as tf

    defaults = {"string": b"", "int64": 0, "float32": 0.0}
    spec = {}
    for key, feature in _typed(info).features.items():
        dtype = tf.as_dtype(_DTYPES[feature["dtype"]])
        if list(feature["shape"]) == [None]:  # a list (objects; a multi-label run's ids), empty when absent
            spec[key] = tf.io.RaggedFeature(dtype)
            continue
        default = defaults[feature["dtype"]] if feature.get("optional") else None
        spec[key] = tf.io.FixedLenFeature(feature["shape"], dtype, default_value=default)
    return spec


def default_shuffle_buffer(split_info: SplitInfo) -> int:
    """Records in the shuffle buffer: ~256 MB of this split's average record, 64-10,000, at most the split."""
    examples = max(1, int(split_info.examples or 1))
    average = max(1, int(split_info.bytes or 1) // examples)
    wanted = max(SHUFFLE_BUFFER_MIN, min(SHUFFLE_BUFFER_MAX, SHUFFLE_BUFFER_BYTES // average))
    return min(wanted, examples)


def records(
    output_dir: str,
    split: str,
    *,
    shuffle: bool = True,
    seed: int | None = None,
    shuffle_buffer: int | None = None,
    info: DatasetInfo | Mapping[str, Any] | None = None,
) -> Any:
    """The split's serialized records as a tf.data.Dataset of scalar strings (see ``load`` for the order)."""
    import tensorflow as tf

    info = read_info(output_dir) if info is None else _typed(info)
    files = _split_files(output_dir, split, info)
    if info.format != "tfrecord":
        raise ValueError(
            f"{output_dir} holds {info.format} shards, which tf.data does not read: use "
            f"beam_pipeline.reader.source({output_dir!r}, {split!r}) (Grain; docs/grain.md)"
        )
    split_info = info.splits[split]
    compression = "GZIP" if info.compression == "gzip" else ""
    if not shuffle:
        return tf.data.TFRecordDataset(files, compression_type=compression)
    ds = tf.data.Dataset.from_tensor_slices(files)
    ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    # With a seed the interleave keeps its order, so the same seed gives the
    # same epochs; without one it may take whichever shard is ready first.
    ds = ds.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
        cycle_length=max(1, min(len(files), MAX_CYCLE)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=seed is not None,
    )
    buffer = shuffle_buffer if shuffle_buffer is not None else default_shuffle_buffer(split_info)
    if buffer > 1:
        ds = ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
    return ds


# The box coordinates in the order objects mode stacks them (TensorFlow's and Model Garden's order).
BOX_KEYS = (obj_keys.YMIN, obj_keys.XMIN, obj_keys.YMAX, obj_keys.XMAX)


def decode_objects(record: Any, masks: bool = False) -> dict[str, Any]:
    """One serialized detection record as image, boxes (ymin, xmin, ymax, xmax), classes, ... (see the module doc)."""
    import tensorflow as tf

    spec = {
        "image/encoded": tf.io.FixedLenFeature((), tf.string),
        obj_keys.SOURCE_ID: tf.io.FixedLenFeature((), tf.string, default_value=""),
        **{key: tf.io.RaggedFeature(tf.float32) for key in (*BOX_KEYS, obj_keys.AREA)},
        **{key: tf.io.RaggedFeature(tf.int64) for key in (obj_keys.CLASS_LABEL, obj_keys.IS_CROWD, obj_keys.DIFFICULT)},
    }
    if masks:
        spec[obj_keys.MASK] = tf.io.RaggedFeature(tf.string)
    ex = tf.io.parse_single_example(record, spec)
    image = tf.io.decode_image(ex["image/encoded"], channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    height, width = tf.shape(image)[0], tf.shape(image)[1]
    boxes = tf.stack([ex[key] for key in BOX_KEYS], axis=-1)
    out = {
        "source_id": ex[obj_keys.SOURCE_ID],
        "image": image,
        "height": height,
        "width": width,
        "boxes": tf.reshape(boxes, [-1, 4]),
        "classes": ex[obj_keys.CLASS_LABEL],
        "is_crowd": tf.cast(ex[obj_keys.IS_CROWD], tf.bool),
        "area": ex[obj_keys.AREA],
        "difficult": tf.cast(ex[obj_keys.DIFFICULT], tf.bool),
    }
    if masks:
        pngs = ex[obj_keys.MASK]

        def decode_all() -> Any:
            return tf.map_fn(
                lambda png: tf.io.decode_png(png, channels=1)[:, :, 0],
                pngs,
                fn_output_signature=tf.TensorSpec([None, None], tf.uint8),
            )

        # map_fn cannot stack an empty list of unknown shape: no masks is [0, H, W]
        out["masks"] = tf.cond(tf.size(pngs) > 0, decode_all, lambda: tf.zeros([0, height, width], tf.uint8))
    return out


def load(
    output_dir: str,
    split: str,
    *,
    transformed: bool = False,
    objects: bool = False,
    masks: bool = False,
    batch_size: int | None = None,
    shuffle: bool = True,
    seed: int | None = None,
    shuffle_buffer: int | None = None,
    shuffle_files: bool | None = None,
) -> Any:
    """The split as a tf.data.Dataset of feature dicts (batched if ``batch_size``).

    ``shuffle`` (default True): a new order every epoch (shards shuffled and
    interleaved, then a shuffle buffer of ``shuffle_buffer`` records, by
    default ~256 MB worth, reshuffled each iteration); ``seed`` makes it
    reproducible. ``shuffle=False``: the stored order, the same every time
    (evaluation). ``shuffle_files`` is the older name of ``shuffle``.
    ``objects=True`` (a detection dataset): decoded images with their boxes
    and classes, ``masks=True`` adds instance masks; batches are ragged (module doc).
    """
    import tensorflow as tf

    if shuffle_files is not None:
        shuffle = shuffle_files
    info = read_info(output_dir)
    if (objects or masks) and info.categories is None:
        raise ValueError(f"{output_dir} has no objects (not converted with --coco): objects=True needs them")
    ds = records(output_dir, split, shuffle=shuffle, seed=seed, shuffle_buffer=shuffle_buffer, info=info)
    if objects or masks:
        ds = ds.map(lambda r: decode_objects(r, masks), num_parallel_calls=tf.data.AUTOTUNE)
        return ds.ragged_batch(batch_size) if batch_size else ds
    spec = feature_spec(info)
    if not transformed:
        if batch_size:
            return ds.batch(batch_size).map(lambda r: tf.io.parse_example(r, spec), num_parallel_calls=tf.data.AUTOTUNE)
        return ds.map(lambda r: tf.io.parse_single_example(r, spec), num_parallel_calls=tf.data.AUTOTUNE)

    try:
        import tensorflow_transform as tft
    except ImportError as e:  # a training environment without the [transform] extra
        raise MissingExtraError(
            "reader.load(transformed=True) needs tensorflow-transform", "transform", name="tensorflow_transform"
        ) from e

    from .analysis import raw_feature_spec
    from .metadata import is_multi_label

    if not info.transform:  # TFT folders there are not this dataset's (or there are none)
        raise ValueError(f"{output_dir} was converted without a transform (--no-transform): transformed=True needs one")

    tft_output = tft.TFTransformOutput(output_dir)
    layer = tft_output.transform_features_layer()
    raw_spec = raw_feature_spec(info.labels is not None, multi_label=is_multi_label(info))

    def transform(batch: tf.Tensor) -> dict[str, tf.Tensor]:
        return layer(tf.io.parse_example(batch, raw_spec))

    ds = ds.batch(batch_size or 1).map(transform)
    return ds if batch_size else ds.unbatch()


# ---- ArrayRecord outputs: a random-access source and a numpy decode (no TensorFlow) ----------------------------


def _read_text(path: str) -> str:
    if "://" in path:  # gs://: etils comes with array-record and Grain
        from etils import epath

        return epath.Path(path).read_text()
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _split_files(output_dir: str, split: str, info: DatasetInfo) -> list[str]:
    if split in (info.empty_splits or ()):
        raise ValueError(f"split {split!r} of {output_dir} has no records: every listed file of it was rejected")
    if split not in info.splits:
        raise ValueError(f"no split {split!r} in {output_dir} (have: {', '.join(info.splits)})")
    return [f"{output_dir.rstrip('/')}/{s.file}" for s in info.splits[split].shards]


def source(output_dir: str, split: str) -> Any:
    """The split of an ArrayRecord output as a random-access source of serialized records, in stored order:
    ``len(src)``, ``src[i]`` (bytes), ``src.__getitems__([i, j])``; Grain takes it as it is.

    It is array-record's own ``ArrayRecordDataSource`` (the one Grain's ``grain.sources.ArrayRecordDataSource``
    is) over the split's shards, in order; it pickles for Grain's worker processes. Needs the
    ``[array_record]`` extra, not TensorFlow.
    """
    info = DatasetInfo.from_json(json.loads(_read_text(f"{output_dir.rstrip('/')}/dataset.json")))
    if info.format != "array_record":
        raise ValueError(
            f"{output_dir} holds {info.format} shards: source() reads ArrayRecord outputs "
            "(convert with --format array_record); for TFRecord use reader.load"
        )
    files = _split_files(output_dir, split, info)
    try:
        from array_record.python.array_record_data_source import ArrayRecordDataSource
    except ImportError as e:
        raise MissingExtraError(
            "reader.source needs the array-record package", "array_record", name="array_record"
        ) from e
    return ArrayRecordDataSource(files)


def decode(record: bytes, *, objects: bool = False, masks: bool = False) -> dict[str, Any]:
    """One serialized record as numpy arrays, without TensorFlow.

    ``image``: uint8 H x W x 3 (the first frame, as ``tf.io.decode_image(channels=3)`` gives it); ``label``:
    the int64 class id (-1 when the record has none); ``filename``: the record's ``image/filename``.
    ``objects=True`` (a detection output) adds what ``load(objects=True)`` gives: ``boxes`` [N, 4] float32
    (ymin, xmin, ymax, xmax, normalized), ``classes`` int64, ``is_crowd`` and ``difficult`` bool, ``area``
    float32, ``source_id``, ``height``, ``width``; ``masks=True`` adds ``masks`` [N, H, W] uint8 (0/1).
    """
    import io

    import numpy as np
    from PIL import Image

    from .examples import ENCODED, FILENAME, LABEL, parse_example

    ex = parse_example(record)

    def first(key: str, default: Any) -> Any:
        values = ex.get(key) or ()
        return values[0] if values else default

    with Image.open(io.BytesIO(first(ENCODED, b""))) as img:
        if img.mode in ("I", "I;16", "I;16B", "I;16L"):  # 16-bit grey: its high byte, as TensorFlow's decode keeps
            grey = (np.asarray(img, dtype=np.uint32) >> 8).astype(np.uint8)
            image = np.repeat(grey[:, :, None], 3, axis=2)
        else:
            image = np.asarray(img.convert("RGB"), dtype=np.uint8)
    height, width = image.shape[:2]
    out: dict[str, Any] = {
        "image": image,
        "label": np.int64(first(LABEL, -1)),
        "filename": first(FILENAME, b""),
    }
    if not (objects or masks):
        return out

    def floats(key: str) -> Any:
        return np.asarray(ex.get(key) or (), dtype=np.float32)

    def ints(key: str) -> Any:
        return np.asarray(ex.get(key) or (), dtype=np.int64)

    out.update(
        source_id=first(obj_keys.SOURCE_ID, b""),
        height=np.int32(height),
        width=np.int32(width),
        boxes=np.stack([floats(key) for key in BOX_KEYS], axis=-1).reshape(-1, 4),
        classes=ints(obj_keys.CLASS_LABEL),
        is_crowd=ints(obj_keys.IS_CROWD).astype(bool),
        area=floats(obj_keys.AREA),
        difficult=ints(obj_keys.DIFFICULT).astype(bool),
    )
    if masks:
        planes = []
        for png in ex.get(obj_keys.MASK) or ():
            with Image.open(io.BytesIO(png)) as m:
                planes.append(np.asarray(m.convert("L"), dtype=np.uint8))
        out["masks"] = np.stack(planes) if planes else np.zeros((0, height, width), np.uint8)
    return out
