"""A local Apache Flink or Spark cluster on 127.0.0.1 for Beam's portable runners (scripts/cluster.sh runs it).

    scripts/cluster.sh flink fetch     # downloads everything once (pip, Maven Central) into .cluster/
    scripts/cluster.sh flink start     # starts what is not running; stdout: the Beam options for convert
    scripts/cluster.sh flink status    # ROLE PID per running process; exit 1 if none runs
    scripts/cluster.sh flink stop      # ends the processes it started, by pid
    python -m beam_pipeline convert --input DIR --output OUT $(scripts/cluster.sh flink start)

Flink: a JobManager and one TaskManager with 2 slots; Spark: a standalone master and one worker with 2 cores.
Each engine also gets Beam's job server (the runner's Java side, which translates the pipeline and submits it
to the cluster) and a Python worker pool (environment type EXTERNAL: the cluster's tasks ask it for SDK
workers, which run this checkout's beam_pipeline with the virtualenv's Python).

The worker pool runs as another host would see it: its own /tmp (a bind mount in a private mount namespace,
``unshare --mount``; where that is not allowed, only TMPDIR) and its own working folder. A file one side writes
into its /tmp and the other side expects fails here as it would across machines; input and output must be on
storage both sides see (a shared folder outside /tmp, or gs://).

Versions (docs/engines.md says why): Flink 1.19.3, Spark 3.5.9, Beam's runner jars 2.62.0 (Maven Central
serves no ``*-job-server`` jar; the job server is Beam's runner jar started with its main class and its
Maven classpath). Java: JAVA_HOME if it is Java 17, else /usr/lib/jvm's Java 17.

Everything lives in BEAM_CLUSTER_HOME (default: .cluster/ in the checkout, ignored by git): downloads, the
unpacked distributions, Maven's local repository, and run/<engine>/ with pid files, logs, config and the
engine's temporary folders. Nothing is downloaded by ``start`` once ``fetch`` has run.

The cluster runs in a network namespace with loopback only (``ip netns``, root): Beam's job server and the
TaskManager's Fn API servers listen on every interface, so only the job service, artifact service and web UI
are relayed to this host's 127.0.0.1 (scripts/netns_forward.py). BEAM_CLUSTER_NETNS=off runs it in this host's
network instead; BEAM_CLUSTER_PRIVATE_TMP=off lets the worker pool see this host's /tmp.

Ports (127.0.0.1 only), each changeable by the environment variable of the same name:
FLINK_REST_PORT 8081, FLINK_RPC_PORT 6123, FLINK_BLOB_PORT 6124, FLINK_TM_RPC_PORT 6125, FLINK_TM_DATA_PORT
6126, FLINK_JOB_PORT 8099, FLINK_ARTIFACT_PORT 8098, FLINK_EXPANSION_PORT 8097, FLINK_POOL_PORT 50000;
SPARK_MASTER_PORT 7077, SPARK_MASTER_UI_PORT 8080, SPARK_WORKER_PORT 7078, SPARK_WORKER_UI_PORT 8085,
SPARK_JOB_PORT 8199, SPARK_ARTIFACT_PORT 8198, SPARK_EXPANSION_PORT 8197, SPARK_POOL_PORT 50100.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
HOME = Path(os.environ.get("BEAM_CLUSTER_HOME") or ROOT / ".cluster").resolve()
FLINK_VERSION = "1.19.3"
SPARK_VERSION = "3.5.9"
BEAM_RUNNER_VERSION = "2.62.0"
RUNNER_ARTIFACT = {"flink": "beam-runners-flink-1.19", "spark": "beam-runners-spark-3"}
JOB_SERVER_MAIN = {
    "flink": "org.apache.beam.runners.flink.FlinkJobServerDriver",
    "spark": "org.apache.beam.runners.spark.SparkJobServerDriver",
}
ROLES = {
    "flink": ("jobmanager", "taskmanager", "jobserver", "workerpool"),
    "spark": ("master", "worker", "jobserver", "workerpool"),
}
DEFAULT_PORTS = {
    "FLINK_REST_PORT": 8081,
    "FLINK_RPC_PORT": 6123,
    "FLINK_BLOB_PORT": 6124,
    "FLINK_TM_RPC_PORT": 6125,
    "FLINK_TM_DATA_PORT": 6126,
    "FLINK_JOB_PORT": 8099,
    "FLINK_ARTIFACT_PORT": 8098,
    "FLINK_EXPANSION_PORT": 8097,
    "FLINK_POOL_PORT": 50000,
    "SPARK_MASTER_PORT": 7077,
    "SPARK_MASTER_UI_PORT": 8080,
    "SPARK_WORKER_PORT": 7078,
    "SPARK_WORKER_UI_PORT": 8085,
    "SPARK_JOB_PORT": 8199,
    "SPARK_ARTIFACT_PORT": 8198,
    "SPARK_EXPANSION_PORT": 8197,
    "SPARK_POOL_PORT": 50100,
}
# The java.base packages Flink's and Spark's own launch scripts open on Java 17 (the job server runs their
# client code in a plain `java -jar`).
JAVA_OPENS = [
    f"--add-opens=java.base/{p}=ALL-UNNAMED"
    for p in (
        "java.lang",
        "java.lang.invoke",
        "java.lang.reflect",
        "java.io",
        "java.net",
        "java.nio",
        "java.text",
        "java.time",
        "java.util",
        "java.util.concurrent",
        "java.util.concurrent.atomic",
        "java.util.concurrent.locks",
        "sun.nio.ch",
        "sun.nio.cs",
        "sun.security.action",
        "sun.util.calendar",
    )
] + ["--add-exports=java.base/sun.net.util=ALL-UNNAMED"]
START_TIMEOUT_S = 180


class ClusterError(Exception):
    """A step that failed, said in one line (the logs hold the rest)."""


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def port(name: str) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else DEFAULT_PORTS[name]
    except ValueError:
        raise ClusterError(f"{name}={value!r}: not a port number") from None


def java_home() -> str:
    given = os.environ.get("JAVA_HOME", "")
    if given and _java_major(given) == 17:
        return given
    for candidate in sorted(Path("/usr/lib/jvm").glob("*17*")):
        if _java_major(str(candidate)) == 17:
            return str(candidate)
    raise ClusterError("no Java 17 found (JAVA_HOME or /usr/lib/jvm/*17*): Flink 1.19 and Spark 3.5 need it")


def _java_major(home: str) -> int | None:
    release = Path(home, "release")
    if not Path(home, "bin", "java").exists() or not release.exists():
        return None
    for line in release.read_text().splitlines():
        if line.startswith("JAVA_VERSION="):
            version = line.split("=", 1)[1].strip('"')
            return int(version.split(".")[0])
    return None


# ---- fetch (set-up time: the only step that downloads) -------------------------------------------------


def dist_dir(engine: str) -> Path:
    return HOME / (f"flink-{FLINK_VERSION}" if engine == "flink" else f"spark-{SPARK_VERSION}")


def launcher_jar(engine: str) -> Path:
    return HOME / "jobserver" / f"{RUNNER_ARTIFACT[engine]}-{BEAM_RUNNER_VERSION}-jobserver.jar"


def fetched(engine: str) -> bool:
    return (dist_dir(engine) / ".complete").exists() and launcher_jar(engine).exists()


def fetch(engine: str) -> None:
    HOME.mkdir(parents=True, exist_ok=True)
    if not (dist_dir(engine) / ".complete").exists():
        _fetch_distribution(engine)
    if not launcher_jar(engine).exists():
        _fetch_job_server(engine)


def _pip_download(spec: str, *options: str) -> Path:
    folder = HOME / "downloads"
    folder.mkdir(parents=True, exist_ok=True)
    say(f"cluster: downloading {spec} from PyPI")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(folder), *options, spec]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise ClusterError(f"pip download {spec} failed: {_last_line(done.stderr)}")
    name = spec.split("==")[0].replace("-", "_").lower()
    version = spec.split("==")[1]
    for path in folder.iterdir():
        stem = path.name.replace("-", "_").lower()
        if stem.startswith(f"{name}_{version}"):
            return path
    raise ClusterError(f"pip download {spec}: no file for it in {folder}")


def _fetch_distribution(engine: str) -> None:
    target = dist_dir(engine)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=HOME))
    try:
        if engine == "flink":
            # bin/ and conf/ come in the wheel, lib/ opt/ plugins/ in the libraries' sdist. Only unpacked: installing
            # apache-flink would pull in its pinned (old) apache-beam.
            wheel = _pip_download(
                f"apache-flink=={FLINK_VERSION}",
                "--only-binary=:all:",
                "--python-version=3.11",
                "--platform=manylinux2014_x86_64",
            )
            with zipfile.ZipFile(wheel) as z:
                for name in z.namelist():
                    if name.startswith(("pyflink/bin/", "pyflink/conf/")) and not name.endswith("/"):
                        out = staging / name[len("pyflink/") :]
                        out.parent.mkdir(parents=True, exist_ok=True)
                        out.write_bytes(z.read(name))
            _unpack_deps(_pip_download(f"apache-flink-libraries=={FLINK_VERSION}", "--no-binary=:all:"), staging)
            jar = staging / "bin" / "bash-java-utils.jar"
            if not jar.exists():
                raise ClusterError("apache-flink-libraries has no deps/bin/bash-java-utils.jar")
        else:
            _unpack_deps(_pip_download(f"pyspark=={SPARK_VERSION}", "--no-binary=:all:"), staging)
        for script in list((staging / "bin").iterdir()) + list((staging / "sbin").glob("*")):
            script.chmod(0o755)
        (staging / ".complete").write_text(f"{engine}\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _unpack_deps(sdist: Path, staging: Path) -> None:
    """The sdist's deps/ folder (a binary distribution's layout) into ``staging``."""
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/", 2)
            if len(parts) < 3 or parts[1] != "deps" or not (member.isfile() or member.issym()):
                continue
            if member.issym():
                continue  # deps/ links point into the Python package (pyspark's python/); not needed
            out = staging / parts[2]
            out.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            with open(out, "wb") as f:
                shutil.copyfileobj(source, f)


def _fetch_job_server(engine: str) -> None:
    """Beam's runner jar and its dependencies from Maven Central (Maven's local repository in HOME/m2), and a
    launcher jar whose manifest names the job server's main class and that classpath."""
    if not shutil.which("mvn"):
        raise ClusterError("mvn not found: Maven fetches Beam's runner jars from Maven Central")
    folder = HOME / "jobserver" / RUNNER_ARTIFACT[engine]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pom.xml").write_text(
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>beam_pipeline.cluster</groupId><artifactId>{engine}-jobserver</artifactId><version>1</version>"
        "<packaging>pom</packaging><dependencies><dependency><groupId>org.apache.beam</groupId>"
        f"<artifactId>{RUNNER_ARTIFACT[engine]}</artifactId><version>{BEAM_RUNNER_VERSION}</version>"
        "</dependency></dependencies></project>\n"
    )
    say(f"cluster: resolving org.apache.beam:{RUNNER_ARTIFACT[engine]}:{BEAM_RUNNER_VERSION} from Maven Central")
    done = subprocess.run(
        [
            "mvn",
            "-q",
            "-B",
            f"-Dmaven.repo.local={HOME / 'm2'}",
            "dependency:build-classpath",
            "-Dmdep.outputFile=classpath.txt",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        errors = [line for line in done.stdout.splitlines() if "[ERROR]" in line]
        raise ClusterError(f"mvn could not resolve the job server: {errors[0] if errors else _last_line(done.stderr)}")
    jars = [Path(p) for p in (folder / "classpath.txt").read_text().strip().split(os.pathsep) if p]
    if engine == "spark":
        # Spark itself is a "provided" dependency of Beam's runner: the cluster's own jars.
        jars += sorted((dist_dir(engine) / "jars").glob("*.jar"))
    jar = launcher_jar(engine)
    class_path = " ".join(quote(os.path.relpath(p, jar.parent)) for p in jars)
    manifest = _manifest({"Manifest-Version": "1.0", "Main-Class": JOB_SERVER_MAIN[engine], "Class-Path": class_path})
    partial = jar.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w") as z:
        z.writestr("META-INF/MANIFEST.MF", manifest)
    partial.rename(jar)


def _manifest(fields: dict[str, str]) -> bytes:
    """A JAR manifest: lines of at most 72 bytes, longer ones continued on lines that start with a space."""
    out = bytearray()
    for key, value in fields.items():
        line = f"{key}: {value}".encode()
        out += line[:72] + b"\r\n"
        for i in range(72, len(line), 71):
            out += b" " + line[i : i + 71] + b"\r\n"
    return bytes(out + b"\r\n")


# ---- processes -------------------------------------------------------------------------------------------


def run_dir(engine: str) -> Path:
    return HOME / "run" / engine


def _pid_file(engine: str, role: str) -> Path:
    return run_dir(engine) / "pids" / f"{role}.json"


def proc_fields(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first: field 3 of proc(5) is index 0), or None if
    the process is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22), or None if it is gone or a zombie: a pid file names
    one process, never a later one that got the same pid."""
    fields = proc_fields(pid)
    return fields[19] if fields else None


def running(engine: str, role: str) -> int | None:
    try:
        record = json.loads(_pid_file(engine, role).read_text())
    except (OSError, ValueError):
        return None
    pid = int(record["pid"])
    return pid if _start_ticks(pid) == record["start"] else None


def netns(engine: str) -> str | None:
    """The engine's network namespace (loopback only), or None when BEAM_CLUSTER_NETNS=off."""
    if os.environ.get("BEAM_CLUSTER_NETNS", "").lower() in ("off", "0", "no"):
        return None
    # One per BEAM_CLUSTER_HOME: two checkouts' clusters never share (or delete) each other's namespace.
    return f"beam-{engine}-{hashlib.sha1(str(HOME).encode()).hexdigest()[:8]}"


def _ensure_netns(engine: str) -> None:
    name = netns(engine)
    if name is None:
        say(
            "cluster: BEAM_CLUSTER_NETNS=off: Beam's job server and the TaskManager's Fn API servers listen on "
            "every interface of this host"
        )
        return
    if not Path(f"/var/run/netns/{name}").exists():
        done = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
        if done.returncode:
            raise ClusterError(
                f"ip netns add {name}: {_last_line(done.stderr)} (needs root and iproute2; "
                "BEAM_CLUSTER_NETNS=off runs the cluster in this host's network instead)"
            )
    done = subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], capture_output=True, text=True)
    if done.returncode:
        raise ClusterError(f"ip -n {name} link set lo up: {_last_line(done.stderr)}")


