"""Listing rules (pure functions) and the ListInputs transform on a real folder."""

from __future__ import annotations

import io
import json

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_pipeline.config import ConvertConfig, Layout
from beam_pipeline.sources.listing import ListInputs
from beam_pipeline.sources.manifest import InferColumnTypes, read_manifest_rows, value_type
from beam_pipeline.sources.rules import ListSettings, label_cell, make_ref, relative_path, skip_reason
from beam_pipeline.vocab.refs import Ref

from .conftest import BUCKET, local_pipeline, run_cli
from .imagegen import image_bytes, write

pytestmark = pytest.mark.unit

CFG = ConvertConfig(output="/out", name="ds", input="/in")


def layout(**kw) -> Layout:
    base = dict(root="/in", pattern="/in/**", manifest=None, manifest_format=None)
    base.update(kw)
    return Layout(**base)


def test_relative_path():
    assert relative_path("/in/cat/a.jpg", "/in") == "cat/a.jpg"
    assert relative_path("/in/cat/a.jpg", "/in/") == "cat/a.jpg"
    assert relative_path("gs://b/x/cat/a.jpg", "gs://b/x") == "cat/a.jpg"
    assert relative_path("/elsewhere/a.jpg", "/in") == "elsewhere/a.jpg"


@pytest.mark.parametrize(
    "relpath,check_ext,expected",
    [
        ("cat/a.jpg", True, None),
        ("cat/A.JPEG", True, None),
        ("cat/a.tiff", True, None),
        ("cat/notes.txt", True, "not_an_image_extension"),
        ("cat/notes.txt", False, None),
        ("cat/.DS_Store", True, "hidden_or_os_file"),
        ("cat/._a.jpg", True, "hidden_or_os_file"),
        (".git/x.png", True, "hidden_or_os_file"),
        ("cat/Thumbs.db", False, "hidden_or_os_file"),
    ],
)
def test_skip_reason(relpath, check_ext, expected):
    assert skip_reason(relpath, check_ext) == expected


def test_label_from_first_folder_after_optional_split_folder():
    ref = make_ref("/in/cat/x/a.jpg", "cat/x/a.jpg", 10, CFG, layout())
    assert isinstance(ref, Ref) and ref.label == "cat" and ref.split == "train"
    ref = make_ref("/in/val/dog/a.jpg", "val/dog/a.jpg", 10, CFG, layout(split_source="folders"))
    assert ref.label == "dog" and ref.split == "validation"


def test_no_label_and_no_split_are_rejects():
    assert make_ref("/in/a.jpg", "a.jpg", 10, CFG, layout())["reason"] == "no_label"
    out = make_ref("/in/misc/a.jpg", "misc/a.jpg", 10, CFG, layout(split_source="folders"))
    assert out["reason"] == "no_split"
    out = make_ref("/in/train/a.jpg", "train/a.jpg", 10, CFG, layout(split_source="folders"))
    assert out["reason"] == "no_label"


def test_labels_file_rejects_unknown_labels():
    lay = layout(labels=("dog", "cat"))
    assert make_ref("/in/cat/a.jpg", "cat/a.jpg", 1, CFG, lay).label == "cat"
    assert make_ref("/in/cow/a.jpg", "cow/a.jpg", 1, CFG, lay)["reason"] == "unknown_label"


def test_label_regex_searches_the_file_name():
    cfg = ConvertConfig(output="/o", name="d", input="/in", label_regex=r"_([a-z]+)\.png$")
    lay = layout(label_source="regex")
    assert make_ref("/in/x/123_cat.png", "x/123_cat.png", 1, cfg, lay).label == "cat"
    assert make_ref("/in/x/123.png", "x/123.png", 1, cfg, lay)["reason"] == "no_label"


def test_the_line_breaks_listed_are_exactly_those_splitlines_splits_on():
    from beam_pipeline.metadata import LINE_BREAKS

    splitting = {chr(c) for c in range(0x110000) if len(f"a{chr(c)}b".splitlines()) > 1}
    assert splitting == set(LINE_BREAKS)


