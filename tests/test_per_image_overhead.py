"""Per-image overhead of the shard writer (issue #22): each cut keeps output and checks exactly as they were.

Byte identity of whole outputs is checked by test_writing, test_convert_e2e and
test_resume; these tests pin the cuts themselves (one sha256 per image, no
protobuf message per Example, reads sized by the listing) and the edge cases
each cut must keep.
"""

from __future__ import annotations

import hashlib
import io
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from apache_beam.io.tfrecordio import _TFRecordUtil

from beam_pipeline import examples, storage
from beam_pipeline.formats.tfrecord import frame_record
from beam_pipeline.images.options import ImageOptions, Rejected
from beam_pipeline.vocab.reasons import TOO_LARGE
from beam_pipeline.vocab.records import ShardResult
from beam_pipeline.vocab.refs import Ref
from beam_pipeline.writer.budget import Budget
from beam_pipeline.writer.readahead import read_then_convert
from beam_pipeline.writer.shard import WriteShardFn
from tests.imagegen import image_bytes

pytestmark = pytest.mark.unit

# ---- reads: sized by the listing, a file that grew is still read whole (up to the limit) ---------------


def _spy_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    asked: list[int] = []
    real_open = storage.FileSystems.open

    class Spy(io.BufferedReader):
        def read(self, n: int | None = -1) -> bytes:  # type: ignore[override]
            asked.append(-1 if n is None else n)
            return super().read(n)

    def spy_open(path: str, *args: object, **kwargs: object) -> io.BufferedReader:
        real_open(path, *args, **kwargs).close()  # the real code path's checks, then a reader we can watch
        return Spy(io.FileIO(path, "rb"))

    monkeypatch.setattr(storage.FileSystems, "open", staticmethod(spy_open))
    return asked


def test_local_read_asks_for_the_listed_size_not_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # read(limit + 1) allocates the whole limit (256 MB) for every 95 KB file: 40 µs of CPU per image.
    path = tmp_path / "a.jpg"
    path.write_bytes(image_bytes("jpeg"))
    asked = _spy_reads(monkeypatch)
    size = path.stat().st_size
    assert storage.read_bytes(str(path), size, ImageOptions()) == path.read_bytes()
    assert asked and all(0 <= n <= size + 1 for n in asked), asked


@pytest.mark.parametrize("grow", [1, 5000])
def test_local_file_that_grew_after_listing_is_read_whole(tmp_path: Path, grow: int) -> None:
    path = tmp_path / "a.jpg"
    data = image_bytes("jpeg")
    path.write_bytes(data)
    listed = len(data)
    with open(path, "ab") as fh:
        fh.write(b"\0" * grow)
    assert storage.read_bytes(str(path), listed, ImageOptions()) == data + b"\0" * grow


def test_local_file_that_grew_past_the_limit_is_too_large(tmp_path: Path) -> None:
    path = tmp_path / "a.jpg"
    path.write_bytes(b"\xff\xd8" + b"\0" * 998)
    with open(path, "ab") as fh:
        fh.write(b"\0" * 2_000_000)
    with pytest.raises(Rejected) as e:
        storage.read_bytes(str(path), 1000, ImageOptions(max_file_bytes=1_000_000))
    assert e.value.reason == TOO_LARGE


def test_local_file_that_shrank_or_has_no_listed_size(tmp_path: Path) -> None:
    path = tmp_path / "a.jpg"
    path.write_bytes(b"abc")
    assert storage.read_bytes(str(path), 10_000, ImageOptions()) == b"abc"
    assert storage.read_bytes(str(path), -1, ImageOptions()) == b"abc"
    assert storage.read_bytes(str(path)) == b"abc"


# ---- one shard, written by the real writer -------------------------------------------------------------


