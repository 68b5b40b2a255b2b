"""The test harness itself: every test in one layer, and an in-process CLI run that leaves nothing behind."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.e2e  # they start processes (pytest, the CLI)


def _collect(tmp_path: Path, test_source: str) -> subprocess.CompletedProcess:
    shutil.copy(REPO / "pytest.ini", tmp_path / "pytest.ini")
    (tmp_path / "tests").mkdir()
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "test_it.py").write_text(test_source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_test_without_a_layer_fails_collection(tmp_path):
    proc = _collect(
        tmp_path, "import pytest\n\n@pytest.mark.unit\ndef test_a():\n    pass\n\ndef test_b():\n    pass\n"
    )
    assert proc.returncode != 0
    assert "every test needs exactly one of unit, pipeline, e2e, cluster" in proc.stderr + proc.stdout
    assert "test_it.py::test_b: no layer" in proc.stderr + proc.stdout


def test_a_tests_own_layer_replaces_its_modules_for_selection(tmp_path):
    source = "import pytest\n\npytestmark = pytest.mark.unit\n\ndef test_a():\n    pass\n\n"
    _collect(tmp_path, source + "@pytest.mark.e2e\ndef test_b():\n    pass\n")
    for marker, expected in (("unit", "test_a"), ("e2e", "test_b")):
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", marker],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        listed = [line for line in proc.stdout.splitlines() if "::" in line]
        assert listed == [f"tests/test_it.py::{expected}"], proc.stdout


def test_two_layers_of_its_own_fail_collection(tmp_path):
    proc = _collect(tmp_path, "import pytest\n\n@pytest.mark.unit\n@pytest.mark.e2e\ndef test_a():\n    pass\n")
    assert proc.returncode != 0 and "test_it.py::test_a: e2e, unit" in proc.stderr + proc.stdout


def test_an_in_process_run_leaves_logging_signals_environment_and_cwd_as_they_were(tmp_path):
    root = logging.getLogger()
    before = (root.handlers[:], root.level, logging.getLogger("apache_beam").level, dict(os.environ), os.getcwd())
    sigint = signal.getsignal(signal.SIGINT)
    result = run_cli("convert", "--input", str(tmp_path / "missing"), "--output", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 2 and "error:" in result.stderr
    after = (root.handlers[:], root.level, logging.getLogger("apache_beam").level, dict(os.environ), os.getcwd())
    assert after == before and signal.getsignal(signal.SIGINT) is sigint
    assert run_cli("--version").stdout.strip() == run_cli("--version", process=True).stdout.strip()