@pytest.mark.parametrize("char", ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\r"])
def test_a_label_holding_a_splitlines_break_is_a_bad_label_from_every_source(char):
    """labels.txt kept 'a\x0bb': a reader splitting it with str.splitlines() saw one class more and shifted ids."""
    name = f"a{char}b"
    regex = ConvertConfig(output="/o", name="d", input="/in", label_regex=r"_(.+)\.png$")
    multi = ConvertConfig(output="/o", name="d", manifest="/in/m.jsonl", label_separator="|")
    by_source = {
        "folder": make_ref(f"/in/{name}/a.png", f"{name}/a.png", 1, CFG, layout()),
        "regex": make_ref(f"/in/1_{name}.png", f"1_{name}.png", 1, regex, layout(label_source="regex")),
        "manifest": make_ref("/in/a.png", "a.png", 1, CFG, layout(label_source="manifest"), label_value=name),
        "multi-label": make_ref(
            "/in/a.png", "a.png", 1, multi, layout(label_source="manifest"), label_value=f"cat|{name}"
        ),
        "multi-label list": make_ref(
            "/in/a.png", "a.png", 1, multi, layout(label_source="manifest"), label_value=["cat", name]
        ),
    }
    for source, out in by_source.items():
        assert isinstance(out, dict) and out["reason"] == "bad_label", source
        assert repr(char) in out["detail"] and "str.splitlines()" in out["detail"], out["detail"]


@pytest.mark.parametrize(
    ("value", "label"),
    [("cat", "cat"), (7, "7"), (-2, "-2"), (3.0, "3"), (None, None), (["a", "b"], ["a", "b"])],
)
def test_a_jsonl_whole_number_label_is_its_digits(value, label):
    """Numbers are read as their text (docs/input.md); 3.0 (pandas writes a whole-number column with a gap so)
    is the class 3, as 3 is."""
    assert label_cell(value) == label


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (True, "the label is true, a JSON true/false, not text"),
        (False, "the label is false"),
        (float("nan"), "the label is NaN, a JSON number that is not a whole number"),
        (float("inf"), "the label is Infinity"),
        (2.5, "the label is 2.5"),
        ({"x": 1}, "JSON object"),
    ],
)
def test_a_jsonl_label_that_is_not_text_is_a_bad_label(value, words):
    """true and NaN became the classes 'True' and 'nan'."""
    lay = layout(label_source="manifest")
    out = make_ref("/in/a.png", "a.png", 1, CFG, lay, label_value=label_cell(value))
    assert isinstance(out, dict) and out["reason"] == "bad_label" and words in out["detail"], out
    multi = ConvertConfig(output="/o", name="d", manifest="/in/m.jsonl", label_separator="|")
    assert make_ref("/in/a.png", "a.png", 1, multi, lay, label_value=label_cell(value))["reason"] == "bad_label"


def test_unlabelled_run_has_no_labels():
    ref = make_ref("/in/a.jpg", "a.jpg", 1, CFG, layout(label_source="none"))
    assert ref.label is None


def test_split_ratios_ignore_the_seed():
    ratios = (("train", 0.5), ("test", 0.5))
    lay = layout(split_source="ratios", label_source="none")
    for seed in (0, 1, 99):
        cfg = ConvertConfig(output="/o", name="d", input="/in", split_ratios=ratios, seed=seed)
        splits = [make_ref(f"/in/{i}.jpg", f"{i}.jpg", 1, cfg, lay).split for i in range(50)]
        if seed == 0:
            first = splits
        assert splits == first
    assert set(first) == {"train", "test"}


def test_manifest_split_column():
    lay = layout(split_source="manifest", label_source="manifest")
    ref = make_ref("/in/a.jpg", "a.jpg", 1, CFG, lay, label_value="cat", split_value="val")
    assert (ref.split, ref.label) == ("validation", "cat")
    assert make_ref("/in/a.jpg", "a.jpg", 1, CFG, lay, label_value="cat", split_value="")["reason"] == "no_split"
    assert make_ref("/in/a.jpg", "a.jpg", 1, CFG, lay, label_value=" ", split_value="train")["reason"] == "no_label"


