"""What a user sees: the summary's lines, split-name typos, the flat-folder hint, Ctrl-C, --help."""

from __future__ import annotations

import glob
import json
import signal
import subprocess
import sys
import time

import pytest
from PIL import Image

from beam_pipeline.cli import parse_convert
from beam_pipeline.config import parse_split_ratios
from beam_pipeline.errors import UsageError

from .conftest import REPO, convert, load_info, run_cli
from .imagegen import encode, image_bytes, pixels, write
from .test_cli import _one_line_error
from .test_incremental import make_images

pytestmark = pytest.mark.e2e

QUICK = ["--no-transform", "--no-tfds-metadata"]


def summary_lines(stdout: str, key: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(f"  {key}")]


# --- the summary ------------------------------------------------------------------


def test_summary_and_inspect_say_what_was_converted_into_what(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    write(str(src / "cat" / "cmyk.jpg"), encode(Image.fromarray(pixels(30, 40, 7), "RGB").convert("CMYK"), "JPEG"))
    write(str(src / "cat" / "plain.jpg"), image_bytes("jpeg"))
    write(str(src / "dog" / "scan.tiff"), image_bytes("tiff"))
    result = convert("--input", str(src), "--output", str(out))
    assert load_info(out)["converted"] == {"jpeg": 1, "tiff": 1}
    assert summary_lines(result.stdout, "converted") == ["  converted           2 stored as PNG (from jpeg 1, tiff 1)"]
    shown = run_cli("inspect", str(out)).stdout
    assert "converted: 2 stored as PNG (from jpeg 1, tiff 1)" in shown
    assert "converted to PNG/JPEG" not in shown

    again = convert("--input", str(src), "--output", str(tmp_path / "jpeg"), "--reencode", "jpeg:90")
    assert summary_lines(again.stdout, "converted") == [
        "  converted           3 stored as JPEG (from jpeg 2, tiff 1)"  # --reencode re-encodes every image
    ]
    nothing = convert(
        "--input", str(src), "--output", str(tmp_path / "none"), "--on-unsupported", "reject",
        "--max-reject-fraction", "1",
    )  # fmt: skip
    assert summary_lines(nothing.stdout, "converted") == []


def test_summary_shows_what_an_incremental_run_reused(tmp_path):
    src, first, second = tmp_path / "src", tmp_path / "first", tmp_path / "second"
    make_images(src, {"cat": 5, "dog": 5})
    convert("--input", str(src), "--output", str(first), "--target-shard-mb", "0.004")
    make_images(src, {"cat": 2}, start=50)  # two added
    (src / "dog" / "dog_000.png").unlink()  # one dropped
    result = convert(
        "--input", str(src), "--output", str(second), "--target-shard-mb", "0.004", "--incremental-from", str(first)
    )
    inc = load_info(second)["incremental"]
    assert (inc["reused"], inc["converted"], inc["added"], inc["dropped"]) == (9, 2, 2, 1)
    assert summary_lines(result.stdout, "incremental") == [
        "  incremental  reused 9 records, converted 2 (files: unchanged 9, added 2, changed 0, dropped 1)"
    ]
    assert f"\n               from {first}\n" in result.stdout


def test_summary_shows_the_shards_a_rerun_resumed(tmp_path, monkeypatch):
    from .test_resume import ARGS, killed_run, make_source

    src, out = tmp_path / "src", tmp_path / "out"
    make_source(src)
    killed_run(src, out, monkeypatch, "writer.result:3:kill", *QUICK)
    result = convert("--input", str(src), "--output", str(out), *ARGS)
    resumed = load_info(out)["resumed"]
    assert resumed["shards"] == 3
    assert summary_lines(result.stdout, "resumed") == [
        f"  resumed      3 shards ({resumed['records']} records) from an earlier run that did not finish"
    ]


# --- split names --------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    "spec,hint",
    [
        ("train=0.8,valid=0.2", "did you mean validation?"),
        ("train=0.8,tset=0.2", "did you mean test?"),
        ("training=0.8,test=0.2", "did you mean train?"),
        ("train=0.5,holdout=0.5", "train, validation (or val), test"),
    ],
)
def test_split_ratios_outside_the_usual_names_need_allow_split_names(spec, hint):
    with pytest.raises(UsageError, match="--allow-split-names") as caught:
        parse_split_ratios(spec)
    assert hint in str(caught.value)
    assert dict(parse_split_ratios(spec, allow_any_name=True)).keys() == {p.split("=")[0] for p in spec.split(",")}
    cfg, _, _ = parse_convert(["--input", "i", "--output", "o", "--split-ratios", spec, "--allow-split-names"])
    assert cfg.allow_split_names and len(cfg.split_ratios) == 2
    # "all" means every split to TFDS, and shard names split on "-": never a split name
    for bad in ("all=1", "a-b=1", "train.x=1"):
        with pytest.raises(UsageError):
            parse_split_ratios(bad, allow_any_name=True)


