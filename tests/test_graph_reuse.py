"""The TFT graph reused end to end: a second run over the same labels, and a night over the previous night,
take the graph without loading TensorFlow; a changed label list builds its own (run/graph_cache.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from beam_pipeline import reader

from .conftest import REPO, convert, load_info
from .imagegen import image_bytes, write
from .test_transform import make_manifest

pytestmark = pytest.mark.e2e

SIZE = 24


def convert_watched(*args: str) -> bool:
    """A conversion in a fresh process (TFT on, TFDS metadata off); whether it loaded TensorFlow. A process is
    the point (which modules a run loads): Python's import-time report names every module it imports
    (``--verbose``: else the run sends file descriptor 2 elsewhere while TensorFlow loads, to quiet it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "beam_pipeline", "convert", *args, "--image-size", str(SIZE),
         "--no-tfds-metadata", "--verbose"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return re.search(r"^import time:.*\|\s+tensorflow$", proc.stderr, re.MULTILINE) is not None


def graph_bytes(out: Path) -> dict[str, bytes]:
    return {rel: (out / rel).read_bytes() for rel in load_info(out)["transform"]["files"]}


def labels_seen(out: Path) -> list[tuple[str, int]]:
    """(label text, the transformed label id) of every validation record, through the graph."""
    raw = reader.load(str(out), "validation", shuffle_files=False)
    done = reader.load(str(out), "validation", transformed=True, shuffle_files=False)
    return [(r["image/class/text"].numpy().decode(), int(t["label"])) for r, t in zip(raw, done, strict=True)]


def test_same_labels_reuse_the_graph_without_tensorflow_and_new_labels_build_their_own(tmp_path, monkeypatch, tf):
    monkeypatch.setenv("BEAM_PIPELINE_GRAPH_CACHE", str(tmp_path / "cache"))  # cold: no other test's graphs
    manifest = make_manifest(tmp_path)
    first, second, third = tmp_path / "first", tmp_path / "second", tmp_path / "third"
    convert("--manifest", str(manifest), "--output", str(first), "--image-size", str(SIZE), transform=True)
    assert len(os.listdir(tmp_path / "cache")) == 1

    assert not convert_watched("--manifest", str(manifest), "--output", str(second))
    assert graph_bytes(second) == graph_bytes(first)
    assert load_info(second)["transform"] == load_info(first)["transform"]
    assert labels_seen(second) == labels_seen(first)

    # one label more: another key, a graph of its own whose vocabulary is the new labels.txt
    write(str(tmp_path / "img" / "e.img"), image_bytes("jpeg", 40, 40, seed=7))
    manifest.write_text(manifest.read_text() + "img/e.img,eel,validation\n")
    assert convert_watched("--manifest", str(manifest), "--output", str(third))
    labels = (third / "labels.txt").read_text().splitlines()
    assert labels == ["cat", "dog", "eel", "owl", "zebra"]
    assert load_info(third)["transform"]["graph_key"] != load_info(first)["transform"]["graph_key"]
    assert all(labels[i] == text for text, i in labels_seen(third))
    assert len(os.listdir(tmp_path / "cache")) == 2


def test_a_night_takes_the_previous_nights_graph_with_no_cache(tmp_path, monkeypatch, tf):
    monkeypatch.setenv("BEAM_PIPELINE_GRAPH_CACHE", "off")
    manifest = make_manifest(tmp_path)
    night1, night2 = tmp_path / "night1", tmp_path / "night2"
    convert("--manifest", str(manifest), "--output", str(night1), "--image-size", str(SIZE), transform=True)
    write(str(tmp_path / "img" / "new.img"), image_bytes("png", 44, 30, seed=5))  # a new image, a known label
    manifest.write_text(manifest.read_text() + "img/new.img,dog,validation\n")

    assert not convert_watched("--manifest", str(manifest), "--output", str(night2), "--incremental-from", str(night1))
    assert graph_bytes(night2) == graph_bytes(night1)
    assert load_info(night2)["examples"] == load_info(night1)["examples"] + 1
    labels = (night2 / "labels.txt").read_text().splitlines()
    assert all(labels[i] == text for text, i in labels_seen(night2))