def test_csv_manifest_rows_bom_quotes_blank_lines():
    text = '\ufeffpath,label,note\n"a, b.jpg",cat,"x, y"\n\n,,\nc.jpg,dog,z\n'
    stream = io.StringIO(text.encode("utf-8").decode("utf-8-sig"))
    rows = list(read_manifest_rows(stream, "csv"))
    assert rows == [
        {"path": "a, b.jpg", "label": "cat", "note": "x, y"},
        {"path": "c.jpg", "label": "dog", "note": "z"},
    ]


def test_jsonl_manifest_rows():
    rows = list(read_manifest_rows(io.StringIO('{"path": "a.jpg", "n": 3}\n\n{"path": "b.jpg"}\n'), "jsonl"))
    assert rows == [{"path": "a.jpg", "n": 3}, {"path": "b.jpg"}]
    with pytest.raises(ValueError, match="line 2"):
        list(read_manifest_rows(io.StringIO('{"path": "a.jpg"}\n[1]\n'), "jsonl"))


@pytest.mark.e2e
def test_jsonl_manifest_line_with_half_a_surrogate_pair_is_an_error_naming_the_line(tmp_path):
    """JSON lets a string escape half of a UTF-16 pair (a caption cut inside an emoji); no UTF-8 text
    holds it, and the run died with "'utf-8 [while running 'List/ReadManifest']' codec can't encode"."""
    text = '{"path": "a.jpg", "caption": "ok \\ud83d\\ude00"}\n{"path": "b.jpg", "caption": "cut \\ud83d"}\n'
    with pytest.raises(ValueError, match="line 2: .*surrogate"):
        list(read_manifest_rows(io.StringIO(text), "jsonl"))
    assert next(read_manifest_rows(io.StringIO(text), "jsonl"))["caption"] == "ok \U0001f600"  # a whole pair is fine
    manifest = tmp_path / "list.jsonl"
    manifest.write_text(text)
    write(str(tmp_path / "a.jpg"), image_bytes("jpeg"))
    write(str(tmp_path / "b.jpg"), image_bytes("jpeg"))
    result = run_cli("convert", "--manifest", str(manifest), "--output", str(tmp_path / "out"), "--labels-from", "none")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "manifest line 2" in result.stderr and "surrogate" in result.stderr, result.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("depth", [100_000, 900], ids=["deeper-than-json-loads", "json-loads-reads-it"])
@pytest.mark.parametrize("line", [2, 150], ids=["launcher-look", "in-pipeline"])
def test_a_jsonl_line_nested_too_deep_is_an_error_naming_the_line(tmp_path, line, depth):
    """200 KB of brackets (deeper than json.loads goes) used to crash the launcher with a RecursionError
    traceback; 900 levels json.loads reads, but Beam's coders pickle a row recursively, so the job failed "while
    pickling an object": both named neither the line nor the manifest."""
    for i in range(1, 200):
        write(str(tmp_path / f"{i}.jpg"), image_bytes("jpeg", height=8, width=8))
    rows = [json.dumps({"path": f"{i}.jpg", "n": i}) for i in range(1, 200)]
    rows[line - 1] = f'{{"path": "{line}.jpg", "x": ' + "[" * depth + "]" * depth + "}"
    with pytest.raises(ValueError, match=f"line {line}: JSON nested deeper"):
        list(read_manifest_rows(io.StringIO("\n".join(rows) + "\n"), "jsonl"))
    manifest = tmp_path / "list.jsonl"
    manifest.write_text("\n".join(rows) + "\n")
    result = run_cli("convert", "--manifest", str(manifest), "--output", str(tmp_path / "out"), "--labels-from", "none")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    [message] = [m for m in result.stderr.splitlines() if m.startswith("error:")]
    assert f"manifest line {line}: JSON nested deeper" in message, result.stderr
    assert not (tmp_path / "out" / "_SUCCESS").exists()


@pytest.mark.parametrize(
    "value,kind",
    [
        ("12", "int"),
        (" -3 ", "int"),
        ("1.5", "float"),
        ("1e3", "float"),
        ("nan", "string"),
        ("abc", "string"),
        (2, "int"),
        (2.5, "float"),
    ],
)
def test_value_type(value, kind):
    assert value_type(value) == kind