def test_a_misspelt_split_ratio_is_one_line_exit_2_and_writes_nothing(tmp_path):
    src = tmp_path / "src"
    make_images(src, {"cat": 2})
    out = tmp_path / "out"
    result = run_cli("convert", "--input", str(src), "--output", str(out), "--split-ratios", "train=0.8,valid=0.2")
    _one_line_error(result, "--split-ratios", "valid", "did you mean validation?", "--allow-split-names")
    assert not out.exists()


def test_a_misspelt_split_in_a_manifest_row_is_a_reject_not_a_split(tmp_path, tf):
    make_images(tmp_path / "img", {"cat": 4})
    rows = ["path,split"] + [
        f"img/cat/cat_{i:03d}.png,{split}" for i, split in enumerate(["train", "val", "tset", "test"])
    ]
    manifest = tmp_path / "m.csv"
    manifest.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    result = convert("--manifest", str(manifest), "--output", str(out), "--max-reject-fraction", "1", *QUICK)
    info = load_info(out)
    assert set(info["splits"]) == {"train", "validation", "test"}
    [reject] = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert reject["path"] == "img/cat/cat_002.png" and reject["reason"] == "bad_split"
    assert "'tset'" in reject["detail"] and "did you mean test?" in reject["detail"]
    assert "--allow-split-names" in reject["detail"]
    assert "bad_split 1" in result.stdout

    allowed = tmp_path / "allowed"
    convert("--manifest", str(manifest), "--output", str(allowed), "--allow-split-names", *QUICK)
    assert set(load_info(allowed)["splits"]) == {"train", "validation", "test", "tset"}
    assert load_info(allowed)["rejects"]["total"] == 0


@pytest.mark.pipeline
def test_manifest_splits_differing_only_in_case_stop_the_run_before_anything_is_published(tmp_path):
    """Train and train (with --allow-split-names) wrote shard files that are one file on macOS or Windows. The
    rows are read inside the job; the shard plan stops it with a usage error before any shard is written."""
    from beam_pipeline.run.convert import run_convert

    make_images(tmp_path / "img", {"cat": 2})
    manifest = tmp_path / "m.csv"
    manifest.write_text("path,split\nimg/cat/cat_000.png,Train\nimg/cat/cat_001.png,train\n")
    out = tmp_path / "out"
    cfg, flags, _ = parse_convert(["--manifest", str(manifest), "--output", str(out), "--allow-split-names", *QUICK])
    with pytest.raises(UsageError, match="^--manifest split column: splits 'Train' and 'train' differ only in case"):
        run_convert(cfg, flags)
    assert not glob.glob(str(out / "*"))  # no shard, no _SUCCESS: only the run's hidden scratch folder


# --- a flat folder ------------------------------------------------------------------


def test_a_flat_folder_says_labels_from_none_before_writing_anything(tmp_path):
    flat = tmp_path / "flat"
    for i in range(6):
        write(str(flat / f"{i}.jpg"), image_bytes("jpeg", seed=i))
    hint = f"files directly in {flat} have no class folder: pass --labels-from none for an unlabelled dataset"
    for given in (str(flat), str(flat / "*.jpg")):
        out = tmp_path / f"out{len(given)}"
        result = run_cli("convert", "--input", given, "--output", str(out), *QUICK)
        _one_line_error(result, hint)
        assert not out.exists()  # found before the pipeline: nothing written
    plan = run_cli("plan", "--input", str(flat), "--output", str(tmp_path / "p"))
    _one_line_error(plan, hint)
    done = convert("--input", str(flat), "--output", str(tmp_path / "unlabelled"), "--labels-from", "none")
    assert "6 examples" in done.stdout


