"""The flag table (beam_pipeline/flags.py) against what it must agree with.

A flag, its ``--config`` key, its ``ConvertConfig`` field, ``validate()``'s
accepted values and the Flex Template's parameters are separate places in
the code; these tests fail when one of them changes without the others.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
import yaml

from beam_pipeline import cli
from beam_pipeline.cli import parse_convert
from beam_pipeline.config import ConvertConfig, validate
from beam_pipeline.errors import UsageError
from beam_pipeline.flags import CONFIG_KEYS, CONVERT, NEGATIONS, config_flag
from beam_pipeline.flex_main import to_cli_args

from .conftest import REPO

pytestmark = pytest.mark.unit

# A value for every --config key, other than its default; extra settings it needs to be valid.
EXAMPLES: dict[str, tuple[Any, dict[str, Any]]] = {
    "input": ("photos", {}),
    "manifest": ("list.csv", {"input": None}),
    "output": ("elsewhere", {}),
    "name": ("pets", {}),
    "labels_from": ("none", {}),
    "label_regex": ("_([a-z]+)\\.png$", {}),
    "labels_file": ("labels.txt", {}),
    "label_separator": ("|", {"input": None, "manifest": "list.csv"}),
    "coco": ("instances.json", {}),
    "coco_category_offset": (1, {"coco": "instances.json"}),
    "manifest_objects": ("rows", {"input": None, "manifest": "list.csv"}),
    "box_units": ("normalized", {"input": None, "manifest": "list.csv", "manifest_objects": "rows"}),
    "voc": ("Annotations", {}),
    "masks": ("labelmaps", {}),
    "incremental_from": ("previous", {}),
    "change_share": (0.5, {}),
    "max_class_drop": (0.5, {"incremental_from": "previous"}),
    "split_ratios": ("train=0.5,test=0.5", {}),
    "allow_split_names": (True, {}),
    "split_folders": (False, {}),
    "no_split_folders": (True, {}),
    "keep_last": (3, {"output": "out/{date}", "run_date": "2026-01-02"}),
    "seed": (7, {}),
    "target_shard_mb": (20.5, {}),
    "compression": ("gzip", {}),
    "format": ("array_record", {}),
    "sink": ("write_to_tfrecord", {}),
    "overwrite": (True, {}),
    "resume": (False, {}),
    "no_resume": (True, {}),
    "dedupe": (True, {}),
    "near_duplicates": ("off", {}),
    "report": (True, {}),
    "near_duplicate_distance": (6, {}),
    "run_date": ("2026-01-02", {"output": "out/{date}"}),
    "decode_threads": (2, {}),
    "max_reject_fraction": (0.5, {}),
    "reject_allowance": (3, {}),
    "transform": (False, {}),
    "no_transform": (True, {}),
    "image_size": (64, {}),
    "image_stats": (True, {}),
    "tfds_metadata": (False, {}),
    "no_tfds_metadata": (True, {}),
    "max_pixels": (1000, {}),
    "max_total_pixels": (2000, {}),
    "max_frames": (3, {}),
    "max_mask_pixels": (10_000_000, {}),
    "max_file_mb": (1.5, {}),
    "image_memory_mb": (100.0, {}),
    "min_size": (8, {}),
    "apply_exif_orientation": (True, {}),
    "strip_exif": (True, {}),
    "resize_max_side": (512, {}),
    "reencode": ("jpeg:90", {}),
    "on_unsupported": ("reject", {}),
    "post_steps": ("job", {}),
    "detach": (True, {}),
}
BASE = {"input": "in", "output": "out", "run_date": "2026-01-01"}


def _flag_args(key: str, value: Any) -> list[str]:
    """``key: value`` of a config file as command-line flags."""
    flag = config_flag(key)
    if flag is None:  # resume: false is --no-resume
        [switch] = [s for s, setting in NEGATIONS.items() if setting == key]
        assert value is False
        return ["--" + switch.replace("_", "-")]
    if flag.switch:
        return [flag.name] if value else []
    return [flag.name, str(value)]


def _parse(flags: dict[str, Any], config: dict[str, Any] | None = None, tmp_path=None) -> ConvertConfig:
    """parse_convert of ``flags`` as flags and ``config`` as a --config file (a flag would win over it)."""
    config = config or {}
    argv = [
        arg for key, value in flags.items() if value is not None and key not in config for arg in _flag_args(key, value)
    ]
    if config:
        path = tmp_path / "settings.yaml"
        path.write_text(yaml.safe_dump(config))
        argv += ["--config", str(path)]
    return parse_convert(argv)[0]


def test_every_config_key_has_an_example():
    assert set(EXAMPLES) == set(CONFIG_KEYS)


@pytest.mark.parametrize("key", sorted(EXAMPLES))
def test_a_setting_means_the_same_as_a_flag_and_in_a_config_file(key, tmp_path):
    value, needs = EXAMPLES[key]
    base = {**BASE, **needs}
    as_flag = _parse({**base, key: value})
    in_file = _parse(base, {key: value}, tmp_path)
    assert as_flag == in_file
    field = NEGATIONS.get(key, key)  # no_resume sets resume
    assert getattr(as_flag, field) != getattr(_parse(BASE), field), f"{key}: {value!r} changed nothing"


def test_config_keys_are_the_convert_config_fields_with_their_types():
    fields = {f.name: f for f in dataclasses.fields(ConvertConfig)}
    # output_template is derived: the --output as given when it holds {date}
    assert set(CONFIG_KEYS) - set(NEGATIONS) == set(fields) - {"output_template"}
    for key, kind in CONFIG_KEYS.items():
        if key in NEGATIONS:
            assert kind is bool and fields[NEGATIONS[key]].type == "bool"
        elif key != "split_ratios":  # parsed from its text into pairs
            assert re.match(rf"^{kind.__name__}\b", str(fields[key].type)), (key, kind, fields[key].type)


@pytest.mark.parametrize("flag", [f for f in CONVERT.flags if f.choices], ids=lambda f: f.name)
def test_choices_are_what_validate_accepts(flag):
    """A config file skips argparse's choices; validate() must accept exactly the same values."""
    base = ConvertConfig(output="out", name="out", input="in")
    manifest = {"input": None, "manifest": "m.csv"}
    needs = {
        "regex": {"label_regex": "(x)"},
        "manifest": manifest,
        **dict.fromkeys(("rows", "column"), manifest),
        "normalized": {**manifest, "manifest_objects": "rows"},
    }
    for choice in flag.choices:
        validate(dataclasses.replace(base, **{flag.key: choice, **needs.get(choice, {})}))
        with pytest.raises(UsageError, match=re.escape(flag.name)):
            validate(dataclasses.replace(base, **{flag.key: choice + "x"}))


