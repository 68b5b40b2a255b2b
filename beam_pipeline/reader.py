"""Reading a converted dataset back as a ``tf.data.Dataset``.

    from beam_pipeline import reader
    ds = reader.load("photos-tfrecords", "train", batch_size=32)                    # raw features
    ds = reader.load("photos-tfrecords", "train", transformed=True, batch_size=32)  # image, label

Raw mode parses every feature ``dataset.json`` declares (manifest extras that
a record lacks get 0, 0.0 or b""). Transformed mode applies the saved TFT
``transform_fn`` (``TFTransformOutput.transform_features_layer()``), the same
graph a serving model can embed. Compression and shard list come from
``dataset.json``; shards are read in parallel (interleaved), in a shuffled
order unless ``shuffle_files=False``.
"""

from __future__ import annotations

import json
from typing import Any

_DTYPES = {"string": "string", "int64": "int64", "float32": "float32"}


def read_info(output_dir: str) -> dict[str, Any]:
    import tensorflow as tf

    with tf.io.gfile.GFile(f"{output_dir.rstrip('/')}/dataset.json") as fh:
        return json.load(fh)


def feature_spec(info: dict[str, Any]) -> dict[str, Any]:
    """tf.io parsing spec for the raw records, from dataset.json."""
    import tensorflow as tf

    defaults = {"string": b"", "int64": 0, "float32": 0.0}
    spec = {}
    for key, feature in info["features"].items():
        dtype = tf.as_dtype(_DTYPES[feature["dtype"]])
        default = defaults[feature["dtype"]] if feature.get("optional") else None
        spec[key] = tf.io.FixedLenFeature(feature["shape"], dtype, default_value=default)
    return spec


def load(
    output_dir: str,
    split: str,
    *,
    transformed: bool = False,
    batch_size: int | None = None,
    shuffle_files: bool = True,
    seed: int | None = None,
) -> Any:
    """The split as a tf.data.Dataset of feature dicts (batched if ``batch_size``)."""
    import tensorflow as tf

    info = read_info(output_dir)
    if split not in info["splits"]:
        raise ValueError(f"no split {split!r} in {output_dir} (have: {', '.join(info['splits'])})")
    files = [f"{output_dir.rstrip('/')}/{s['file']}" for s in info["splits"][split]["shards"]]
    compression = "GZIP" if info["compression"] == "gzip" else ""
    ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle_files:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    ds = ds.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
        cycle_length=max(1, min(len(files), 16)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=not shuffle_files,
    )
    spec = feature_spec(info)
    if not transformed:
        if batch_size:
            return ds.batch(batch_size).map(lambda r: tf.io.parse_example(r, spec), num_parallel_calls=tf.data.AUTOTUNE)
        return ds.map(lambda r: tf.io.parse_single_example(r, spec), num_parallel_calls=tf.data.AUTOTUNE)

    import tensorflow_transform as tft

    from .analysis import raw_feature_spec

    tft_output = tft.TFTransformOutput(output_dir)
    layer = tft_output.transform_features_layer()
    raw_spec = raw_feature_spec(info.get("labels") is not None)

    def transform(records: tf.Tensor) -> dict[str, tf.Tensor]:
        return layer(tf.io.parse_example(records, raw_spec))

    ds = ds.batch(batch_size or 1).map(transform)
    return ds if batch_size else ds.unbatch()