@pytest.mark.pipeline
def test_column_types_widen_over_rows():
    refs = [
        Ref("/a", "a", 1, "train", None, 0, (("n", "1"), ("x", "1"), ("s", "a"))),
        Ref("/b", "b", 1, "train", None, 0, (("n", "2"), ("x", "2.5"), ("s", "3"))),
    ]
    with local_pipeline() as p:
        types = p | beam.Create(refs) | beam.CombineGlobally(InferColumnTypes())
        assert_that(types, equal_to([{"n": "int", "s": "string", "x": "float"}]))


@pytest.mark.pipeline
def test_list_inputs_transform(tmp_path):
    root = tmp_path / "in"
    write(str(root / "cat" / "a.jpg"), image_bytes("jpeg"))
    write(str(root / "dog" / "b b.png"), image_bytes("png"))
    write(str(root / "loose.jpg"), image_bytes("jpeg"))
    write(str(root / "dog" / "notes.txt"), b"x")
    write(str(root / "dog" / ".DS_Store"), b"x")
    (root / "dog" / "folder.jpg").mkdir()
    (root / "dog" / "gone.png").symlink_to(root / "nowhere.png")
    lay = layout(root=str(root), pattern=str(root / "**"))
    cfg = ConvertConfig(output=str(tmp_path / "out"), name="d", input=str(root))
    with local_pipeline() as p:
        listed = p | ListInputs(ListSettings.of(cfg), lay)
        assert_that(
            listed["refs"] | "Rel" >> beam.Map(lambda r: (r.relpath, r.label, r.split)),
            equal_to([("cat/a.jpg", "cat", "train"), ("dog/b b.png", "dog", "train")]),
            label="Refs",
        )
        assert_that(
            listed["rejects"] | "Reason" >> beam.Map(lambda r: (r["path"], r["reason"])),
            equal_to(
                [
                    (str(root / "loose.jpg"), "no_label"),
                    (str(root / "dog" / "folder.jpg"), "unreadable"),
                    (str(root / "dog" / "gone.png"), "unreadable"),
                ]
            ),
            label="Rejects",
        )
        assert_that(listed["skipped"], equal_to(["not_an_image_extension", "hidden_or_os_file"]), label="Skipped")


# ---- folder listing fanned out: the same files and odd entries as one MatchAll ----


def _messy_tree(root) -> None:
    """Files at every depth, linked and odd entries at every level, names with glob characters."""
    import os

    write(str(root / "top.jpg"), b"1")
    write(str(root / ".hidden.jpg"), b"22")
    write(str(root / "a[1].jpg"), b"333")
    (root / "root-dir.jpg").mkdir()
    os.symlink(str(root / "nowhere.png"), str(root / "dangling-top.png"))
    for depth in range(1, 6):
        folder = root.joinpath(*[f"d{i}[x]" if i == 2 else f"d{i}" for i in range(1, depth + 1)])
        write(str(folder / f"f{depth}.png"), b"x" * depth)
        write(str(folder / "notes.txt"), b"t")
        (folder / f"sub{depth}.jpg").mkdir()
        (folder / "empty").mkdir()
        os.symlink(str(folder / "gone.jpg"), str(folder / f"dangling{depth}.jpg"))
        os.symlink(str(root / "d1"), str(folder / f"link{depth}.jpg"))  # a linked folder: not descended
    write(str(root / ".git" / "objects" / "x.png"), b"h")
    write(str(root / "wide" / "b" / "c.gif"), b"gif")
    latin1 = os.fsdecode(str(root).encode() + b"/caf\xe9")  # a folder name that is not UTF-8
    write(os.path.join(latin1, "x.jpg"), b"xx")
    write(os.path.join(latin1, "sub", "y.jpg"), b"yy")
    write(os.path.join(latin1, "sub", "deeper", "z.jpg"), b"zz")


