"""What the measurements share: a run's wall time, CPU and peak RSS, generated and linked data, an emulator, tables.

Every measurement of ``scripts/benchmark.py`` imports from here instead of
carrying its own copy. ``benchmark.py measure -- COMMAND`` runs ``measure``
on any command and prints its JSON line:

    .venv/bin/python scripts/benchmark.py measure -- .venv/bin/python -m beam_pipeline convert --input big --output out
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psutil

K = TypeVar("K")
T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent.parent
SCRIPTS = REPO / "scripts"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


# --- one run, measured from outside -------------------------------------------------------------


def tree_rss(proc: psutil.Process) -> int:
    """RSS bytes of ``proc`` and all its descendants (Beam worker processes included)."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def measure(
    command: list[str],
    interval: float = 0.05,
    *,
    env: dict[str, str] | None = None,
    quiet: bool = False,
    cwd: Path | str | None = None,
) -> dict[str, Any]:
    """Runs ``command``; its wall time, CPU, peak RSS of its process tree (sampled every ``interval`` s), exit code.

    ``cpu_seconds`` is user + system CPU of the process and the descendants it
    waited for (``RUSAGE_CHILDREN``): on a shared machine a busy neighbour
    stretches the wall time far more than the CPU a run needs.
    ``root_peak_rss_mb`` is the started process alone (the launcher, without
    the workers it starts); ``load`` the 1-minute load average at the end.
    ``quiet`` drops the command's stdout and keeps its stderr to show the end of it (``stderr_tail``) if it fails.
    """
    err = tempfile.TemporaryFile() if quiet else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    child = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL if quiet else None, stderr=err)
    proc = psutil.Process(child.pid)
    peak = root_peak = 0
    while child.poll() is None:
        try:
            peak = max(peak, tree_rss(proc))
            root_peak = max(root_peak, proc.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(interval)
    seconds = time.perf_counter() - started
    child.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    tail = ""
    if err is not None:
        if child.returncode:
            err.seek(0)
            tail = err.read()[-2000:].decode(errors="replace")
        err.close()
    return {
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu, 2),
        "load": round(os.getloadavg()[0], 2),
        "peak_rss_mb": round(peak / 1e6, 1),
        "root_peak_rss_mb": round(root_peak / 1e6, 1),
        "returncode": child.returncode,
        "command": " ".join(command),
        **({"stderr_tail": tail} if tail else {}),
    }


def beam_pipeline(*args: str) -> list[str]:
    """The command line of ``beam-pipeline ARGS`` in a fresh process of this interpreter."""
    return [sys.executable, "-m", "beam_pipeline", *args]


def measure_beam(*args: str, env: dict[str, str] | None = None, check: bool = True) -> dict[str, Any]:
    """``measure`` of ``beam-pipeline ARGS``, its stdout dropped; exits if it fails (unless ``check`` is off:
    a run killed on purpose)."""
    result = measure(beam_pipeline(*args), env=env, quiet=True)
    if check and result["returncode"] != 0:
        raise SystemExit(
            f"error: failed (exit {result['returncode']}): {result['command']}\n{result.get('stderr_tail', '')}"
        )
    return result


def interleaved(
    rounds: int, runs: Mapping[K, Callable[[], T]], report: Callable[[int, K, T], None] | None = None
) -> dict[K, list[T]]:
    """Every run once per round, ``rounds`` rounds: each key's results, in round order.

    Baseline and candidates take turns, so a slow spell of a shared machine hits them alike; compare the
    medians (or the minima), never one run against another run's neighbours. ``report(round, key, result)``
    is called after each run (rounds count from 1).
    """
    results: dict[K, list[T]] = {key: [] for key in runs}
    for round_no in range(1, max(1, rounds) + 1):
        for key, run in runs.items():
            results[key].append(run())
            if report is not None:
                report(round_no, key, results[key][-1])
    return results