def test_template_parameters_are_settings_of_the_right_kind():
    """templates/metadata.json's regexes admit only values the flag takes (what flex_main passes on)."""
    params = json.loads((REPO / "templates" / "metadata.json").read_text())["parameters"]
    for param in params:
        flag = config_flag(param["name"])
        assert flag is not None, f"{param['name']}: not a convert setting"
        [regex] = param["regexes"]
        if flag.switch:
            assert {v for v in ("true", "false", "1", "yes", "") if re.match(regex, v)} == {"true", "false"}
            assert to_cli_args([f"--{flag.key}=true", f"--{flag.key}=false"]) == [flag.name]
        elif flag.type in (int, float):
            assert not re.match(regex, "x") and not re.match(regex, "")
            if flag.type is int:
                assert not re.match(regex, "1.5"), flag.name
        if flag.choices:
            alternatives = re.fullmatch(r"\^\(([\w|-]+)\)\$", regex)
            assert alternatives, regex
            assert set(alternatives.group(1).split("|")) <= set(flag.choices), flag.name


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ("seed: 1.5", "seed must be a whole number"),
        ("keep_last: 2.5", "keep_last must be a whole number"),
        ("image_size: true", "image_size must be a whole number"),
        ("target_shard_mb: true", "target_shard_mb must be a number"),
        ("target_shard_mb: lots", "target_shard_mb must be a number"),
        ("name: [a, b]", "name must be text"),
        ("input: {a: 1}", "input must be text"),
        ("overwrite: yes please", "overwrite must be true or false"),
    ],
)
def test_a_config_value_is_checked_as_the_flag_checks_it(setting, needle, tmp_path):
    """``seed: 1.5`` is an error, as ``--seed 1.5`` is; it used to become seed 1 without a word."""
    path = tmp_path / "c.yaml"
    path.write_text(setting + "\n")
    with pytest.raises(UsageError, match=re.escape(f"--config {path}: {needle}")):
        parse_convert(["--input", "in", "--output", "out/{date}", "--config", str(path)])


def test_a_config_value_may_be_written_as_yaml_writes_it(tmp_path):
    """Numbers as strings, ints for floats, a YAML date for run_date: what the flags would take."""
    path = tmp_path / "c.yaml"
    path.write_text('seed: "7"\ntarget_shard_mb: 150\nrun_date: 2026-01-02\nmax_reject_fraction: 1\n')
    cfg = parse_convert(["--input", "in", "--output", "out/{date}", "--config", str(path)])[0]
    assert (cfg.seed, cfg.target_shard_mb, cfg.run_date, cfg.max_reject_fraction) == (7, 150.0, "2026-01-02", 1.0)


def test_the_parsers_are_built_from_the_tables():
    """What --help lists is the table, in its order and groups, with one help text per flag."""
    parser = cli._convert_parser()
    listed = [
        (group.title, action.option_strings[-1])
        for group in parser._action_groups  # noqa: SLF001
        for action in group._group_actions  # noqa: SLF001
        if action.dest != "help"
    ]
    assert listed == [(group.title, flag.name) for group in CONVERT.groups for flag in group.flags]
    assert all(flag.help for flag in CONVERT.flags)


def test_a_template_parameter_false_for_a_setting_on_by_default_becomes_its_no_flag():
    """split_folders=false, resume=false, transform=false (a YAML-style false for a setting that a --no-X flag
    turns off) were dropped silently on the way from the Flex Template to the command line."""
    got = to_cli_args(["--split_folders=false", "--resume=false", "--transform=false", "--transform=true"])
    assert got == ["--no-split-folders", "--no-resume", "--no-transform"]
    assert to_cli_args(["--no_split_folders=true", "--no_resume=false"]) == ["--no-split-folders"]
    cfg, _, _ = parse_convert(["--input", "in", "--output", "out", *to_cli_args(["--split_folders=false"])])
    assert cfg.split_folders is False
    for odd in ("--transform=on", "--overwrite=enabled"):  # neither true nor false: refused, not guessed
        assert to_cli_args([odd]) == [odd]
        with pytest.raises(UsageError):
            parse_convert(["--input", "in", "--output", "out", *to_cli_args([odd])])


def test_a_workers_settings_are_the_configs_fields_of_those_names_or_what_the_launcher_computed():
    from beam_pipeline.config import settings_for

    @dataclasses.dataclass(frozen=True)
    class Seen:
        output: str
        seed: int
        multi_label: bool

    cfg = ConvertConfig(output="/o", name="n", input="/i", seed=7, label_separator=",")
    assert settings_for(Seen, cfg, multi_label=True) == Seen("/o", 7, True)
    with pytest.raises(AttributeError):  # a field the config does not have must be computed
        settings_for(Seen, cfg)