def _images(tmp_path: Path, n: int = 12) -> tuple[list[Ref], dict[str, bytes]]:
    refs, blobs = [], {}
    for i in range(n):
        kind = ("jpeg", "png")[i % 2]
        data = image_bytes(kind, seed=i)
        path = tmp_path / "in" / ("cats", "dogs")[i % 2] / f"{i}.{kind}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        refs.append(Ref(str(path), f"{path.parent.name}/{path.name}", len(data), "train", path.parent.name, i))
        blobs[str(path)] = data
    return refs, blobs


def _write_shard(tmp_path: Path, refs: list[Ref]) -> tuple[ShardResult, bytes]:
    fn = WriteShardFn(str(tmp_path / "tmp"), "none", 2)
    fn.setup()
    *rejects, result = fn.process((("train", 0), refs), ["cats", "dogs"], {})
    assert not rejects and result.records == len(refs)
    return result, Path(result.tmp_path).read_bytes()


def test_one_sha256_per_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refs, blobs = _images(tmp_path)
    images = set(blobs.values())
    hashed: list[int] = []
    real = hashlib.sha256

    def counting(data: bytes = b"", **kwargs: object) -> object:
        if bytes(data) in images:
            hashed.append(len(data))
        return real(data, **kwargs)

    monkeypatch.setattr(hashlib, "sha256", counting)
    result, _ = _write_shard(tmp_path, refs)
    assert len(hashed) == len(refs)


# ---- Examples: single values appended, the same bytes (and errors) as before ---------------------------

_IMAGE_FEATURES = {
    examples.ENCODED: b"\xff\xd8" + bytes(range(256)) * 600,
    examples.FORMAT: "jpeg",
    examples.HEIGHT: 480,
    examples.WIDTH: 640,
    examples.CHANNELS: 3,
    examples.FILENAME: "cats/ä b.jpg",
    examples.SHA256: "0" * 64,
    examples.LABEL: 0,
    examples.LABEL_TEXT: "cats",
}


def _reference_example(features: dict) -> bytes:
    """The Example as build_example wrote it before its single-value fast path (one extend per feature)."""
    example = examples.Example()
    fmap = example.features.feature
    for key, value in features.items():
        if value is None:
            continue
        values = value if isinstance(value, (list, tuple)) else (value,)
        if not values:
            continue
        first = values[0]
        if isinstance(first, (bytes, str)):
            fmap[key].bytes_list.value.extend(v.encode("utf-8") if isinstance(v, str) else v for v in values)
        elif isinstance(first, (bool, int)):
            fmap[key].int64_list.value.extend(int(v) for v in values)
        elif isinstance(first, float):
            fmap[key].float_list.value.extend(values)
        else:
            raise TypeError(f"feature {key!r}: unsupported value type {type(first).__name__}")
    return example.SerializeToString(deterministic=True)


_CASES = [
    {},
    {"a": None, "b": []},
    _IMAGE_FEATURES,
    {"": b"", "z": 0, "y": -1, "x": 2**63 - 1, "w": -(2**63), "v": True, "u": False},
    {"ints": [0, 1, 127, 128, 300, 2**32, -5, 2**62], "strs": ["a", b"b", "", "ü" * 200], "one": [7]},
    {"big": b"x" * 70_000, "ünïcode/kéy": "välue", "a/b": 1, "b": 2, "c0": 3, "B": 4, "~": 5},
    # a key that is a prefix of another: upb writes "ab" before "a" (and "" last), whatever the path
    {"a": 1, "ab": 2, "abc": b"x", "b": 3},
    {"": 1, "a": 2},
    # the general path: the same bytes (or the same error) either way
    {"f": 1.5, "fs": [0.1, 2.0], "i": 3},
    {"mixed": [1, 2.7], "s": "x"},
    {"big": 2**63, "s": "x"},
    {"neg": -(2**63) - 1},
    {"surrogate": "a\udcff"},
    {"\udcffkey": 1},
    {"bad": bytearray(b"x")},
    {"bad": object()},
    {"mixed": ["a", 1]},
    {"mixed": [1, "a"]},
]


