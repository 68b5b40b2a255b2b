"""Flags, config files and the one-line errors (exit 2, no traceback)."""

from __future__ import annotations

import pytest

from beam_pipeline.cli import parse_convert
from beam_pipeline.config import dataset_name_from_output, parse_split_ratios
from beam_pipeline.errors import UsageError

from .conftest import run_cli
from .imagegen import image_bytes, write

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "output,name",
    [
        ("photos-tfrecords", "photos_tfrecords"),
        ("/a/b/My Data.v2/", "My_Data_v2"),
        ("2024-run", "dataset_2024_run"),
        ("__", "dataset"),
    ],
)
def test_default_name_from_output(output, name):
    assert dataset_name_from_output(output) == name


def test_split_ratios_parse():
    assert parse_split_ratios("train=0.8,val=0.1,test=0.1") == (("train", 0.8), ("validation", 0.1), ("test", 0.1))
    for bad in ("train=0.8", "train=abc,test=1", "train", "train=0.5,train=0.5", "1x=1"):
        with pytest.raises(UsageError):
            parse_split_ratios(bad)


def test_config_file_then_flags(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "target_shard_mb: 120\nseed: 5\ncompression: gzip\n"
        "split_ratios: {train: 0.9, test: 0.1}\n"
        "pipeline_options:\n  direct_num_workers: 3\n  direct_running_mode: multi_threading\n"
    )
    cfg, beam_flags, _ = parse_convert(["--config", str(cfg_file), "--input", "in", "--output", "out", "--seed", "7"])
    assert cfg.target_shard_mb == 120 and cfg.seed == 7 and cfg.compression == "gzip"
    assert cfg.split_ratios == (("train", 0.9), ("test", 0.1))
    assert cfg.name == "out"
    assert "--direct_num_workers=3" in beam_flags


def test_beam_flags_pass_through_and_typos_fail():
    _, flags, _ = parse_convert(
        ["--input", "i", "--output", "o", "--runner", "DirectRunner", "--direct_num_workers", "2"]
    )
    assert flags == ["--runner", "DirectRunner", "--direct_num_workers", "2"]
    with pytest.raises(UsageError, match="--direct_num_worker"):
        parse_convert(["--input", "i", "--output", "o", "--direct_num_worker", "2"])
    with pytest.raises(UsageError, match="--target-shard"):
        parse_convert(["--input", "i", "--output", "o", "--target-shard", "2"])


