"""The measurements of ``scripts/benchmark.py``, one module each, and their shared helpers (``common``).

Each module has a ``main(argv)``; ``scripts/benchmark.py NAME [options]``
runs the one ``COMMANDS`` names. Modules import only ``bench.common``, the
project and the other scripts (``make_sample_images``, ``cluster``): never
each other.
"""

from __future__ import annotations

# name on the command line → (module, what it measures)
COMMANDS: dict[str, tuple[str, str]] = {
    "contenders": ("contenders", "convert against the tutorial loop, textbook Beam and two decode floors (default)"),
    "profile": ("profile", "CPU per image, stage by stage, inside convert (--pipeline, --parts, --timeline)"),
    "detection": ("detection", "CPU per image of --coco boxes/masks against classification (--parts)"),
    "startup": ("startup", "wall time of the demo's small job, start-up included, per mode"),
    "graph": ("graph", "a small job with defaults (graph cold, cached, a night's) against --no-transform"),
    "cores": ("cores", "CPU and GIL-held ms per image, one process's ceiling, rates on 1 and 2 processes"),
    "hostile": ("hostile", "hostile and oversized files beside ordinary images, converted at defaults"),
    "plan-scale": ("plan_scale", "plan over a 1 M-row manifest and a 200k-file folder: time, RSS per file"),
    "coco-scale": ("coco_scale", "--coco with up to 1 M annotations: time and RSS"),
    "incremental": ("incremental", "full run against --incremental-from after adding images"),
    "resume": ("resume", "a run killed after most shards, then the same command, against one never killed"),
    "read-budget": ("read_budget", "the read budget with images that grow when converted (CMYK JPEGs)"),
    "publish": ("publish", "publishing N shards on GCS (emulator): requests and wall, batched vs per file"),
    "gcs-read": ("gcs_read", "reading many small gs:// objects (emulator): FileSystems.open vs the writer's reader"),
    "model-garden": ("model_garden", "COCO conversion against TF Model Garden's, image by image, and timed"),
    "near-dups": ("near_dups", "CPU per image with and without the perceptual hash; the pair join over 1 M hashes"),
    "near-dup-recall": ("near_dup_recall", "known copies among distinct images: convert against imagehash, all pairs"),
    "near-dup-scale": ("near_dup_scale", "default search against off on many near-duplicates: time, RSS, lines listed"),
    "engines": ("engines", "the same data locally and on the local Flink/Spark cluster"),
    "million": ("million", "80k, 320k and 1 M small tiles, local and on the local Flink cluster: wall, RSS"),
    "tiles": ("tiles", "the tutorial loop against convert (check off, defaults; 1 and 2 processes) on small tiles"),
    "formats": ("formats", "TFRecord against ArrayRecord: conversion time, raw and decoded read rates (one process)"),
    "measure": ("common", "wall time, CPU and peak RSS of any command's process tree (one JSON line)"),
}
DEFAULT = "contenders"