@pytest.mark.parametrize("features", _CASES, ids=range(len(_CASES)))
def test_example_bytes_equal_the_protobuf_message(features: dict) -> None:
    try:
        expected: object = _reference_example(features)
    except Exception as e:  # noqa: BLE001 - the same error is expected
        expected = (type(e), str(e))
    try:
        got: object = examples.build_example(features)
    except Exception as e:  # noqa: BLE001
        got = (type(e), str(e))
    assert got == expected
    if isinstance(got, bytes):
        parsed = examples.parse_example(got)
        assert set(parsed) == {k for k, v in features.items() if v not in (None, [], ())}


def test_example_bytes_parse_in_tensorflow() -> None:
    tf = pytest.importorskip("tensorflow")
    record = examples.build_example({**_IMAGE_FEATURES, "neg": -3, "many": [1, 2, 3]})
    spec = {
        examples.ENCODED: tf.io.FixedLenFeature([], tf.string),
        examples.FILENAME: tf.io.FixedLenFeature([], tf.string),
        examples.HEIGHT: tf.io.FixedLenFeature([], tf.int64),
        "neg": tf.io.FixedLenFeature([], tf.int64),
        "many": tf.io.FixedLenFeature([3], tf.int64),
    }
    parsed = tf.io.parse_single_example(record, spec)
    assert parsed[examples.ENCODED].numpy() == _IMAGE_FEATURES[examples.ENCODED]
    assert parsed[examples.FILENAME].numpy().decode() == "cats/ä b.jpg"
    assert int(parsed[examples.HEIGHT]) == 480 and int(parsed["neg"]) == -3
    assert list(parsed["many"].numpy()) == [1, 2, 3]


def test_example_bytes_equal_the_protobuf_message_random() -> None:
    rng = random.Random(22)
    alphabet = "abc/_é~Z0"
    for _ in range(400):
        features: dict = {}
        for _ in range(rng.randint(0, 8)):
            key = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))
            kind = rng.choice(["bytes", "str", "int", "ints", "strs", "none"])
            value = {
                "bytes": lambda: rng.randbytes(rng.choice([0, 1, 127, 128, 20_000])),
                "str": lambda: "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300))),
                "int": lambda: rng.choice([0, 1, -1, 127, 128, 2**63 - 1, -(2**63), rng.randint(-(2**40), 2**40)]),
                "ints": lambda: [rng.randint(-(2**63), 2**63 - 1) for _ in range(rng.randint(0, 5))],
                "strs": lambda: [rng.randbytes(rng.randint(0, 3)) for _ in range(rng.randint(0, 4))],
                "none": lambda: None,
            }[kind]()
            features[key] = value
        assert examples.build_example(features) == _reference_example(features), features


def test_frames_equal_beams_tfrecord_framing() -> None:
    for record in (b"", b"x", bytes(range(256)) * 400):
        head, tail = frame_record(record)
        beam_file = io.BytesIO()
        _TFRecordUtil.write_record(beam_file, record)
        assert head + record + tail == beam_file.getvalue()


def test_shard_bytes_equal_beams_framing_of_its_records(tmp_path: Path) -> None:
    refs, _ = _images(tmp_path)
    _, written = _write_shard(tmp_path, refs)
    stream = io.BytesIO(written)
    expected = io.BytesIO()
    while (record := _TFRecordUtil.read_record(stream)) is not None:
        _TFRecordUtil.write_record(expected, record)
    assert expected.getvalue() == written and written


# ---- batches: one future per ~1 MB of local files, not per image ----------------------------------------


class _CountingPool(ThreadPoolExecutor):
    def __init__(self, threads: int) -> None:
        super().__init__(threads)
        self.submitted = 0

    def submit(self, *args: object, **kwargs: object):  # type: ignore[override]
        self.submitted += 1
        return super().submit(*args, **kwargs)


