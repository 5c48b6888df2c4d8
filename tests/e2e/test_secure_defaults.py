"""Secure defaults of the launcher (`make serve`), on the session's real tritonserver: loopback
only, and no model load or unload from outside the server."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from specdec import names
from specdec_client import GenerationParams, generate
from tests.e2e.conftest import post


def listening(pid: int) -> set[str]:
    """host:port (hex, as /proc/net/tcp spells it) of the TCP sockets `pid` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    out = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:   # LISTEN
                out.add(fields[1])
    return out


def test_every_endpoint_listens_on_loopback_only(server):
    addresses = listening(server.triton_pid)
    ports = {int(a.rsplit(":", 1)[1], 16) for a in addresses}
    assert {int(e.rsplit(":", 1)[1]) for e in (server.http, server.grpc, server.metrics)} <= ports
    loopback = ("0100007F", "0000000000000000FFFF00000100007F",     # 127.0.0.1, ::ffff:127.0.0.1
                "00000000000000000000000001000000")                 # ::1
    assert all(a.rsplit(":", 1)[0] in loopback for a in addresses), addresses


@pytest.mark.parametrize("path", ["/v2/repository/index",
                                  f"/v2/repository/models/{names.DRAFT_MODEL}/unload",
                                  f"/v2/repository/models/{names.TARGET_MODEL}/load"])
def test_model_repository_api_is_closed_over_http(server, path):
    status, reply = post(server, path, {})
    assert status == 403 and "restricted" in reply["error"], (status, reply)


def test_model_repository_api_is_closed_over_grpc(server):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException
    client = grpcclient.InferenceServerClient(server.grpc)
    for call in (lambda: client.unload_model(names.DRAFT_MODEL),
                 lambda: client.load_model(names.TARGET_MODEL),
                 lambda: client.get_model_repository_index()):
        with pytest.raises(InferenceServerException) as err:
            call()
        assert "restricted" in err.value.message().lower(), err.value
    # Nothing was unloaded: the models still serve.
    for model in (names.DRAFT_MODEL, names.TARGET_MODEL):
        assert client.is_model_ready(model)
    assert generate(server.http, "def f():", GenerationParams(max_tokens=4)).num_output_tokens == 4