@pytest.fixture(scope="module")
def small_input(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli") / "photos"
    write(str(root / "cat" / "a.jpg"), image_bytes("jpeg"))
    write(str(root / "dog" / "b.jpg"), image_bytes("jpeg", seed=1))
    return root


def _one_line_error(result, *needles):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.e2e
@pytest.mark.parametrize(
    "args,needles",
    [
        (["--input", "{root}/missing", "--output", "{tmp}/o1"], ["--input", "no such folder"]),
        (["--input", "{root}", "--output", "{tmp}/o2", "--name", "9bad-name"], ["--name", "9bad-name"]),
        (["--input", "{root}", "--output", "{tmp}/o3", "--bogus-flag", "1"], ["--bogus-flag"]),
        (["--input", "{root}", "--output", "{tmp}/o4", "--compression", "zip"], ["--compression"]),
        (["--input", "{root}", "--output", "{tmp}/o5", "--seed", "abc"], ["--seed"]),
        (["--input", "{root}", "--output", "{root}/cat/out"], ["--output", "inside the input"]),
        (["--input", "{root}/cat/a.jpg", "--output", "{tmp}/o6"], ["is a file"]),
        (["--input", "{root}/*.png", "--output", "{tmp}/o7"], ["no files match"]),
        (["--output", "{tmp}/o8"], ["--input or --manifest"]),
        (["--input", "{root}", "--output", "{tmp}/o9", "--config", "{tmp}/nope.yaml"], ["--config", "no such file"]),
        (["--input", "{root}", "--output", "{tmp}/o10", "--split-ratios", "train=0.7"], ["--split-ratios", "sum"]),
        (["--input", "{root}", "--output", "{tmp}/o11", "--label-regex", "([a-z"], ["--label-regex"]),
        (["--input", "{root}", "--output", "{tmp}/o12", "--labels-file", "{tmp}/none.txt"], ["--labels-file"]),
        # each of these failed inside the job (exit 1) or wrote a surprising dataset
        (["--input", "{root}", "--output", "{tmp}/o13", "--target-shard-mb", "nan"], ["--target-shard-mb", "finite"]),
        (["--input", "{root}", "--output", "{tmp}/o14", "--max-file-mb", "inf"], ["--max-file-mb", "finite"]),
        (["--input", "{root}", "--output", "{tmp}/o15", "--image-memory-mb", "1e400"], ["--image-memory-mb"]),
        (["--input", "{root}", "--output", "{tmp}/o16", "--target-shard-mb", "1e-9"], ["--target-shard-mb", "100"]),
        (["--input", "{root}", "--output", "{tmp}/o17", "--name", "abc\n"], ["--name"]),
        (["--input", "{root}", "--output", "{tmp}/o18", "--name", "a" * 65], ["--name", "at most 64"]),
        (["--input", "{root}", "--output", "{tmp}/o19", "--labels-file", "{root}"], ["--labels-file", "a folder"]),
        (["--input", "{root}", "--output", "{tmp}/o20", "--config", "{root}"], ["--config", "a folder"]),
    ],
)
def test_mistakes_are_one_line_exit_2(small_input, tmp_path, args, needles):
    args = [a.format(root=small_input, tmp=tmp_path) for a in args]
    _one_line_error(run_cli("convert", *args), *needles)


OTHER_STORES = ("s3://bucket/photos", "az://container/photos", "hdfs://host/photos", "https://example.com/photos")


@pytest.mark.e2e
@pytest.mark.smoke
def test_a_path_in_another_store_is_one_line_naming_what_is_supported(small_input, tmp_path):
    """Every path flag of every command: a URL of a store other than GCS is refused before anything is read or
    written (it used to be taken for GCS: 'cannot reach Google Cloud Storage'), from a --config file too."""
    base = ["--input", str(small_input), "--output", str(tmp_path / "out")]
    cases = [("inspect", [url], "OUTPUT") for url in OTHER_STORES] + [("clean", [OTHER_STORES[0]], "OUTPUT")]
    cases += [
        ("inspect", [str(tmp_path), flag, f"{OTHER_STORES[0]}/x"], flag) for flag in ("--report", "--contact-sheet")
    ]
    for url in OTHER_STORES:
        cases += [("convert", ["--input", url, "--output", str(tmp_path / "out")], "--input")]
        cases += [("plan", ["--manifest", f"{url}/m.csv", "--output", str(tmp_path / "out")], "--manifest")]
    for flag in ("--output", "--coco", "--voc", "--masks", "--labels-file", "--incremental-from", "--config"):
        cases += [("convert", [*base[:2], "--output", str(tmp_path / "out"), flag, f"{OTHER_STORES[0]}/x"], flag)]
    config = tmp_path / "c.yaml"
    config.write_text(f"input: {OTHER_STORES[1]}\n")
    cases += [("convert", ["--config", str(config), "--output", str(tmp_path / "out")], "--input")]
    for command, args, flag in cases:
        result = run_cli(command, *args)
        _one_line_error(result, f"{flag} ", "is not supported; give a local path or a gs:// URL")
        assert "Google Cloud Storage" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("text", "needle"),
    [("run_date: 2026-02-30\n", "day is out of range"), ("seed: " + "[" * 100_000 + "\n", "nested deeper"),
     ("name: caf\xe9\n", "not UTF-8")],
    ids=["impossible-date", "deep", "latin-1"],
)  # fmt: skip
def test_a_config_python_cannot_hold_is_one_line_exit_2(small_input, tmp_path, text, needle):
    """YAML reads 2026-02-30 as a date Python refuses (ValueError), a Latin-1 file fails to decode, deep nesting
    recurses too far: each exited 1 with the exception's name."""
    path = tmp_path / "odd.yaml"
    path.write_bytes(text.encode("latin-1"))
    result = run_cli("convert", "--input", str(small_input), "--output", str(tmp_path / "o"), "--config", str(path))
    _one_line_error(result, "--config", needle)