@pytest.mark.e2e
@pytest.mark.parametrize("read_inline", [False, True])
def test_batches_keep_order_budget_and_raise_at_their_item(read_inline: bool) -> None:
    budget = Budget(10_000)
    read_at: list[int] = []

    def read(i: int) -> bytes | Rejected:
        read_at.append(i)
        if i == 37:
            raise ConnectionError("transient")
        return Rejected("empty") if i % 7 == 0 else b"r" * 100

    def convert(i: int, data: bytes) -> bytes:
        if i == 90:
            raise MemoryError
        time.sleep(0.0005)  # clearly slower than a read: inline reads stay inline
        return data * 3

    with _CountingPool(4) as io_pool, _CountingPool(2) as decode_pool:
        results = read_then_convert(
            range(50), read, convert, io_pool, decode_pool,
            window=4, budget=budget, cost=lambda i: 100, size=lambda r: 0 if isinstance(r, Rejected) else len(r),
            batch_bytes=1000, read_inline=read_inline,
        )  # fmt: skip
        seen = []
        with pytest.raises(ConnectionError):
            for i, result in results:
                seen.append(i)
                assert isinstance(result, Rejected) if i % 7 == 0 else result == b"r" * 300
        assert seen == list(range(37))  # every item before the failed read, in order; none after it
        assert io_pool.submitted <= 6 and decode_pool.submitted <= 6  # batches of 10, not 50 futures each
        if read_inline:
            assert io_pool.submitted == 0  # read on the decode thread, no hand-off
        results = read_then_convert(
            range(80, 100), lambda i: b"r", convert, io_pool, decode_pool,
            window=2, budget=budget, cost=lambda i: 100, size=len, batch_bytes=1000, read_inline=read_inline,
        )  # fmt: skip
        with pytest.raises(MemoryError):
            assert [i for i, _ in results] == list(range(80, 90))
    assert _wait_for(lambda: budget.held == 0)


def test_inline_reads_go_back_to_reading_ahead_once_reads_outlast_conversions() -> None:
    """Local batches are read on the decode thread; a batch whose reads took longer than its conversions
    (a network filesystem) sends the later ones to the read pool, where they are read ahead again."""
    slow: set[int] = set(range(20, 100))
    read_on: dict[int, str] = {}

    def read(i: int) -> bytes:
        read_on[i] = threading.current_thread().name
        if i in slow:
            time.sleep(0.005)
        return b"r"

    def convert(i: int, data: bytes) -> bytes:
        time.sleep(0.001)
        return data * 2

    with ThreadPoolExecutor(4, thread_name_prefix="io") as io_pool:
        with ThreadPoolExecutor(1, thread_name_prefix="decode") as decode_pool:
            results = read_then_convert(
                range(100), read, convert, io_pool, decode_pool,
                window=2, budget=Budget(10_000), cost=lambda i: 100, batch_bytes=1000, read_inline=True,
            )  # fmt: skip
            assert [(i, r) for i, r in results] == [(i, b"rr") for i in range(100)]
    assert all(read_on[i].startswith("decode") for i in range(20))  # fast reads: no hand-off
    switched = min(i for i in range(100) if read_on[i].startswith("io"))
    assert 20 < switched <= 50  # the first slow batch (items 20-29) decided; at most two batches were in flight
    assert all(read_on[i].startswith("io") for i in range(switched, 100))


def _wait_for(check: object, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return bool(check())  # type: ignore[operator]


def test_local_shard_takes_a_decode_future_per_batch_not_per_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refs, _ = _images(tmp_path, n=24)  # ~1 KB each: one or two batches
    submitted: list[int] = []
    real_submit = ThreadPoolExecutor.submit

    def counting(self: ThreadPoolExecutor, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        if self._thread_name_prefix.startswith("beam-pipeline-decode"):
            submitted.append(1)
        return real_submit(self, *args, **kwargs)

    monkeypatch.setattr(ThreadPoolExecutor, "submit", counting)
    result, written = _write_shard(tmp_path, refs)
    assert result.records == 24 and 0 < len(submitted) <= 2
