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

A detection dataset (``--coco``) adds ``image/source_id`` and one TFDS
``Sequence`` named ``image/object`` whose dict of per-object features TFDS
serializes under exactly the record's flat keys: TFDS joins nested feature
names with "/", so ``{"image/object": Sequence({"bbox": {"xmin": ...}})}``
is stored as ``image/object/bbox/xmin``, a list with one float per object.
``builder.as_dataset`` then yields ``ex["image/object"]["bbox"]["xmin"]``
([N] float32), ``["class"]["label"]`` (a ClassLabel over labels.txt's lines,
so a category id indexes its name), ``["class"]["text"]``, ``["is_crowd"]``,
``["area"]``, ``["difficult"]``, ``["truncated"]``, ``["view"]`` (VOC's
pose; empty for COCO) and ``["mask"]`` ([N, H,
W, 1] uint8, the PNGs decoded). TFDS's ``BBoxFeature`` cannot be used: it
reads one key of 4N floats (``.../bbox``), not the four per-coordinate lists
the Object Detection API keys are.
"""

from __future__ import annotations

import json
from typing import Any

from apache_beam.io.filesystems import FileSystems

from .annotations import objects
from .metadata import is_multi_label
from .vocab.dataset_info import DatasetInfo

DATASET_INFO = "dataset_info.json"
FEATURES = "features.json"
LABEL_KEY = "image/class/label"
IMAGE_KEY = "image/encoded"
SEGMENTATION_KEY = "image/segmentation/class/encoded"  # annotations.masks.SEGMENTATION_ENCODED
# TFDS's own file-name rule for a ClassLabel's names ("/" in the key becomes ".").
LABEL_NAMES = LABEL_KEY.replace("/", ".") + ".labels.txt"
SUPERVISED_KEYS = (IMAGE_KEY, LABEL_KEY)
# A detection dataset's objects: one Sequence whose nested names, joined by "/", are the record's object keys.
OBJECT_KEY = "image/object"
# TFDS's file name for the Sequence's ClassLabel names (top-level "/" becomes ".", nesting joins with "-").
OBJECT_LABEL_NAMES = OBJECT_KEY.replace("/", ".") + "-class-label.labels.txt"

_CLS = "tensorflow_datasets.core.features."
_TEXT = {"pythonClassName": _CLS + "text_feature.Text", "text": {}}
_INT64 = {
    "pythonClassName": _CLS + "scalar.Scalar",
    "tensor": {"dtype": "int64", "encoding": "none", "shape": {}},
}
_FLOAT32 = {
    "pythonClassName": _CLS + "scalar.Scalar",
    "tensor": {"dtype": "float32", "encoding": "none", "shape": {}},
}


def _class_names(info: DatasetInfo) -> list[str] | None:
    """A detection dataset's class names, line k = category id k (labels.txt), or None without objects."""
    categories = objects.categories_of(info)
    return None if categories is None else objects.labels_lines(categories)


def skip_reason(info: DatasetInfo) -> str | None:
    """Why TFDS metadata cannot be written for this output, or None."""
    if info.compression == "gzip":
        return "TFDS cannot read gzip shards"
    names = [*(info.labels or ()), *(_class_names(info) or ())]
    if any(label != label.strip() or not label for label in names):
        # TFDS strips each line of its class-names file and drops blank ones: the names would shift
        return "TFDS would read a blank label, or one with leading or trailing spaces, back as another name"
    return None


def features_json(info: DatasetInfo) -> dict[str, Any]:
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
    if info.labels is not None:
        class_label = {
            "pythonClassName": _CLS + "class_label_feature.ClassLabel",
            "classLabel": {"numClasses": str(len(info.labels))},
        }
        if is_multi_label(info):  # a list of ids (and names) per image: Sequence(ClassLabel), Sequence(Text)
            features[LABEL_KEY] = _sequence(class_label)
            features["image/class/text"] = _sequence(_TEXT)
        else:
            features[LABEL_KEY] = class_label
            features["image/class/text"] = _TEXT
    if SEGMENTATION_KEY in info.features:  # --masks: the label map, one channel of class ids
        features[SEGMENTATION_KEY] = {
            "pythonClassName": _CLS + "image_feature.Image",
            "image": {"dtype": "uint8", "shape": {"dimensions": ["-1", "-1", "1"]}},
        }
        features["image/segmentation/class/format"] = _TEXT
    names = _class_names(info)
    if names is not None:
        features[objects.SOURCE_ID] = _TEXT
        features[OBJECT_KEY] = _object_sequence(len(names))
    return {
        "pythonClassName": _CLS + "features_dict.FeaturesDict",
        "featuresDict": {"features": dict(sorted(features.items()))},
    }