@pytest.mark.e2e
def test_bad_yaml_and_unknown_setting(small_input, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: [1,\n")
    _one_line_error(
        run_cli("convert", "--input", str(small_input), "--output", str(tmp_path / "o"), "--config", str(bad)), "YAML"
    )
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("target_shard: 5\n")
    _one_line_error(
        run_cli("convert", "--input", str(small_input), "--output", str(tmp_path / "o"), "--config", str(unknown)),
        "target_shard",
    )


@pytest.mark.e2e
def test_output_that_is_a_file(small_input, tmp_path):
    (tmp_path / "file").write_text("x")
    _one_line_error(run_cli("convert", "--input", str(small_input), "--output", str(tmp_path / "file")), "is a file")


@pytest.mark.e2e
def test_split_ratios_conflict_with_split_folders(tmp_path):
    root = tmp_path / "in"
    write(str(root / "train" / "cat" / "a.jpg"), image_bytes("jpeg"))
    result = run_cli(
        "convert", "--input", str(root), "--output", str(tmp_path / "o"), "--split-ratios", "train=0.5,test=0.5"
    )
    _one_line_error(result, "--split-ratios", "split folders")


@pytest.mark.e2e
def test_manifest_without_path_column(tmp_path):
    manifest = tmp_path / "m.csv"
    manifest.write_text("file,label\na.jpg,cat\n")
    _one_line_error(run_cli("convert", "--manifest", str(manifest), "--output", str(tmp_path / "o")), "'path' column")


@pytest.mark.e2e
def test_manifest_split_column_conflicts_with_ratios(tmp_path):
    manifest = tmp_path / "m.csv"
    manifest.write_text("path,split\na.jpg,train\n")
    result = run_cli(
        "convert", "--manifest", str(manifest), "--output", str(tmp_path / "o"), "--split-ratios", "train=1"
    )
    _one_line_error(result, "split column")


@pytest.mark.e2e
def test_verbose_shows_the_traceback(small_input, tmp_path):
    result = run_cli("convert", "--input", str(small_input / "missing"), "--output", str(tmp_path / "o"), "-v")
    assert result.returncode == 2 and "Traceback" in result.stderr


@pytest.mark.e2e
def test_help_and_unknown_command():
    assert run_cli("convert", "--help").returncode == 0
    result = run_cli("transmogrify")
    assert result.returncode == 2 and "unknown command" in result.stderr


@pytest.mark.e2e
def test_console_script_is_installed():
    import os
    import shutil
    import subprocess
    import sys

    script = shutil.which("beam-pipeline", path=os.path.dirname(sys.executable))
    assert script, "pip install should create the beam-pipeline console script"
    result = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == __import__("beam_pipeline").__version__


def test_shell_expanded_glob_is_explained():
    with pytest.raises(UsageError, match="quote a glob"):
        parse_convert(["--input", "p/a.jpg", "p/b.jpg", "--output", "o"])


@pytest.mark.e2e
def test_convert_help_shows_required_flags_defaults_examples_and_exit_codes():
    result = run_cli("convert", "--help")
    assert result.returncode == 0 and result.stderr == ""
    text = " ".join(result.stdout.split())  # argparse wraps lines
    assert "usage: beam_pipeline convert (--input FOLDER|GLOB | --manifest FILE) --output DIR" in text
    assert "required (as flags or in --config):" in text
    for default in (
        "shuffle seed; changes the order only, never the splits (default: 0)",
        "MB = 10^6 bytes (default: 150)",
        "(default: folder for --input;",
        "(default: 0.05)",
        "(default: 224)",
        "(default: planned)",
        "(default: none)",
        "(default: 178956970)",
    ):
        assert default in text, default
    assert "--labels-from {folder,none,manifest,regex}" in text
    assert "rotate/flip the pixels as the EXIF orientation says" in text  # every flag has help
    assert "examples: beam-pipeline convert --input ./photos" in text
    assert "--split-ratios train=0.8,validation=0.1,test=0.1" in text
    assert "goes to Apache Beam's PipelineOptions" in text
    for code in ("0 done", "1 the pipeline failed", "2 usage, config or input mistake", "3 too many rejects"):
        assert code in text, code


def test_every_convert_flag_has_help():
    from beam_pipeline.cli import _convert_parser

    for action in _convert_parser()._actions:  # noqa: SLF001
        assert action.help, action.option_strings


@pytest.mark.e2e
def test_done_in_counts_from_process_start():
    import subprocess
    import sys

    from .conftest import REPO

    code = (
        "import time; time.sleep(1.2); from beam_pipeline.cli import process_started; "
        "print(time.time() - process_started())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True, timeout=60)
    assert 1.2 <= float(out.stdout) < 30


BLOCK_TFT = """
import sys
sys.modules["tensorflow_transform"] = None  # as if not installed: find_spec() is None, import fails
from beam_pipeline.cli import main
rc = main(sys.argv[1:])
print("tensorflow imported" if "tensorflow" in sys.modules else "no tensorflow")
sys.exit(rc)
"""


@pytest.mark.e2e
def test_without_tensorflow_transform_convert_still_works_and_says_so(small_input, tmp_path):
    """The base install has no TFT: the default run skips the analysis with a note and never imports TF."""
    import subprocess
    import sys

    from .conftest import REPO

    out = tmp_path / "no-tft"
    args = ["convert", "--input", str(small_input), "--output", str(out)]
    run = subprocess.run(
        [sys.executable, "-c", BLOCK_TFT, *args], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert "transform    skipped: tensorflow-transform is not installed (pip install 'beam_pipeline[transform]'" in (
        run.stdout
    )
    assert run.stdout.strip().endswith("no tensorflow") and run.stderr == ""
    assert not (out / "transform_fn").exists() and (out / "_SUCCESS").exists() and (out / "dataset_info.json").exists()
    stats = subprocess.run(
        [sys.executable, "-c", BLOCK_TFT, *args[:-1], str(tmp_path / "o2"), "--image-stats"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    _one_line_error(stats, "--image-stats needs tensorflow-transform")


@pytest.mark.e2e
def test_a_default_run_prints_only_its_summary(small_input, tmp_path):
    """TFT analysis and TFDS metadata on: no TensorFlow, absl or Beam lines on stderr, wall time reported.
    (A process of its own: TensorFlow's C++ start-up lines go to the process's stderr, and only a fresh
    interpreter imports TensorFlow.)"""
    result = run_cli("convert", "--input", str(small_input), "--output", str(tmp_path / "full"), process=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith("done in ") and any(line.startswith("  transform    tensorflow") for line in lines)
    assert all(line.startswith(("done in ", "  ")) for line in lines), result.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["UsageError", "RejectsError", "PipelineError"])
def test_an_error_message_of_several_lines_is_printed_as_one(monkeypatch, capsys, kind):
    """Whatever library text ends up in an error (a parser's snippet and arrow), the user sees one line."""
    from beam_pipeline import cli, errors

    def fail(*_args):
        raise getattr(errors, kind)("first part\n   a snippet  \n\n      ^ here")

    monkeypatch.setattr(cli, "_run", fail)
    code = cli.main(["convert", "--input", "x", "--output", "y"])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1, err
    assert err.rstrip("\n").endswith("first part; a snippet; ^ here")


def test_a_tiny_max_file_mb_stays_a_limit():
    """--max-file-mb 1e-9 rounded to 0 bytes, which means no limit: every file was read, where 0.0001 read none."""
    from beam_pipeline.config import ConvertConfig

    assert ConvertConfig(output="o", name="n", max_file_mb=1e-9).image_options.max_file_bytes == 1
    assert ConvertConfig(output="o", name="n", max_file_mb=0).image_options.max_file_bytes == 0  # 0: no limit


@pytest.mark.parametrize(
    ("typed", "hint"),
    [
        ("--split-ratio", "; did you mean --split-ratios?"),
        ("--spilt-ratios", "; did you mean --split-ratios?"),
        ("--max-reject", "; did you mean --max-reject-fraction?"),
        ("--num-workers", "; did you mean --num_workers?"),  # Beam's spelling
        ("--zzz", ""),
    ],
)
def test_an_unknown_flag_names_the_closest_known_one(typed, hint):
    with pytest.raises(UsageError) as e:
        parse_convert(["--input", "in", "--output", "out", typed, "1"])
    assert str(e.value) == f"unknown flag {typed} (not a beam_pipeline or Beam option){hint}"


# --- edges left open (issue 32, item 7) ---------------------------------------------------------------


def test_split_names_differing_only_in_case_are_a_usage_error():
    """Train and train name shard files that are one file on a case-insensitive file system (macOS, Windows)."""
    with pytest.raises(UsageError, match="'Train' and 'train' differ only in case"):
        parse_split_ratios("Train=0.5,train=0.5", allow_any_name=True)
    with pytest.raises(UsageError, match="--split-ratios: splits 'Test' and 'test'"):
        parse_convert(["--input", "i", "--output", "o", "--split-ratios", "train=0.5,Test=0.25,test=0.25",
                       "--allow-split-names"])  # fmt: skip


def test_a_manifests_split_names_differing_only_in_case_stop_the_plan():
    """A manifest's split column is only known inside the job: the shard plan, which every shard waits for,
    refuses them."""
    from beam_pipeline.planning import make_plans

    assert set(make_plans([(("train", 0), 10), (("val_a", 1), 10)], 100)) == {"train", "val_a"}
    with pytest.raises(UsageError, match="--manifest split column: splits 'Train' and 'train'"):
        make_plans([(("train", 0), 10), (("Train", 1), 10)], 100)


def test_image_size_has_an_upper_bound():
    """--image-size 16000 took 7 GB in the transform step (side² × 12 bytes per image)."""
    assert parse_convert(["--input", "i", "--output", "o", "--image-size", "4096"])[0].image_size == 4096
    with pytest.raises(UsageError, match="--image-size must be 1-4096"):
        parse_convert(["--input", "i", "--output", "o", "--image-size", "16000"])


def test_a_yaml_alias_bomb_in_a_config_is_refused_at_once(tmp_path):
    """Nine levels of aliases under pipeline_options (or split_ratios) grew to GBs in ~60 s before failing."""
    import time

    levels = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    for key in ("pipeline_options", "split_ratios"):
        path = tmp_path / f"{key}.yaml"
        path.write_text(f"{key}:\n" + "".join(f"  {line}\n" for line in levels))
        started = time.monotonic()
        with pytest.raises(UsageError, match=r"--config .*: YAML alias \*a0 \(line 3\): config files take no aliases"):
            parse_convert(["--config", str(path), "--input", "i", "--output", "o"])
        assert time.monotonic() - started < 5
    harmless = tmp_path / "harmless.yaml"  # read before; refused now: the rule is simple, and no setting needs one
    harmless.write_text("seed: &n 2\npipeline_options:\n  direct_num_workers: *n\n")
    with pytest.raises(UsageError, match=r"alias \*n \(line 3\)"):
        parse_convert(["--config", str(harmless), "--input", "i", "--output", "o"])


@pytest.mark.parametrize("link_into", ["output", "input"])
def test_an_output_reached_through_a_symlink_into_the_input_is_a_usage_error(small_input, tmp_path, link_into):
    """The paths were compared as text: --output link/out with link -> the input folder was not caught, nor an
    --input reached through a link to a folder inside the output."""
    import shutil

    from beam_pipeline.config import ConvertConfig
    from beam_pipeline.run.preflight import prepare

    if link_into == "output":
        (tmp_path / "link").symlink_to(small_input)
        given_input, output = str(small_input), str(tmp_path / "link" / "out")
    else:
        output = tmp_path / "o"
        shutil.copytree(small_input, output / "photos")
        (tmp_path / "link").symlink_to(output / "photos")
        given_input, output = str(tmp_path / "link"), str(output)
    with pytest.raises(UsageError, match="must not be inside the input folder"):
        prepare(ConvertConfig(output=output, name="d", input=given_input))


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--runner=PrismRunner"], "--runner PrismRunner: Prism downloads its binary"),
        (["--runner", "apache_beam.runners.portability.prism_runner.PrismRunner"], "Prism downloads"),
        (["--direct_num_workers=-1"], "--direct_num_workers -1: must be 0 (one worker per core) or more"),
    ],
)
def test_runner_options_that_download_or_fail_inside_beam_are_usage_errors(flags, words):
    from beam_pipeline.runner import make_options

    with pytest.raises(UsageError) as caught:
        make_options(flags)
    assert words in str(caught.value)


def test_direct_num_workers_0_is_one_worker_per_core():
    from apache_beam.options.pipeline_options import DirectOptions

    from beam_pipeline.runner import make_options

    options, runner = make_options(["--direct_num_workers=0", "--direct_running_mode=multi_threading"])
    assert runner is not None and options.view_as(DirectOptions).direct_num_workers == 0
    assert make_options(["--runner=SwitchingDirectRunner"])[1] is not None  # the Python engine, not Prism first


def test_a_labels_file_line_holding_a_splitlines_break_is_a_usage_error(small_input, tmp_path):
    from beam_pipeline.config import ConvertConfig
    from beam_pipeline.run.preflight import prepare

    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ndog\u2028x\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"--labels-file .*: label 'dog\\u2028x' holds '\\u2028' \(line separator\)"):
        prepare(ConvertConfig(output=str(tmp_path / "o"), name="d", input=str(small_input), labels_file=str(labels)))


def test_a_previous_labels_txt_holding_a_splitlines_break_is_not_carried_on(small_input, tmp_path):
    """An output written before such labels were rejects: an incremental run would keep the label in its own
    labels.txt."""
    from beam_pipeline.config import ConvertConfig
    from beam_pipeline.run.preflight import prepare

    previous = tmp_path / "previous"
    previous.mkdir()
    (previous / "_SUCCESS").write_text("")
    (previous / "labels.txt").write_text("cat\nd\x1cog\n", encoding="utf-8")
    cfg = ConvertConfig(output=str(tmp_path / "o"), name="d", input=str(small_input), incremental_from=str(previous))
    with pytest.raises(UsageError, match=r"--incremental-from .*labels.txt: label 'd\\x1cog' holds '\\x1c'"):
        prepare(cfg)


def test_a_flink_or_spark_failure_is_told_by_its_message_not_its_last_java_frame():
    """A portable runner's job failure ends with a Java stack trace; the one line is the error above it."""
    from beam_pipeline.errors import last_line

    failure = RuntimeError(
        "Pipeline BeamApp-1 failed in state FAILED: org.apache.spark.SparkException: Only one SparkContext "
        "should be running in this JVM (see SPARK-2243).\n"
        "\tat org.apache.spark.SparkContext$.assertNoOtherContextIsRunning(SparkContext.scala:2838)\n"
        "\tjava.base/java.lang.Thread.run(Thread.java:840)\n"
        "\t... 12 more\n"
    )
    assert last_line(failure).endswith("Only one SparkContext should be running in this JVM (see SPARK-2243).")
    assert last_line(RuntimeError("first\nsecond")) == "second"