@pytest.mark.pipeline
@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_fanned_out_folder_listing_equals_one_match(tmp_path, depth):
    from apache_beam.io.filesystems import FileSystems

    from beam_pipeline.sources.folders import FILES, ListFolder, _OddLocalEntries
    from beam_pipeline.sources.rules import REJECTS

    root = tmp_path / "in"
    _messy_tree(root)
    pattern = str(root / "**")

    # what the listing was before: one match of root/** and one walk for the odd entries
    def as_bytes(m):  # paths that are not UTF-8 compare as bytes (Beam's coders refuse such text)
        return m.path.encode("utf-8", "surrogateescape"), m.size_in_bytes

    expected_files = [as_bytes(m) for m in FileSystems.match([pattern])[0].metadata_list]
    expected_odd = list(_OddLocalEntries(layout(root=str(root), pattern=pattern)).process(pattern))
    assert len(expected_files) == 15 + 3 and len(expected_odd) == 2 + 5 * 3
    with local_pipeline() as p:
        fanned = p | ListFolder(str(root), depth=depth)
        files = fanned[FILES] | "Paths" >> beam.Map(lambda listed: listed[:2])
        assert_that(files, equal_to(expected_files), label="SameFiles")
        assert_that(fanned[REJECTS], equal_to(expected_odd), label="SameOddEntries")


@pytest.mark.pipeline
def test_fanned_out_gcs_listing_equals_one_match(gcs):
    from apache_beam.io.filesystems import FileSystems

    from beam_pipeline.run.workers import use_anonymous_gcs_for_emulator
    from beam_pipeline.sources.folders import FILES, ListFolder

    use_anonymous_gcs_for_emulator()
    bucket = gcs.bucket(BUCKET)
    names = ["top.jpg", "a[1].jpg", "d1/", "d1/x.png", "d1/d2/y.png", "d1/d2/d3/z.png", "d1/d2/d3/d4/w.png",
             "e/f/g.jpg", "e/.hidden/h.jpg", "e/notes.txt"]  # fmt: skip
    for i, name in enumerate(names):
        bucket.blob(f"fan/in/{name}").upload_from_string(b"x" * (i + 1))
    bucket.blob("fan/inside-not.jpg").upload_from_string(b"not under fan/in/")
    root = f"gs://{BUCKET}/fan/in"
    expected = [(m.path, m.size_in_bytes) for m in FileSystems.match([root + "/**"])[0].metadata_list]
    assert len(expected) == len(names)
    for depth in (0, 1, 2):
        with local_pipeline() as p:
            files = (p | ListFolder(root, depth=depth))[FILES]
            paths = files | "Paths" >> beam.Map(lambda listed: (listed[0].decode(), listed[1]))
            assert_that(paths, equal_to(expected))
    # the whole bucket as the input root
    everything = [(m.path, m.size_in_bytes) for m in FileSystems.match([f"gs://{BUCKET}/**"])[0].metadata_list]
    for depth in (0, 2):
        with local_pipeline() as p:
            files = (p | ListFolder(f"gs://{BUCKET}", depth=depth))[FILES]
            paths = files | "Paths" >> beam.Map(lambda listed: (listed[0].decode(), listed[1]))
            assert_that(paths, equal_to(everything))


@pytest.mark.pipeline
def test_manifest_paths_with_glob_characters_are_stat_literally(tmp_path):
    root = tmp_path / "in"
    for name, size in [("a[1].jpg", 3), ("a1.jpg", 5), ("b*.jpg", 7), ("bb.jpg", 11), ("c?.jpg", 13), ("cc.jpg", 17)]:
        write(str(root / name), b"x" * size)
    manifest = root / "list.csv"
    # and rows in stores other than GCS: their own reject (they were taken for gs:// paths)
    manifest.write_text("path,label\na[1].jpg,x\nb*.jpg,x\nc?.jpg,x\nd[2].jpg,x\ns3://b/e.jpg,x\nhttps://h/f.jpg,x\n")
    lay = Layout(root=str(root), pattern=None, manifest=str(manifest), manifest_format="csv", label_source="manifest")
    with local_pipeline() as p:
        listed = p | ListInputs(ListSettings.of(CFG), lay)
        sizes = listed["refs"] | "Sizes" >> beam.Map(lambda r: (r.relpath, r.size))
        assert_that(sizes, equal_to([("a[1].jpg", 3), ("b*.jpg", 7), ("c?.jpg", 13)]), label="Refs")
        reasons = listed["rejects"] | "Reasons" >> beam.Map(lambda r: (r["path"], r["reason"], r["detail"][:17]))
        expected = [
            (str(root / "d[2].jpg"), "missing", "file does not exi"),
            ("s3://b/e.jpg", "unsupported_location", "s3:// is not read"),
            ("https://h/f.jpg", "unsupported_location", "https:// is not r"),
        ]
        assert_that(reasons, equal_to(expected), label="Rejects")