def _answers_inside(engine: str, p: int) -> bool:
    """Whether 127.0.0.1:``p`` answers where the cluster runs (its namespace, or this host's network)."""
    name = netns(engine)
    if name is None:
        return _listening(p)
    from netns_forward import NamespaceDialer

    return NamespaceDialer(name).answers(p)


def _launch(
    engine: str, role: str, cmd: list[str], env: dict[str, str], cwd: Path | None = None, forward: tuple[int, ...] = ()
) -> int:
    """Starts a role in the engine's namespace; ``forward``: its ports that answer on the host's 127.0.0.1 too
    (through scripts/netns_forward.py, whose pid is then the role's)."""
    name = netns(engine)
    if name and forward:
        relay = [sys.executable, str(ROOT / "scripts" / "netns_forward.py"), "--netns", name]
        cmd = [*relay, *(f"--forward={p}" for p in forward), "--", *cmd]
    elif name:
        cmd = ["ip", "netns", "exec", name, *cmd]
    logs = run_dir(engine) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{role}.log", "ab") as log:
        log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
        log.flush()
        # Its own session (process group = its pid): stop ends the role and whatever it started, by that pid.
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=cwd or run_dir(engine),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    ticks = _start_ticks(proc.pid)
    pid_file = _pid_file(engine, role)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(json.dumps({"pid": proc.pid, "start": ticks, "cmd": cmd[:3]}) + "\n")
    return proc.pid


