"""The TF Object Detection API / Model Garden Example keys of a detection record.

Apart from ``objects`` (which builds the records, with Pillow and
pycocotools) so that the reader side (``reader.load(objects=True)``, the
base install: TensorFlow only) can name them without importing either.
"""

from __future__ import annotations

# The Example keys Model Garden's create_coco_tf_record.py writes and its TfExampleDecoder reads
# (difficult/truncated: the TF Object Detection API's Pascal VOC keys).
SOURCE_ID = "image/source_id"
XMIN, YMIN, XMAX, YMAX = (f"image/object/bbox/{k}" for k in ("xmin", "ymin", "xmax", "ymax"))
CLASS_LABEL = "image/object/class/label"
CLASS_TEXT = "image/object/class/text"
IS_CROWD = "image/object/is_crowd"
AREA = "image/object/area"
DIFFICULT = "image/object/difficult"
TRUNCATED = "image/object/truncated"
VIEW = "image/object/view"  # the TF Object Detection API's key for a Pascal VOC object's <pose>
MASK = "image/object/mask"  # one PNG per instance at image size, 0/1 values (Model Garden's include_masks)
