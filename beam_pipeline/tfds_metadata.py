"""TFDS metadata, so ``tfds.builder_from_directory(OUTPUT)`` loads every split.

TFDS reads this tool's shard names as they are (``{name}-{split}.tfrecord-
{i:05d}-of-{n:05d}``); it needs ``dataset_info.json`` and ``features.json``
beside them (plus the class names for the label). Their TFDS features are the
Example keys themselves, flat (``image/encoded``, ``image/class/label``, ...),
so ``builder.as_dataset(split=..., as_supervised=True)`` yields ``(image,
label)`` through ``supervised_keys`` (TFDS looks supervised keys up at the top
level only) and a plain ``as_dataset`` yields the same keys ``reader.load``
does. TFDS decodes ``image/encoded`` to uint8 with 3 channels (grey repeated,
alpha dropped). Manifest extra columns are left out (a record may lack them,
and TFDS has no optional scalars). TFDS cannot read gzip shards, so a gzip
run writes none.

The files are written here as JSON, in the layout TFDS 4.9 writes and reads
(the tests load them with ``tfds.builder_from_directory``), so writing them
imports neither tensorflow-datasets nor TensorFlow: a conversion without the
TFT analysis never pays TensorFlow's start-up. Reading them needs
tensorflow-datasets (in the base install). The homepage is
the dataset's own folder: TFDS would otherwise show a catalog page that does
not exist for it.
"""

from __future__ import annotations

import json
from typing import Any

from apache_beam.io.filesystems import FileSystems

DATASET_INFO = "dataset_info.json"
FEATURES = "features.json"
LABEL_KEY = "image/class/label"
IMAGE_KEY = "image/encoded"
SEGMENTATION_KEY = "image/segmentation/class/encoded"  # annotations.masks.SEGMENTATION_ENCODED
# TFDS's own file-name rule for a ClassLabel's names ("/" in the key becomes ".").
LABEL_NAMES = LABEL_KEY.replace("/", ".") + ".labels.txt"
SUPERVISED_KEYS = (IMAGE_KEY, LABEL_KEY)

_CLS = "tensorflow_datasets.core.features."
_TEXT = {"pythonClassName": _CLS + "text_feature.Text", "text": {}}
_INT64 = {
    "pythonClassName": _CLS + "scalar.Scalar",
    "tensor": {"dtype": "int64", "encoding": "none", "shape": {}},
}


def skip_reason(info: dict[str, Any]) -> str | None:
    """Why TFDS metadata cannot be written for this output, or None."""
    if info["compression"] == "gzip":
        return "TFDS cannot read gzip shards"
    if any(label != label.strip() for label in info.get("labels") or ()):
        # TFDS strips each line of its class-names file and drops blank ones: the names would shift
        return "TFDS would read a label with leading or trailing spaces back as another name"
    return None


def features_json(info: dict[str, Any]) -> dict[str, Any]:
    """features.json: one flat TFDS FeaturesDict keyed by the Example keys."""
    features: dict[str, Any] = {
        IMAGE_KEY: {
            "pythonClassName": _CLS + "image_feature.Image",
            "image": {"dtype": "uint8", "shape": {"dimensions": ["-1", "-1", "3"]}},
        },
        "image/format": _TEXT,
        "image/height": _INT64,
        "image/width": _INT64,
        "image/channels": _INT64,
        "image/filename": _TEXT,
        "image/key/sha256": _TEXT,
    }
    if info.get("labels") is not None:
        features[LABEL_KEY] = {
            "pythonClassName": _CLS + "class_label_feature.ClassLabel",
            "classLabel": {"numClasses": str(len(info["labels"]))},
        }
        features["image/class/text"] = _TEXT
    if SEGMENTATION_KEY in info.get("features", {}):  # --masks: the label map, one channel of class ids
        features[SEGMENTATION_KEY] = {
            "pythonClassName": _CLS + "image_feature.Image",
            "image": {"dtype": "uint8", "shape": {"dimensions": ["-1", "-1", "1"]}},
        }
        features["image/segmentation/class/format"] = _TEXT
    return {
        "pythonClassName": _CLS + "features_dict.FeaturesDict",
        "featuresDict": {"features": dict(sorted(features.items()))},
    }


def dataset_info_json(info: dict[str, Any], homepage: str | None) -> dict[str, Any]:
    """dataset_info.json: name, splits with shard lengths, supervised keys when labelled."""
    template = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
    out: dict[str, Any] = {
        "description": f"{info['name']}: converted by beam_pipeline",
        "fileFormat": "tfrecord",
        "name": info["name"],
        "splits": [
            {
                "filepathTemplate": template,
                "name": split,
                "numBytes": str(v["bytes"]),
                "shardLengths": [str(s["records"]) for s in v["shards"]],
            }
            for split, v in sorted(info["splits"].items())
        ],
        "version": "1.0.0",
    }
    if homepage:
        out["location"] = {"urls": [homepage]}
    if info.get("labels") is not None:
        out["supervisedKeys"] = {"tuple": {"items": [{"featureKey": key} for key in SUPERVISED_KEYS]}}
    return out


def _write(path: str, text: str) -> None:
    with FileSystems.create(path) as fh:
        fh.write(text.encode("utf-8"))


def write(output_dir: str, info: dict[str, Any]) -> list[str]:
    """Writes dataset_info.json, features.json (and label names) into ``output_dir``; returns their names.

    ``output_dir`` may be a staging folder; the homepage recorded is the
    dataset's final folder (``info["config"]["output"]``) when known.
    """
    homepage = (info.get("config") or {}).get("output") or None
    written = {
        DATASET_INFO: json.dumps(dataset_info_json(info, homepage), indent=2, sort_keys=True),
        FEATURES: json.dumps(features_json(info), indent=4, sort_keys=True),
    }
    if info.get("labels") is not None:
        written[LABEL_NAMES] = "".join(f"{label}\n" for label in info["labels"])
    for name, text in written.items():
        _write(FileSystems.join(output_dir, name), text)
    return sorted(written)
