"""main()'s steps: what a flag before the command means, and what convert prints when it runs nothing here."""

from __future__ import annotations

import logging

import pytest

from beam_pipeline import cli

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("argv", [["-v", "convert"], ["convert", "-v"]], ids=["before", "after"])
def test_verbose_before_or_after_the_command_shows_the_traceback(argv, tmp_path, caplog, capsys):
    """``beam-pipeline -v convert ...`` turned the logs on but lost the traceback of an error found after
    parsing (the flag was read again from convert's own flags, where it was not)."""
    missing = tmp_path / "no-such-folder"
    with caplog.at_level(logging.INFO):
        code = cli.main([*argv, "--input", str(missing), "--output", str(tmp_path / "out")])
    assert code == cli.EXIT_USAGE
    assert str(missing) in capsys.readouterr().err
    [record] = [r for r in caplog.records if r.getMessage() == "usage error"]
    assert record.exc_info is not None


@pytest.mark.unit
def test_a_job_not_run_here_says_where_it_went():
    from beam_pipeline.run.convert import NotRunHere
    from beam_pipeline.vocab.dataset_info import DatasetInfo

    template = NotRunHere(output="o", template_location="t.json")
    assert cli._not_run_here(template, "o") == "job request written to t.json (not submitted)"
    assert cli._not_run_here(NotRunHere(output="gs://b/o", detached=True, job_id="j1"), "gs://b/o") == (
        "submitted job j1; it writes gs://b/o/_SUCCESS when the dataset is complete"
    )
    dry = cli._not_run_here(NotRunHere(output="o", dry_run={"dry_run": True, "job": "x"}), "o")
    assert dry is not None and dry.splitlines()[0] == "dry run: job built, not submitted" and '"job": "x"' in dry
    assert cli._not_run_here(DatasetInfo.from_json({"examples": 3}), "o") is None