def _wait_for(what: str, ready: Callable[[], bool], engine: str, role: str, pid: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if _start_ticks(pid) is None:
            raise ClusterError(f"{engine} {role} (pid {pid}) exited while starting: see {_log(engine, role)}")
        if ready():
            return
        time.sleep(0.5)
    late = f"{what} not ready after {START_TIMEOUT_S} s"
    raise ClusterError(f"{engine} {role} (pid {pid}): {late}: see {_log(engine, role)}")


def _log(engine: str, role: str) -> Path:
    return run_dir(engine) / "logs" / f"{role}.log"


def _listening(p: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", p)) == 0


def _http_json(url: str) -> dict | list | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return json.loads(response.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None


def _base_env(engine: str) -> dict[str, str]:
    env = dict(os.environ)
    env["JAVA_HOME"] = java_home()
    env["PATH"] = f"{env['JAVA_HOME']}/bin{os.pathsep}{env.get('PATH', '')}"
    return env


def _flink_conf(engine: str) -> Path:
    conf = run_dir(engine) / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    for name in ("log4j.properties", "log4j-console.properties", "logback.xml", "logback-console.xml"):
        shutil.copy(dist_dir(engine) / "conf" / name, conf / name)
    tmp = run_dir(engine) / "flink-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    settings = {
        "env.java.opts.all": " ".join(JAVA_OPENS),
        "jobmanager.bind-host": "127.0.0.1",
        "jobmanager.rpc.address": "127.0.0.1",
        "jobmanager.rpc.port": port("FLINK_RPC_PORT"),
        "jobmanager.memory.process.size": "1024m",
        "jobmanager.execution.failover-strategy": "region",
        "taskmanager.bind-host": "127.0.0.1",
        "taskmanager.host": "127.0.0.1",
        "taskmanager.rpc.port": port("FLINK_TM_RPC_PORT"),
        "taskmanager.data.port": port("FLINK_TM_DATA_PORT"),
        "taskmanager.numberOfTaskSlots": 2,
        "taskmanager.memory.process.size": "2048m",
        # Beam's batch translation sets up many result partitions per task; Flink's default network share
        # (~160 MB of 2 GB) failed deployments with "Insufficient number of network buffers".
        "taskmanager.memory.network.min": "384mb",
        "taskmanager.memory.network.max": "384mb",
        "parallelism.default": 2,
        "rest.address": "127.0.0.1",
        "rest.bind-address": "127.0.0.1",
        "rest.port": port("FLINK_REST_PORT"),
        "blob.server.port": port("FLINK_BLOB_PORT"),
        "io.tmp.dirs": str(tmp),
        # A lost TaskManager fails its tasks; the job restarts them once slots are back (a new TaskManager:
        # `cluster.sh flink start`) instead of failing at once. Attempts made while the dead TaskManager is still
        # registered fail fast, hence several, 5 s apart (not many: a failure in the pipeline's own code fails
        # every attempt the same way).
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": 6,
        "restart-strategy.fixed-delay.delay": "5 s",
        "heartbeat.interval": 2000,
        "heartbeat.timeout": 10000,
    }
    (conf / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in settings.items()))
    return conf


def _flink_env(engine: str) -> dict[str, str]:
    env = _base_env(engine)
    env["FLINK_CONF_DIR"] = str(_flink_conf(engine))
    env["FLINK_LOG_DIR"] = str(run_dir(engine) / "logs")
    env["FLINK_PID_DIR"] = str(run_dir(engine) / "pids")
    return env


def _spark_env(engine: str) -> dict[str, str]:
    env = _base_env(engine)
    env["SPARK_HOME"] = str(dist_dir(engine))
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["SPARK_LOG_DIR"] = str(run_dir(engine) / "logs")
    env["SPARK_PID_DIR"] = str(run_dir(engine) / "pids")
    env["SPARK_WORKER_DIR"] = str(run_dir(engine) / "spark-work")
    env["SPARK_LOCAL_DIRS"] = str(run_dir(engine) / "spark-tmp")
    # The master drops a worker that stopped answering after 15 s (default 60 s).
    env["SPARK_MASTER_OPTS"] = "-Dspark.worker.timeout=15"
    return env


def _start_role(engine: str, role: str) -> None:
    dist = dist_dir(engine)
    if role in ("jobmanager", "taskmanager"):
        env = _flink_env(engine)
        if role == "jobmanager":
            cmd = [str(dist / "bin" / "jobmanager.sh"), "start-foreground"]
            pid = _launch(engine, role, cmd, env, forward=(port("FLINK_REST_PORT"),))
            _wait_for("REST API", lambda: _http_json(_flink_url("/overview")) is not None, engine, role, pid)
        else:
            resource = f"taskmanager-{int(time.time() * 1000)}"
            script = str(dist / "bin" / "taskmanager.sh")
            cmd = [script, "start-foreground", "-D", f"taskmanager.resource-id={resource}"]
            pid = _launch(engine, role, cmd, env)
            _wait_for("registration", lambda: _flink_has_taskmanager(resource), engine, role, pid)
    elif role in ("master", "worker"):
        env = _spark_env(engine)
        for key in ("SPARK_WORKER_DIR", "SPARK_LOCAL_DIRS"):
            Path(env[key]).mkdir(parents=True, exist_ok=True)
        daemon = [str(dist / "bin" / "spark-class"), f"org.apache.spark.deploy.{role}.{role.title()}", "--host"]
        if role == "master":
            ports = ["--port", str(port("SPARK_MASTER_PORT")), "--webui-port", str(port("SPARK_MASTER_UI_PORT"))]
            pid = _launch(engine, role, [*daemon, "127.0.0.1", *ports], env, forward=(port("SPARK_MASTER_UI_PORT"),))
            _wait_for("master", lambda: _http_json(_spark_url("/json/")) is not None, engine, role, pid)
        else:
            ports = ["--port", str(port("SPARK_WORKER_PORT")), "--webui-port", str(port("SPARK_WORKER_UI_PORT"))]
            size = ["--cores", "2", "--memory", "3g", f"spark://127.0.0.1:{port('SPARK_MASTER_PORT')}"]
            # Each job's executor fetches the job server's whole classpath (Beam stages it as spark.jars: ~420 MB,
            # 500 jars) into spark-work/APP/; Spark keeps that forever unless the worker cleans up finished apps.
            # Their folders (with the executors' logs) go 15 min after their last write.
            env["SPARK_WORKER_OPTS"] = (
                "-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.interval=60 "
                "-Dspark.worker.cleanup.appDataTtl=900"
            )
            pid = _launch(engine, role, [*daemon, "127.0.0.1", *ports, *size], env)
            _wait_for("registration", lambda: _spark_has_worker(), engine, role, pid)
    elif role == "jobserver":
        prefix = engine.upper()
        env = _flink_env(engine) if engine == "flink" else _spark_env(engine)
        artifacts = run_dir(engine) / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        master = (
            f"--flink-master=127.0.0.1:{port('FLINK_REST_PORT')}"
            if engine == "flink"
            else f"--spark-master-url=spark://127.0.0.1:{port('SPARK_MASTER_PORT')}"
        )
        launch = ["-jar", str(launcher_jar(engine))]
        if engine == "spark":
            # Beam's Maven classpath brings slf4j-api 1.7, which finds no binding for Spark's log4j2 (an SLF4J 2
            # provider): the job server, i.e. the Spark driver, then logged nothing at all. Spark's slf4j-api 2 first.
            slf4j = [str(p) for p in sorted((dist_dir(engine) / "jars").glob("slf4j-api-*.jar"))]
            class_path = os.pathsep.join([*slf4j, str(launcher_jar(engine))])
            # The executors get the same classpath, in the same order, ahead of Spark's jars/ (they run on this
            # host). With only Spark's jars first, every executor's first task failed on Spark's Guava 14
            # ("NoSuchMethodError: ...Preconditions.checkState(boolean, java.lang.String, long)", from gcsio while
            # it deserialized the pipeline options) and Spark retried it.
            launch = [f"-Dspark.executor.extraClassPath={class_path}", "-cp", class_path, JOB_SERVER_MAIN[engine]]
        cmd = [
            str(Path(env["JAVA_HOME"], "bin", "java")),
            *JAVA_OPENS,
            "-Dspark.driver.host=127.0.0.1",
            "-Dspark.driver.bindAddress=127.0.0.1",
            # A lost executor (its worker killed) is noticed in seconds, not after Spark's default 120 s.
            "-Dspark.network.timeout=20s",
            "-Dspark.network.timeoutInterval=10s",
            "-Dspark.executor.heartbeatInterval=5s",
            *launch,
            master,
            "--job-host=127.0.0.1",
            f"--job-port={port(prefix + '_JOB_PORT')}",
            f"--artifact-port={port(prefix + '_ARTIFACT_PORT')}",
            f"--expansion-port={port(prefix + '_EXPANSION_PORT')}",
            f"--artifacts-dir={artifacts}",
        ]
        if engine == "flink":
            cmd.append(f"--flink-conf-dir={env['FLINK_CONF_DIR']}")
        jobs = (port(prefix + "_JOB_PORT"), port(prefix + "_ARTIFACT_PORT"))
        pid = _launch(engine, role, cmd, env, forward=jobs)
        _wait_for("job service", lambda: all(_listening(p) for p in jobs), engine, role, pid)
    else:
        _start_pool(engine)


PRIVATE_TMP_MARKER = "pool-has-private-tmp"


def _start_pool(engine: str) -> None:
    """The worker pool as another host would run it: its own /tmp and working folder."""
    pool_port = port(f"{engine.upper()}_POOL_PORT")
    own_tmp = run_dir(engine) / "pool-tmp"
    own_cwd = run_dir(engine) / "pool-cwd"
    for folder in (own_tmp, own_cwd):
        folder.mkdir(parents=True, exist_ok=True)
    # The workers' Beam SDK: .venv's (the pins); BEAM_CLUSTER_PYTHON names another (the newest lane's, by hand)
    venv_python = ROOT / ".venv" / "bin" / "python"
    python = os.environ.get("BEAM_CLUSTER_PYTHON") or (str(venv_python) if venv_python.exists() else sys.executable)
    pool = [python, str(ROOT / "scripts" / "worker_pool.py"), "--port", str(pool_port)]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("TMPDIR", None)
    shared_tmp = os.environ.get("BEAM_CLUSTER_PRIVATE_TMP", "").lower() in ("off", "0", "no")
    if shared_tmp:
        say("cluster: BEAM_CLUSTER_PRIVATE_TMP=off: the worker pool sees this host's /tmp (its TMPDIR is its own)")
        env["TMPDIR"] = str(own_tmp)
        cmd = pool
    elif ROOT.resolve().is_relative_to("/tmp"):
        say(
            "cluster: this checkout is under /tmp, which a /tmp of the pool's own would hide from it: the worker "
            "pool sees this host's /tmp (its TMPDIR is its own)"
        )
        env["TMPDIR"] = str(own_tmp)
        cmd = pool
    elif _private_tmp_works(own_tmp):
        say(
            "cluster: the worker pool has a /tmp of its own, as on another host: input and output must be outside "
            "/tmp (BEAM_CLUSTER_PRIVATE_TMP=off shares it)"
        )
        cmd = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            'mount --bind "$0" /tmp && exec "$@"',
            str(own_tmp),
            *pool,
        ]
    else:
        say("cluster: no private mount namespace here (unshare --mount): the worker pool gets only its own TMPDIR")
        env["TMPDIR"] = str(own_tmp)
        cmd = pool
    marker = run_dir(engine) / PRIVATE_TMP_MARKER  # the tests that need the pool's own /tmp look for it
    if cmd is pool:
        marker.unlink(missing_ok=True)
    else:
        marker.touch()
    pid = _launch(engine, "workerpool", cmd, env, cwd=own_cwd)
    _wait_for("worker pool", lambda: _answers_inside(engine, pool_port), engine, "workerpool", pid)