@pytest.mark.pipeline
def test_gcs_manifest_paths_with_glob_characters_are_stat_literally(gcs):
    from beam_pipeline.run.workers import use_anonymous_gcs_for_emulator

    use_anonymous_gcs_for_emulator()
    bucket = gcs.bucket(BUCKET)
    for name, size in [("a[1].jpg", 3), ("a1.jpg", 5), ("b*.jpg", 7), ("c?.jpg", 13), ("cc.jpg", 17)]:
        bucket.blob(f"lit/{name}").upload_from_string(b"x" * size)
    bucket.blob("lit/list.csv").upload_from_string("path\na[1].jpg\nb*.jpg\nc?.jpg\nd[2].jpg\n")
    root = f"gs://{BUCKET}/lit"
    lay = Layout(root=root, pattern=None, manifest=f"{root}/list.csv", manifest_format="csv", label_source="none")
    with local_pipeline() as p:
        listed = p | ListInputs(ListSettings.of(CFG), lay)
        sizes = listed["refs"] | "Sizes" >> beam.Map(lambda r: (r.relpath, r.size))
        assert_that(sizes, equal_to([("a[1].jpg", 3), ("b*.jpg", 7), ("c?.jpg", 13)]), label="Refs")
        reasons = listed["rejects"] | "Reasons" >> beam.Map(lambda r: (r["path"], r["reason"], r["detail"]))
        assert_that(reasons, equal_to([(f"{root}/d[2].jpg", "missing", "file does not exist")]), label="Rejects")


@pytest.mark.e2e
def test_convert_keeps_manifest_files_whose_names_look_like_globs(tmp_path):
    """End to end: a[1].jpg exists and becomes a record (it used to be matched as a pattern: `missing`)."""
    from .conftest import convert, read_records

    root = tmp_path / "in"
    names = ["a[1].jpg", "b*.png", "c?.jpg", "plain.jpg"]
    for i, name in enumerate(names):
        write(str(root / name), image_bytes("png" if name.endswith("png") else "jpeg", seed=i))
    write(str(root / "a1.jpg"), image_bytes("jpeg", seed=99))  # what the pattern a[1].jpg would have matched
    (root / "list.csv").write_text("path,label\n" + "".join(f"{n},x\n" for n in names))
    out = tmp_path / "out"
    convert("--manifest", str(root / "list.csv"), "--output", str(out))
    rows = read_records(out)
    assert sorted(r["image/filename"].decode() for r in rows) == sorted(names)
    assert (out / "rejects.jsonl").read_text() == ""


def test_only_transient_stat_errors_fail_the_bundle():
    """A busy or unreachable server is retried by the runner; anything else about a row is a reject."""
    from apache_beam.io.filesystem import BeamIOError
    from google.api_core import exceptions as gexc

    from beam_pipeline.sources.manifest import is_transient

    for error in (gexc.ServiceUnavailable("busy"), gexc.TooManyRequests("slow down"), ConnectionResetError()):
        assert is_transient(error)
        assert is_transient(BeamIOError("Metadata operation failed", {"gs://b/x.jpg": error}))
    for error in (gexc.NotFound("gone"), gexc.Forbidden("no"), ValueError("bad path")):
        assert not is_transient(error)
        assert not is_transient(BeamIOError("Metadata operation failed", {"gs://b/x.jpg": error}))


# ---- manifest columns over every row; duplicate rows -------------------------


