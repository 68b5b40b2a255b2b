"""convert on a real Apache Spark standalone cluster (scripts/cluster.sh spark) through Beam's Spark job server:
the same bytes as the local runner, and a killed Spark worker. The cluster is set up as for Flink
(tests/test_engines.py: its own network namespace, the worker pool's private /tmp, data in .cluster/shared)."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_engines import classification_matches, killed_mid_run, running_cluster
from tests.test_engines import shared as shared  # noqa: F401  (the fixture)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def spark() -> Iterator[list[str]]:
    """The Beam options `cluster.sh spark start` prints; the cluster is stopped (by pid) afterwards."""
    yield from running_cluster("spark", "SparkRunner", {"master", "worker", "jobserver", "workerpool"})


def test_classification_in_array_record_matches_the_local_runner(spark: list[str], shared: Path) -> None:
    # ArrayRecord here; Flink converts to TFRecord, and its incremental night to ArrayRecord
    classification_matches("spark", spark, shared, "--format", "array_record")


def _spark_app_running() -> bool:
    url = f"http://127.0.0.1:{os.environ.get('SPARK_MASTER_UI_PORT', '8080')}/json/"
    with urllib.request.urlopen(url, timeout=5) as response:
        return bool(json.loads(response.read()).get("activeapps"))


def test_a_killed_worker_leaves_the_old_dataset_or_the_new_one(spark: list[str], shared: Path) -> None:
    """The Spark worker dies (SIGKILL, by the pid `status` gives) while the job runs; `start` brings a new one."""
    killed_mid_run("spark", "worker", _spark_app_running, spark, shared)