def _dict(features: dict[str, Any]) -> dict[str, Any]:
    return {
        "pythonClassName": _CLS + "features_dict.FeaturesDict",
        "featuresDict": {"features": dict(sorted(features.items()))},
    }


def _object_sequence(num_classes: int) -> dict[str, Any]:
    """The ``image/object`` Sequence: a nest whose "/"-joined paths are the object keys (objects.py)."""
    leaves: dict[str, Any] = {
        objects.XMIN: _FLOAT32,
        objects.YMIN: _FLOAT32,
        objects.XMAX: _FLOAT32,
        objects.YMAX: _FLOAT32,
        objects.CLASS_LABEL: {
            "pythonClassName": _CLS + "class_label_feature.ClassLabel",
            "classLabel": {"numClasses": str(num_classes)},
        },
        objects.CLASS_TEXT: _TEXT,
        objects.IS_CROWD: _INT64,
        objects.AREA: _FLOAT32,
        objects.DIFFICULT: _INT64,
        objects.TRUNCATED: _INT64,
        objects.VIEW: _TEXT,  # a VOC object's <pose>
        # one PNG per object, 0/1, at the image's size; TFDS decodes the list to [N, H, W, 1] uint8
        objects.MASK: {
            "pythonClassName": _CLS + "image_feature.Image",
            "image": {"dtype": "uint8", "shape": {"dimensions": ["-1", "-1", "1"]}},
        },
    }
    nest: dict[str, Any] = {}
    for key, feature in leaves.items():
        *parents, leaf = key[len(OBJECT_KEY) + 1 :].split("/")
        node = nest
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = feature

    def as_features(node: dict[str, Any]) -> dict[str, Any]:
        return _dict({k: as_features(v) if "pythonClassName" not in v else v for k, v in node.items()})

    return {
        "pythonClassName": _CLS + "sequence_feature.Sequence",
        "sequence": {"feature": as_features(nest), "length": "-1"},
    }


def _sequence(feature: dict[str, Any]) -> dict[str, Any]:
    """A TFDS Sequence of ``feature`` of any length, as TFDS writes it (flat key: the Example's list)."""
    return {"pythonClassName": _CLS + "sequence_feature.Sequence", "sequence": {"feature": feature, "length": "-1"}}


def dataset_info_json(info: DatasetInfo, homepage: str | None) -> dict[str, Any]:
    """dataset_info.json: name, splits with shard lengths, supervised keys when labelled."""
    template = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
    out: dict[str, Any] = {
        "description": f"{info.name}: converted by beam_pipeline",
        "fileFormat": info.format,  # formats: each format's name is TFDS's
        "name": info.name,
        "splits": [
            {
                "filepathTemplate": template,
                "name": split,
                "numBytes": str(v.bytes),
                "shardLengths": [str(s.records) for s in v.shards],
            }
            for split, v in sorted(info.splits.items())
        ],
        "version": "1.0.0",
    }
    if homepage:
        out["location"] = {"urls": [homepage]}
    if info.labels is not None:
        out["supervisedKeys"] = {"tuple": {"items": [{"featureKey": key} for key in SUPERVISED_KEYS]}}
    return out


def _write(path: str, text: str) -> None:
    with FileSystems.create(path) as fh:
        fh.write(text.encode("utf-8"))


def write(output_dir: str, info: DatasetInfo) -> list[str]:
    """Writes dataset_info.json, features.json (and label names) into ``output_dir``; returns their names.

    ``output_dir`` may be a staging folder; the homepage recorded is the
    dataset's final folder (``info.config["output"]``) when known.
    """
    homepage = info.config.get("output") or None
    written = {
        DATASET_INFO: json.dumps(dataset_info_json(info, homepage), indent=2, sort_keys=True),
        FEATURES: json.dumps(features_json(info), indent=4, sort_keys=True),
    }
    if info.labels is not None:
        written[LABEL_NAMES] = "".join(f"{label}\n" for label in info.labels)
    names = _class_names(info)
    if names is not None:
        written[OBJECT_LABEL_NAMES] = "".join(f"{name}\n" for name in names)
    for name, text in written.items():
        _write(FileSystems.join(output_dir, name), text)
    return sorted(written)