def steady_ms(big: float, small: float, items: int) -> float:
    """ms per item of a cost (seconds) with start-up cancelled: a run on many items minus one on a prefix.

    ``items`` is the difference in items; nan when there is none.
    """
    return 1000 * (big - small) / items if items > 0 else math.nan


def steady_rate(big_seconds: float, small_seconds: float, items: int) -> float:
    """Items per second with start-up cancelled (``items``: the difference); nan when the runs cannot tell."""
    dt = big_seconds - small_seconds
    return items / dt if dt > 0 and items > 0 else math.nan


def load() -> str:
    """``uptime``'s load averages (1, 5, 15 min)."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


# --- the tutorial loop (contenders, tiles): read, Pillow decode, build the Example, one TFRecordWriter --------
# argv: a file of paths (one per line), the output file; the label is the parent folder's name

TUTORIAL = r"""
import io, sys, glob, os
import tensorflow as tf
from PIL import Image
files = [l.strip() for l in open(sys.argv[1])]
with tf.io.TFRecordWriter(sys.argv[2]) as w:
    for path in files:
        data = open(path, "rb").read()
        img = Image.open(io.BytesIO(data)); img.load()
        label = os.path.basename(os.path.dirname(path))
        ex = tf.train.Example(features=tf.train.Features(feature={
            "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
            "image/height": tf.train.Feature(int64_list=tf.train.Int64List(value=[img.height])),
            "image/width": tf.train.Feature(int64_list=tf.train.Int64List(value=[img.width])),
            "image/class/text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[label.encode()])),
        }))
        w.write(ex.SerializeToString())
