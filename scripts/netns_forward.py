"""Run a command in a loopback-only network namespace and forward some of its ports to this host's 127.0.0.1.

Beam's job server and the Flink TaskManager's Fn API servers listen on every interface, whatever host they are
given. scripts/cluster.py therefore runs the cluster's processes inside a network namespace that has only a
loopback device (``ip netns``), and this program, outside it, makes the ports a client needs (the job service,
the artifact service, the web UI) answer on the host's 127.0.0.1 and nowhere else.

    python scripts/netns_forward.py --netns beam-flink --forward 8099 --forward 8098 -- java -jar job-server.jar

It starts the command with ``ip netns exec``, listens on 127.0.0.1:PORT for each --forward once the command
answers on that port inside the namespace, and relays each connection. It ends when the command ends (with its
exit code); SIGTERM or SIGINT end the command first.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

CLONE_NEWNET = 0x40000000


class NamespaceDialer:
    """Connects to 127.0.0.1 ports inside a named network namespace: one thread that has entered it
    (setns applies to the calling thread) opens the sockets, which stay in that namespace."""

    def __init__(self, netns: str) -> None:
        self._requests: queue.Queue = queue.Queue()
        self._entered = threading.Event()
        self._error: OSError | None = None
        path = f"/var/run/netns/{netns}"
        threading.Thread(target=self._serve, args=(path,), daemon=True, name=f"dial-{netns}").start()
        self._entered.wait()
        if self._error:
            raise self._error

    def _serve(self, path: str) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(fd, CLONE_NEWNET) != 0:
                errno = ctypes.get_errno()
                raise OSError(errno, f"setns {path}: {os.strerror(errno)}")
            os.close(fd)
        except OSError as e:
            self._error = e
            self._entered.set()
            return
        self._entered.set()
        while True:
            port, timeout, reply = self._requests.get()
            try:
                reply.put(socket.create_connection(("127.0.0.1", port), timeout=timeout))
            except OSError as e:
                reply.put(e)

    def connect(self, port: int, timeout: float = 5.0) -> socket.socket:
        reply: queue.Queue = queue.Queue()
        self._requests.put((port, timeout, reply))
        result = reply.get()
        if isinstance(result, OSError):
            raise result
        result.settimeout(None)
        return result

    def answers(self, port: int) -> bool:
        try:
            self.connect(port, timeout=1.0).close()
            return True
        except OSError:
            return False


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _relay(client: socket.socket, dialer: NamespaceDialer, port: int) -> None:
    try:
        inside = dialer.connect(port)
    except OSError:
        client.close()
        return
    back = threading.Thread(target=_pump, args=(inside, client), daemon=True)
    back.start()
    _pump(client, inside)
    back.join()
    client.close()
    inside.close()


def _forward(port: int, dialer: NamespaceDialer, child: subprocess.Popen) -> None:
    while child.poll() is None and not dialer.answers(port):
        time.sleep(0.5)
    if child.poll() is not None:
        return
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_relay, args=(client, dialer, port), daemon=True).start()


def _end_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent (this relay) dies (prctl PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--netns", required=True)
    parser.add_argument("--forward", type=int, action="append", default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")
    dialer = NamespaceDialer(args.netns)
    # The command ends with this process even when it is killed outright (SIGKILL, by pid): a job server left
    # behind would hold its ports in the namespace and the next `cluster.sh start` could not start one.
    child = subprocess.Popen(["ip", "netns", "exec", args.netns, *command], preexec_fn=_end_with_parent)

    def stop(signum: int, _frame: object) -> None:
        child.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for port in args.forward:
        threading.Thread(target=_forward, args=(port, dialer, child), daemon=True).start()
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