def _private_tmp_works(folder: Path) -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", 'mount --bind "$0" /tmp', str(folder)],
        capture_output=True,
    )
    return probe.returncode == 0


def _flink_url(path: str) -> str:
    return f"http://127.0.0.1:{port('FLINK_REST_PORT')}{path}"


def _spark_url(path: str) -> str:
    return f"http://127.0.0.1:{port('SPARK_MASTER_UI_PORT')}{path}"


def _flink_has_taskmanager(resource: str) -> bool:
    answer = _http_json(_flink_url("/taskmanagers"))
    return isinstance(answer, dict) and any(tm.get("id") == resource for tm in answer.get("taskmanagers", []))


def _spark_has_worker() -> bool:
    answer = _http_json(_spark_url("/json/"))
    wanted = f"127.0.0.1:{port('SPARK_WORKER_PORT')}"
    return isinstance(answer, dict) and any(
        w.get("state") == "ALIVE" and w.get("host") == "127.0.0.1" and str(w.get("port")) == wanted.split(":")[1]
        for w in answer.get("workers", [])
    )


def options_line(engine: str) -> str:
    if engine == "flink":
        words = [
            "--runner=FlinkRunner",
            f"--flink_master=127.0.0.1:{port('FLINK_REST_PORT')}",
            "--flink_version=1.19",
            f"--job_endpoint=127.0.0.1:{port('FLINK_JOB_PORT')}",
        ]
    else:
        words = [
            "--runner=SparkRunner",
            f"--spark_master_url=spark://127.0.0.1:{port('SPARK_MASTER_PORT')}",
            f"--job_endpoint=127.0.0.1:{port('SPARK_JOB_PORT')}",
            # Spark's tasks release their stage's environment when they end; without a cache the SDK worker is
            # stopped and another started (~2 s each) whenever none is in use: 27 times in one 90-image run
            # (134 s; 76 s with the cache).
            "--environment_cache_millis=60000",
        ]
    pool = port(f"{engine.upper()}_POOL_PORT")
    words += ["--environment_type=EXTERNAL", f"--environment_config=127.0.0.1:{pool}", "--parallelism=2"]
    return " ".join(words)