"""


# --- small tiles (million, tiles) ---------------------------------------------------------------

TILE_CLASSES = 10
TILE_SIDE = 96
TILE_SEED = 45


def tile(folder: Path, i: int) -> None:
    """Tile ``i``: a soft two-colour gradient with a few flat blocks, JPEG quality 85 (~2.4 KB)."""
    import numpy as np
    from PIL import Image

    path = folder / f"class_{i % TILE_CLASSES}" / f"{i:07d}.jpg"
    if path.exists():
        return
    rng = np.random.default_rng((TILE_SEED, i))
    a, b = rng.integers(0, 256, size=3), rng.integers(0, 256, size=3)
    ramp = np.linspace(0.0, 1.0, TILE_SIDE)[:, None, None]
    if rng.random() < 0.5:
        ramp = ramp.transpose(1, 0, 2)
    pixels = a + (b - a) * ramp * np.ones((TILE_SIDE, TILE_SIDE, 1))
    for _ in range(int(rng.integers(2, 6))):
        x, y = rng.integers(0, TILE_SIDE - 16, size=2)
        w, h = rng.integers(8, 40, size=2)
        pixels[y : y + h, x : x + w] = rng.integers(0, 256, size=3)
    noise = rng.integers(-6, 7, size=(TILE_SIDE, TILE_SIDE, 1))
    Image.fromarray(np.clip(pixels + noise, 0, 255).astype(np.uint8), "RGB").save(path, "JPEG", quality=85)


def _make_range(job: tuple[str, int, int]) -> int:
    folder, start, stop = job
    for i in range(start, stop):
        tile(Path(folder), i)
    return stop - start


def make_tiles(data: Path, count: int, workers: int = 2) -> Path:
    """The full set of ``count`` tiles under ``data/tiles``, made once (a marker says it is whole)."""
    folder = data / "tiles"
    done = data / f".complete-tiles-{count}"
    if done.exists():
        return folder
    for k in range(TILE_CLASSES):
        (folder / f"class_{k}").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    step = 2000
    jobs = [(str(folder), s, min(s + step, count)) for s in range(0, count, step)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        made = sum(pool.imap_unordered(_make_range, jobs))
    done.touch()
    print(f"tiles: {made:,} made in {folder} in {time.monotonic() - started:.0f} s")
    return folder


def tile_subset(data: Path, full: Path, count: int) -> Path:
    """The first ``count`` tiles of the full set, as hard links (made once)."""
    folder = data / f"tiles-{count}"
    done = data / f".complete-tiles-subset-{count}"
    if done.exists():
        return folder
    for k in range(TILE_CLASSES):
        (folder / f"class_{k}").mkdir(parents=True, exist_ok=True)
    for i in range(count):
        name = f"class_{i % TILE_CLASSES}/{i:07d}.jpg"
        target = folder / name
        if not target.exists():
            os.link(full / name, target)
    done.touch()
    return folder


# --- data: generated, listed, linked ------------------------------------------------------------


def list_images(root: Path, suffixes: Sequence[str] = IMAGE_SUFFIXES) -> list[Path]:
    """Image files under ``root``, sorted."""
    return sorted(p for p in root.rglob("*") if p.suffix.lower() in suffixes and p.is_file())


@contextlib.contextmanager
def scratch(folder: str, prefix: str) -> Iterator[Path]:
    """``folder`` (created, kept afterwards) or, when it is empty, a temporary folder removed at the end."""
    if folder:
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def link_files(files: Iterable[Path], root: Path, dest: Path) -> Path:
    """``dest`` holds hard links to ``files`` at their paths relative to ``root`` (a subset, no copies)."""
    shutil.rmtree(dest, ignore_errors=True)
    for f in files:
        target = dest / Path(f).relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(f, target)
    return dest


def link_tree(src: Path, dst: Path) -> int:
    """Hard-links every file of ``src`` under ``dst`` (same relative path, ``dst`` kept); returns how many."""
    n = 0
    for root, _, files in os.walk(src):
        for name in files:
            target = dst / Path(root).relative_to(src) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(Path(root) / name, target)
            n += 1
    return n


def make_samples(folder: Path, per_class: int, size: str = "640x480", *, jpeg_only: bool = False) -> None:
    """Three class folders of generated photos-like images (``scripts/make_sample_images.py``), none corrupt."""
    command = [sys.executable, str(SCRIPTS / "make_sample_images.py"), str(folder), "--per-class", str(per_class)]
    command += ["--size", size, "--no-corrupt", *(["--jpeg-only"] if jpeg_only else [])]
    subprocess.run(command, check=True)


def distinct_images(folder: Path, count: int, width: int, height: int, suffix: str = ".png") -> list[Path]:
    """``count`` distinct images of random pixels (seeded; a few hundred bytes at 8x8, ~1 KB as a 64x48 JPEG).

    Made once: a file already there is kept, so a ``--work`` folder serves the next run.
    """
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = [folder / f"{i:05d}{suffix}" for i in range(count)]
    for path in paths:
        pixels = rng.integers(0, 255, size=(height, width, 3), dtype=np.uint8)
        if not path.exists():
            Image.fromarray(pixels, "RGB").save(path, **({"quality": 80} if suffix == ".jpg" else {}))
    return paths


def hard_links(root: Path, sources: Sequence[Path], rels: Sequence[str]) -> None:
    """Hard links to ``sources`` (round robin) at ``rels`` under ``root``: many real files, few bytes.

    Done once: a marker beside ``root`` (not a file under it, which would be listed) says the tree is whole.
    """
    done = root.parent / f".complete-{root.name}"
    if done.exists():
        return
    made: set[Path] = set()
    for i, rel in enumerate(rels):
        path = root / rel
        if path.parent not in made:
            path.parent.mkdir(parents=True, exist_ok=True)
            made.add(path.parent)
        if not path.exists():
            os.link(sources[i % len(sources)], path)
    done.touch()


def published_shards(out: Path) -> list[str]:
    """The shard files ``dataset.json`` of an output names, relative to it."""
    info = json.loads((out / "dataset.json").read_text())
    return [s["file"] for split in info["splits"].values() for s in split["shards"]]


# --- GCS without a network ----------------------------------------------------------------------


# --- a run's processes and those of a cluster, by session (scripts/cluster.sh's roles) -------------

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat(pid: str) -> tuple[int, float, int] | None:
    """(session id, CPU seconds, RSS bytes) of a live process."""
    from cluster import proc_fields  # scripts/cluster.py: scripts/benchmark.py puts scripts/ on sys.path

    fields = proc_fields(pid)
    if not fields:
        return None
    return int(fields[3]), (int(fields[11]) + int(fields[12])) / TICKS, int(fields[21]) * PAGE


def _processes(sessions: set[int]) -> dict[str, tuple[float, int]]:
    """pid → (CPU seconds, RSS bytes) of every live process in ``sessions``."""
    found: dict[str, tuple[float, int]] = {}
    for pid in os.listdir("/proc"):
        stat = _stat(pid) if pid.isdigit() else None
        if stat and stat[0] in sessions:
            found[pid] = stat[1:]
    return found


class TreeSampler:
    """CPU seconds and peak RSS of every process in ``sessions`` while it runs.

    The processes of ``running`` (sessions that were there before the run: the cluster's) count from the CPU
    they had at the start; the others (the convert's session) from zero.
    """

    def __init__(self, sessions: set[int], running: set[int]) -> None:
        self.sessions = sessions
        self.first = {pid: cpu for pid, (cpu, _) in _processes(running).items()}
        self.last: dict[str, float] = {}
        self.peak_rss = 0
        self._stop = threading.Event()
        self._sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        found = _processes(self.sessions)
        self.last.update((pid, cpu) for pid, (cpu, _) in found.items())
        self.peak_rss = max(self.peak_rss, sum(rss for _, rss in found.values()))

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def stop(self) -> tuple[float, int]:
        """(CPU seconds, peak RSS bytes) since the start."""
        self._stop.set()
        self._thread.join()
        self._sample()
        cpu = sum(seconds - self.first.get(pid, 0.0) for pid, seconds in self.last.items())
        return cpu, self.peak_rss


def cluster_sessions(engine: str) -> set[int]:
    """The sessions of the cluster's running roles (``cluster.sh ENGINE status``: one "role pid" line each)."""
    out = subprocess.run([str(SCRIPTS / "cluster.sh"), engine, "status"], capture_output=True, text=True).stdout
    sessions = set()
    for line in out.splitlines():
        found = _stat(line.split()[1])
        if found:
            sessions.add(found[0])
    return sessions


def idle_rss(sessions: set[int]) -> int:
    """RSS bytes of every process in ``sessions`` now."""
    return sum(rss for _, rss in _processes(sessions).values())


def start_gcs_emulator(bucket: str) -> Any:
    """A gcp-storage-emulator on a free loopback port with ``bucket``; STORAGE_EMULATOR_HOST set to it.

    Call ``.stop()`` on the result when done.
    """
    from gcp_storage_emulator.server import create_server

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
    server.start()
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    os.environ.setdefault("NO_GCE_CHECK", "true")
    from beam_pipeline.run.workers import use_anonymous_gcs_for_emulator

    use_anonymous_gcs_for_emulator()
    return server


def gcs_client(project: str = "bench") -> Any:
    """A storage client with anonymous credentials (for the emulator)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project=project, credentials=AnonymousCredentials())


# --- output --------------------------------------------------------------------------------------


def emit_json(line: Mapping[str, Any], out_json: Path | None = None) -> None:
    """One result as a JSON line on stdout (flushed: a long run shows its progress), appended to ``out_json`` too."""
    text = json.dumps(line)
    print(text, flush=True)
    if out_json is not None:
        with out_json.open("a") as fh:
            fh.write(text + "\n")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]], right: int = 1) -> str:
    """A markdown table; columns from ``right`` on are right-aligned (numbers)."""
    align = ["---" if i < right else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="benchmark.py measure", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give a command after --")
    result = measure(command)
    print(json.dumps(result))
    return int(result["returncode"] or 0)
