"""TFDS metadata, so ``tfds.builder_from_directory(OUTPUT)`` loads every split.

TFDS reads this tool's shard names as they are (``{name}-{split}.tfrecord-
{i:05d}-of-{n:05d}``); it needs ``dataset_info.json`` and ``features.json``
beside them. They describe the Example keys as nested TFDS features
(``image/encoded`` → ``{"image": {"encoded": Image}}``), so TFDS decodes
``image/encoded`` to uint8 with 3 channels (grey repeated, alpha dropped).
Manifest extra columns are left out (a record may lack them, and TFDS has no
optional scalars). TFDS cannot read gzip shards, so a gzip run writes none.

tensorflow-datasets is optional (``pip install beam_pipeline[tfds]``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from typing import Any

from apache_beam.io.filesystems import FileSystems


def available() -> bool:
    return importlib.util.find_spec("tensorflow_datasets") is not None


def skip_reason(info: dict[str, Any]) -> str | None:
    """Why TFDS metadata cannot be written for this output, or None."""
    if info["compression"] == "gzip":
        return "TFDS cannot read gzip shards"
    if not available():
        return "tensorflow-datasets is not installed (pip install 'beam_pipeline[tfds]')"
    return None


def _features(info: dict[str, Any]) -> Any:
    import tensorflow as tf
    import tensorflow_datasets as tfds

    f = tfds.features
    image = {
        "encoded": f.Image(shape=(None, None, 3)),
        "format": f.Text(),
        "height": f.Scalar(tf.int64),
        "width": f.Scalar(tf.int64),
        "channels": f.Scalar(tf.int64),
        "filename": f.Text(),
        "key": f.FeaturesDict({"sha256": f.Text()}),
    }
    if info.get("labels") is not None:
        image["class"] = f.FeaturesDict({"label": f.ClassLabel(names=info["labels"]), "text": f.Text()})
    return f.FeaturesDict({"image": f.FeaturesDict(image)})


def write(output_dir: str, info: dict[str, Any]) -> list[str]:
    """Writes dataset_info.json, features.json (and label names) into ``output_dir``."""
    from .analysis import quiet_native_logs

    with quiet_native_logs():
        import tensorflow_datasets as tfds

    split_infos = [
        tfds.core.SplitInfo(name=split, shard_lengths=[s["records"] for s in v["shards"]], num_bytes=v["bytes"])
        for split, v in info["splits"].items()
    ]
    work = tempfile.mkdtemp(prefix="beam_pipeline-tfds-")
    try:
        # TFDS looks for the shard files by name; empty stand-ins are enough
        # with check_data=False, and keep this working for gs:// outputs.
        shard_names = {s["file"] for v in info["splits"].values() for s in v["shards"]}
        for name in shard_names:
            open(os.path.join(work, name), "wb").close()
        tfds.folder_dataset.write_metadata(
            data_dir=work,
            features=_features(info),
            split_infos=split_infos,
            filename_template="{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}",
            check_data=False,
            description=f"{info['name']}: converted by beam_pipeline",
        )
        written = []
        for name in sorted(os.listdir(work)):
            if name in shard_names:
                continue
            with (
                open(os.path.join(work, name), "rb") as src,
                FileSystems.create(FileSystems.join(output_dir, name)) as dst,
            ):
                shutil.copyfileobj(src, dst)
            written.append(name)
        return written
    finally:
        shutil.rmtree(work, ignore_errors=True)