def start(engine: str) -> None:
    if not fetched(engine):
        fetch(engine)
    _ensure_netns(engine)
    if not any(running(engine, role) for role in ROLES[engine]):
        _clear_scratch(engine)  # a run killed before its stop left them
    for role in ROLES[engine]:
        pid = running(engine, role)
        if pid:
            say(f"cluster: {engine} {role} already running (pid {pid})")
            continue
        say(f"cluster: starting {engine} {role}")
        _start_role(engine, role)
        say(f"cluster: {engine} {role} running (pid {running(engine, role)})")
    print(options_line(engine), flush=True)


def status(engine: str) -> int:
    alive = [(role, running(engine, role)) for role in ROLES[engine]]
    for role, pid in alive:
        if pid:
            print(f"{role} {pid}")  # stdout: one "role pid" line each (the tests and benchmarks read them)
    if not any(pid for _, pid in alive):
        say(f"cluster {engine}: nothing running")
        return 1
    return 0


def stop(engine: str) -> None:
    """Ends each role it started, with whatever that role started (its process group), by pid."""
    for role in reversed(ROLES[engine]):
        pid = running(engine, role)
        if pid:
            say(f"cluster: stopping {engine} {role} (pid {pid})")
            _end_group(pid)
        _pid_file(engine, role).unlink(missing_ok=True)
    name = netns(engine)
    if name and Path(f"/var/run/netns/{name}").exists():
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    if not any(running(engine, role) for role in ROLES[engine]):
        _clear_scratch(engine)


