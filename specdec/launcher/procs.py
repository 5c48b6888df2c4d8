"""A launched server's processes, read from /proc (Linux): the launcher keeps tritonserver as its
child (keeper.py), and tritonserver forks one Python-backend process per model instance."""
from __future__ import annotations

from pathlib import Path

STUB = b"triton_python_backend_stub"


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _argv(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def tritonserver(launcher: int) -> int | None:
    """The launcher's tritonserver child now running, if any (None while it restarts)."""
    for pid in children(launcher):
        argv = _argv(pid)
        if argv and argv[0].endswith(b"tritonserver"):
            return pid
    return None


def backends(server: int) -> dict[str, int]:
    """model name -> its backend process's pid (instance 0: `<model>_0_0` in the stub's argv)."""
    out = {}
    for pid in children(server):
        argv = _argv(pid)
        if len(argv) > 8 and argv[0].endswith(STUB):
            out[argv[8].decode().rsplit("_0_", 1)[0]] = pid
    return out


def server_processes(launcher: int) -> dict[str, int]:
    """{"tritonserver": pid, <model>: pid, ...}; empty while no server runs."""
    server = tritonserver(launcher)
    return {} if server is None else {"tritonserver": server, **backends(server)}
