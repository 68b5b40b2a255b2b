"""The lease file as a typed record: the bytes this version wrote as a dict, a renewal keeps what it read."""

from __future__ import annotations

import json
import os
import socket

import pytest

from beam_pipeline import lease

pytestmark = pytest.mark.unit


def test_a_taken_lease_is_the_file_it_always_was(tmp_path):
    record = lease.acquire(str(tmp_path), "run-a")
    text = (tmp_path / lease.LEASE).read_text()
    want = {
        "run_id": "run-a",
        "host": socket.gethostname(),
        "acquired": record.acquired,
        "expires": record.expires,
        "ttl": lease.TTL_S,
        "pid": os.getpid(),
    }
    assert text == json.dumps(want, sort_keys=True) + "\n"
    (tmp_path / "d").mkdir()
    detached = lease.acquire(str(tmp_path / "d"), "run-d", detached=True)
    assert "pid" not in json.loads((tmp_path / "d" / lease.LEASE).read_text()) and detached.pid is None


def test_a_renewal_changes_the_expiry_only_and_keeps_keys_it_does_not_know(tmp_path):
    old = {"run_id": "run-a", "host": "h", "acquired": 1.5, "expires": 2.5, "ttl": 300.0, "from_the_future": [1]}
    (tmp_path / lease.LEASE).write_text(json.dumps(old, sort_keys=True) + "\n")
    renewed = lease.renew(str(tmp_path), "run-a")
    on_disk = json.loads((tmp_path / lease.LEASE).read_text())
    assert on_disk == {**old, "expires": renewed.expires} and renewed.expires > 2.5


def test_a_damaged_lease_is_nobodys_and_named_so(tmp_path):
    (tmp_path / lease.LEASE).write_text("[1, 2")
    found = lease.holder(str(tmp_path))
    assert found is not None and found.run_id is None and not lease.is_live(found)
    assert lease.describe(found).startswith("run None (host ?, lease until 1970-01-01 00:00:00 UTC)")
    assert lease.acquire(str(tmp_path), "run-b").run_id == "run-b"