def _check_manifest(tmp_path, name: str, text: str, refs: list, rejects: list, **flags) -> None:
    """The refs ((relpath, split, label)) and rejects ((relpath, reason)) ListInputs makes of a manifest,
    laid out by the launcher's pre-flight as a run would be."""
    from beam_pipeline.run.preflight import prepare

    manifest = tmp_path / name
    manifest.write_text(text)
    cfg, lay = prepare(ConvertConfig(output=str(tmp_path / "out"), name="d", manifest=str(manifest), **flags))
    root = str(tmp_path)
    with local_pipeline() as p:
        listed = p | ListInputs(ListSettings.of(cfg), lay)
        assert_that(listed["refs"] | "R" >> beam.Map(lambda r: (r.relpath, r.split, r.label)), equal_to(refs))
        assert_that(
            listed["rejects"] | "J" >> beam.Map(lambda r: (relative_path(r["path"], root), r["reason"])),
            equal_to(rejects),
            label="Rejects",
        )


@pytest.mark.pipeline
def test_jsonl_split_column_is_any_rows_whatever_the_order(tmp_path):
    """105 rows without a split then 5 with one (and the reverse): a split column, the 105 no_split rejects."""
    import json

    for i in range(110):
        write(str(tmp_path / f"{i:03d}.jpg"), b"x")
    bare = [{"path": f"{i:03d}.jpg", "label": "a"} for i in range(105)]
    split = [{"path": f"{i:03d}.jpg", "label": "a", "split": "val"} for i in range(105, 110)]
    for rows in (bare + split, split + bare):
        text = "".join(json.dumps(r) + "\n" for r in rows)
        refs = [(f"{i:03d}.jpg", "validation", "a") for i in range(105, 110)]
        _check_manifest(tmp_path, "list.jsonl", text, refs, [(f"{i:03d}.jpg", "no_split") for i in range(105)])


@pytest.mark.pipeline
def test_csv_empty_label_and_split_cells_are_rejects(tmp_path):
    for name in ("a.jpg", "b.jpg", "c.jpg"):
        write(str(tmp_path / name), b"x")
    text = "path,label,split\na.jpg,cat,train\nb.jpg,,train\nc.jpg,dog,\n"
    _check_manifest(
        tmp_path, "list.csv", text, [("a.jpg", "train", "cat")], [("b.jpg", "no_label"), ("c.jpg", "no_split")]
    )


@pytest.mark.pipeline
def test_duplicate_rows_keep_the_first_by_canonical_json(tmp_path):
    """One file in three rows, spelt two ways: one ref, two duplicate_row rejects, whatever the order."""
    import json

    for name in ("a.jpg", "b.jpg"):
        write(str(tmp_path / name), b"x")
    rows = [
        {"path": "a.jpg", "label": "dog"},
        {"path": "./a.jpg", "label": "cow"},
        {"path": str(tmp_path / "a.jpg"), "label": "ant"},  # kept: '{"label":"ant"' sorts first
        {"path": "b.jpg", "label": "cat"},
        {"label": "cat"},  # no path: missing, never a duplicate of another row without one
        {"label": "dog"},
    ]
    for ordered in (rows, rows[::-1]):
        text = "".join(json.dumps(r) + "\n" for r in ordered)
        refs = [("a.jpg", "train", "ant"), ("b.jpg", "train", "cat")]
        rejects = [("", "missing"), ("", "missing"), ("./a.jpg", "duplicate_row"), ("a.jpg", "duplicate_row")]
        _check_manifest(tmp_path, "list.jsonl", text, refs, rejects)


