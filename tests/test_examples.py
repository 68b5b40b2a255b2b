"""Examples built without TensorFlow parse as tf.train.Example."""

from __future__ import annotations

import pytest

from beam_pipeline.examples import build_example, parse_example

pytestmark = pytest.mark.unit


def test_tensorflow_parses_our_examples(tf):
    record = build_example(
        {
            "image/encoded": b"\x00\xffbytes",
            "image/height": 7,
            "score": 0.25,
            "image/class/text": "cat",
            "tags": ["a", "b"],
        }
    )
    example = tf.train.Example.FromString(record)
    f = example.features.feature
    assert f["image/encoded"].bytes_list.value == [b"\x00\xffbytes"]
    assert f["image/height"].int64_list.value == [7]
    assert f["score"].float_list.value == [0.25]
    assert f["image/class/text"].bytes_list.value == [b"cat"]
    assert f["tags"].bytes_list.value == [b"a", b"b"]
    assert parse_example(record)["image/height"] == [7]


def test_same_features_same_bytes():
    a = build_example({"b": 1, "a": b"x"})
    assert a == build_example({"b": 1, "a": b"x"})


def test_none_values_are_left_out():
    assert "x" not in parse_example(build_example({"x": None, "y": 1}))