def test_a_flat_gcs_prefix_gets_the_hint_too(gcs, tmp_path):
    from .conftest import BUCKET

    for i in range(3):
        gcs.bucket(BUCKET).blob(f"flat/{i}.jpg").upload_from_string(image_bytes("jpeg", seed=i))
    result = run_cli("convert", "--input", f"gs://{BUCKET}/flat", "--output", str(tmp_path / "out"), "--no_auth")
    _one_line_error(result, f"files directly in gs://{BUCKET}/flat have no class folder: pass --labels-from none")
    assert not (tmp_path / "out").exists()


def test_all_no_label_rejects_found_by_the_run_get_the_hint_too(tmp_path):
    """A sub-folder (here an empty one) makes the folder not flat up front; the run's verdict still hints."""
    flat = tmp_path / "flat"
    for i in range(3):
        write(str(flat / f"{i}.jpg"), image_bytes("jpeg", seed=i))
    (flat / "empty").mkdir()
    result = run_cli("convert", "--input", str(flat), "--output", str(tmp_path / "out"), *QUICK)
    assert result.returncode == 3, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "no image was converted (3 rejected: no_label 3" in line
    assert line.endswith("files directly in the input have no class folder: pass --labels-from none")


# --- Ctrl-C -------------------------------------------------------------------------

# The conversion, slowed down so that it is surely running when the SIGINT comes.
SLOW_CONVERT = """
import sys, time
from beam_pipeline.writer import records
real = records.prepare_image
def slow(*args, **kwargs):
    time.sleep(0.3)
    return real(*args, **kwargs)
records.prepare_image = slow
from beam_pipeline.cli import console_main
sys.argv = ["beam-pipeline", *sys.argv[1:]]
console_main()
"""


def test_ctrl_c_exits_130_with_one_line_and_the_same_command_resumes(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_images(src, {"cat": 20, "dog": 20})
    args = ["convert", "--input", str(src), "--output", str(out), "--target-shard-mb", "0.004", *QUICK]
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_CONVERT, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a shell's background job ignores SIGINT; the user's terminal does not
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        for _ in range(1200):  # a shard writer has started: its temp shard is in the scratch folder
            if glob.glob(str(out / ".beam_pipeline-tmp-*" / "*.tfrecord")) or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert stderr == "interrupted: run the same command again to resume\n"
    assert stdout == ""
    assert not (out / "_SUCCESS").exists()
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr
    assert (out / "_SUCCESS").exists() and load_info(out)["examples"] == 40


# --- --help -------------------------------------------------------------------------


def _groups() -> dict[str, list[str]]:
    from beam_pipeline.cli import _convert_parser

    return {
        g.title: [a.option_strings[-1] for a in g._group_actions]  # noqa: SLF001
        for g in _convert_parser()._action_groups  # noqa: SLF001
    }


def test_help_groups_reruns_and_describes_the_sinks_as_they_are():
    groups = _groups()
    assert groups["reruns"] == [
        "--incremental-from",
        "--change-share",
        "--max-class-drop",
        "--no-resume",
        "--overwrite",
        "--run-date",
        "--keep-last",
    ]
    assert "--incremental-from" not in groups["labels and splits"]
    assert "--allow-split-names" in groups["labels and splits"]
    text = " ".join(run_cli("convert", "--help").stdout.split())
    assert "for Dataflow" not in text
    assert "planned: bounded memory, everywhere (Dataflow too)" in text
    assert "write_to_tfrecord: Beam's WriteToTFRecord, kept for compatibility" in text
    assert "no index.jsonl, --incremental-from or resume" in text
    assert "(default: planned)" in text


@pytest.mark.unit
def test_keep_last_is_a_template_parameter():
    params = {p["name"] for p in json.loads((REPO / "templates" / "metadata.json").read_text())["parameters"]}
    assert "keep_last" in params
    from beam_pipeline.flex_main import to_cli_args

    assert to_cli_args(["--keep_last=7", "--allow_split_names=true"]) == ["--keep-last=7", "--allow-split-names"]


@pytest.mark.unit
def test_keep_last_needs_a_dated_output():
    with pytest.raises(UsageError, match=r"--keep-last needs \{date\} in --output"):
        parse_convert(["--input", "i", "--output", "o", "--keep-last", "2"])
    with pytest.raises(UsageError, match="--keep-last must be 1 or more"):
        parse_convert(["--input", "i", "--output", "o/{date}", "--keep-last", "0"])
