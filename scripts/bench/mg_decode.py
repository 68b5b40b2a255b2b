"""Decodes TFRecord shards with TF Model Garden's ``TfExampleDecoder(include_mask=True)``: one JSON summary.

Run by the Model Garden venv's python (``scripts/benchmark.py model-garden`` does),
never by the project's: it imports ``official.vision``, which the project does
not depend on.

    /work/mg-venv/bin/python scripts/bench/mg_decode.py --out ours.json OUT/*.tfrecord-*

The summary maps each ``source_id`` to what the decoder hands a Model Garden
input pipeline: height, width, boxes [ymin, xmin, ymax, xmax], classes, crowd
flags, areas, and each mask as a COCO compressed RLE of ``mask > 0.5`` (plus
the distinct values the PNG decoded to, to see 0/1 against 0/255), and how
many records carried that id.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def summarize(files: list[str]) -> dict[str, Any]:
    """source_id → the decoded tensors as plain JSON values."""
    import numpy as np
    import tensorflow as tf
    from official.vision.dataloaders.tf_example_decoder import TfExampleDecoder
    from pycocotools import mask as coco_mask

    decoder = TfExampleDecoder(include_mask=True)
    out: dict[str, Any] = {}
    for serialized in tf.data.TFRecordDataset(files):
        d = decoder.decode(serialized)
        sid = d["source_id"].numpy().decode()
        masks = d["groundtruth_instance_masks"].numpy()
        rles, values = [], set()
        for m in masks:
            values.update(int(v) for v in np.unique(m))
            rle = coco_mask.encode(np.asfortranarray((m > 0.5).astype(np.uint8)))
            rles.append({"size": [int(s) for s in rle["size"]], "counts": rle["counts"].decode("ascii")})
        entry = out.setdefault(sid, {"records": 0})
        entry.update(
            records=entry["records"] + 1,
            height=int(d["height"]),
            width=int(d["width"]),
            boxes=d["groundtruth_boxes"].numpy().astype(float).tolist(),
            classes=d["groundtruth_classes"].numpy().astype(int).tolist(),
            is_crowd=d["groundtruth_is_crowd"].numpy().astype(bool).tolist(),
            areas=d["groundtruth_area"].numpy().astype(float).tolist(),
            masks=rles,
            mask_shape=list(masks.shape),
            mask_values=sorted(values),
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="summary JSON to write")
    p.add_argument("files", nargs="+", help="TFRecord shards (uncompressed)")
    args = p.parse_args(argv)
    with open(args.out, "w") as fh:
        json.dump(summarize(args.files), fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