# What a cluster writes while it runs and nobody reads after it stops: Flink's spill and blob files, Spark's
# per-job copies of the job server's classpath (~420 MB a job), the staged artifacts, the worker pool's /tmp.
# One cluster layer left 2.5 GB of them; a full disk then failed the next run. The logs stay.
SCRATCH = ("flink-tmp", "spark-tmp", "spark-work", "artifacts", "pool-tmp", "pool-cwd")


def _clear_scratch(engine: str) -> None:
    for name in SCRATCH:
        shutil.rmtree(run_dir(engine) / name, ignore_errors=True)


def _end_group(pid: int) -> None:
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if _group_gone(pid):
                return
            time.sleep(0.2)


def _group_gone(pgid: int) -> bool:
    """No live (non-zombie) process is left in process group ``pgid``."""
    for entry in Path("/proc").iterdir():
        fields = proc_fields(entry.name) if entry.name.isdigit() else None
        if fields and int(fields[2]) == pgid:
            return False
    return True


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def main(argv: list[str]) -> int:
    usage = "usage: scripts/cluster.sh flink|spark fetch|start|stop|status"
    if len(argv) != 2 or argv[0] not in ROLES or argv[1] not in ("fetch", "start", "stop", "status"):
        say(usage)
        return 2
    engine, action = argv
    try:
        if action == "fetch":
            fetch(engine)
        elif action == "start":
            start(engine)
        elif action == "stop":
            stop(engine)
        else:
            return status(engine)
    except ClusterError as e:
        say(f"error: cluster {engine} {action}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