@pytest.mark.pipeline
def test_gcs_jsonl_manifest_labels_and_duplicate_rows_over_every_row(gcs, tmp_path):
    """The same over a gs:// manifest: the launcher reads its first rows only, the job every row."""
    import json

    from beam_pipeline.run.preflight import prepare
    from beam_pipeline.run.workers import use_anonymous_gcs_for_emulator

    use_anonymous_gcs_for_emulator()
    bucket = gcs.bucket(BUCKET)
    for i in range(103):
        bucket.blob(f"late/{i:03d}.jpg").upload_from_string(b"x")
    rows = [{"path": f"{i:03d}.jpg"} for i in range(101)]
    rows += [{"path": "101.jpg", "label": "owl"}, {"path": "102.jpg", "label": "cat"}]
    rows += [{"path": "102.jpg", "label": "ant"}]  # kept over "cat"
    bucket.blob("late/list.jsonl").upload_from_string("".join(json.dumps(r) + "\n" for r in rows))
    root = f"gs://{BUCKET}/late"
    cfg, lay = prepare(
        ConvertConfig(output=str(tmp_path / "out"), name="d", manifest=f"{root}/list.jsonl"), check_output=False
    )
    assert lay.label_source == "none"  # the first look: the job decides
    with local_pipeline() as p:
        listed = p | ListInputs(ListSettings.of(cfg), lay)
        refs = listed["refs"] | "Refs" >> beam.Map(lambda r: (r.relpath, r.label))
        assert_that(refs, equal_to([("101.jpg", "owl"), ("102.jpg", "ant")]), label="Refs")
        reasons = listed["rejects"] | "Reasons" >> beam.Map(lambda r: (relative_path(r["path"], root), r["reason"]))
        expected = [(f"{i:03d}.jpg", "no_label") for i in range(101)] + [("102.jpg", "duplicate_row")]
        assert_that(reasons, equal_to(expected), label="Rejects")
        assert_that(listed["sources"], equal_to([("default", "manifest")]), label="Sources")


def test_a_csv_field_over_the_limit_names_its_line_and_the_limit_is_far_above_csvs_default():
    """csv's default field limit (128 KB) failed runs on one long caption with csv.Error, naming no line; the
    limit is now MAX_CSV_FIELD, and a field beyond it is a ValueError naming the line (a one-line error)."""
    import csv

    from beam_pipeline.sources import manifest

    assert csv.field_size_limit() == manifest.MAX_CSV_FIELD >= 64 << 20
    text = "path,label\na.jpg,cat\nb.jpg," + "x" * 2000 + "\n"
    assert [len(r["label"]) for r in read_manifest_rows(io.StringIO(text), "csv")] == [3, 2000]
    try:
        csv.field_size_limit(1000)  # a field over the limit, without a 64 MB file
        with pytest.raises(ValueError, match="manifest line 3: "):
            list(read_manifest_rows(io.StringIO(text), "csv"))
    finally:
        csv.field_size_limit(manifest.MAX_CSV_FIELD)


@pytest.mark.parametrize(
    ("text", "want"),
    [("00000000000000000001", "int"), ("+0000000000000000000001", "int"), ("-9223372036854775808", "int"),
     ("9223372036854775808", "float"), ("1" * 5000, "float"), ("12a", "string")],
)  # fmt: skip
def test_value_type_counts_digits_without_leading_zeros_and_never_calls_int_on_thousands(text, want):
    """Zero-padded codes stay an int column; 5,000 digits (beyond what int() reads) are a float column, not a crash."""
    from beam_pipeline.sources.manifest import value_type

    assert value_type(text) == want


def test_a_file_or_folder_a_worker_does_not_see_is_one_line_naming_its_flag(tmp_path):
    """A cluster's worker without the launcher's disk: the COCO file, manifest, VOC or mask folder it cannot see
    is named with its flag, as an input folder is (a COCO file was a worker's FileNotFoundError traceback)."""
    from beam_pipeline import storage
    from beam_pipeline.errors import UsageError

    gone = str(tmp_path / "gone")
    for flag in ("--coco", "--manifest"):
        with pytest.raises(UsageError, match=f"^{flag} {gone}: no such file on the worker that reads it"):
            storage.open_input(gone, flag)
    with pytest.raises(UsageError, match=f"^--voc {gone}: no such folder on the worker that lists it .*every worker"):
        storage.check_folder_on_worker(gone, "--voc")
    assert storage.check_folder_on_worker(str(tmp_path), "--voc") == str(tmp_path)


@pytest.mark.pipeline
def test_a_mask_folder_a_worker_does_not_see_names_masks_not_input(tmp_path):
    from beam_pipeline.errors import UsageError
    from beam_pipeline.sources.folders import ListFolder

    with pytest.raises(UsageError, match="^--masks .*: no such folder on the worker that lists it"):
        with local_pipeline() as p:
            _ = p | ListFolder(str(tmp_path / "gone"), flag="--masks")
