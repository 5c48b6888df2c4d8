"""One real tritonserver for the end-to-end tests, on free loopback ports, embedded default pair."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from specdec.launcher import procs

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 300


@dataclass
class Server:
    http: str       # host:port
    grpc: str
    metrics: str
    log: Path
    pid: int        # the launcher's: it keeps tritonserver as its child and restarts it

    @property
    def triton_pid(self) -> int:
        pid = procs.tritonserver(self.pid)
        if pid is None:
            raise LookupError("no tritonserver runs under the launcher now")
        return pid

    @property
    def grpc_status_codes(self) -> bool:
        """Whether our gRPC clients ask this server for status codes (triton_grpc_error)."""
        from tritonclient.grpc import InferenceServerClient

        from specdec_client.grpc_transport import server_version, stream_headers
        client = InferenceServerClient(self.grpc)
        try:
            return stream_headers(server_version(client, self.grpc)) is not None
        finally:
            client.close()

    def backend_pid(self, model: str) -> int:
        """The Python backend process of `model`."""
        try:
            return procs.backends(self.triton_pid)[model]
        except KeyError:
            raise LookupError(f"no backend process for {model}") from None

    def metric(self, name: str, **labels) -> float:
        """Sum of a Prometheus sample over series matching the labels."""
        text = urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=10).read().decode()
        total, found = 0.0, False
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
                found = True
        if not found:
            raise KeyError(f"{name}{labels} not on the metrics endpoint")
        return total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ready(http: str) -> bool:
    try:
        return urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=2).status == 200
    except OSError:
        return False


# The references the tests compute in process are float32 on the CPU: servers run the same,
# also on a GPU machine, unless a test asks for its device and dtype (test_exact_bf16.py).
REFERENCE_NUMERICS = {"SPECDEC_DEVICE": "cpu", "SPECDEC_DTYPE": "float32"}
# float32 leaves the batch-invariant arithmetic off by default (docs/exactness.md): a request's
# greedy text then equals its text alone only while no near-tie falls where batching moves a
# matmul's low bits. Servers whose tests compare concurrent requests with the same requests
# alone turn it on: the product guarantees the equality there. (The CI runs, about one in ten,
# that saw batched greedy text differ were the sampling defect fixed 2026-11-27, not this.)
BATCH_INVARIANT = {"SPECDEC_BATCH_INVARIANT": "on"}


# A test server's stop (test_shutdown.py tests the graceful one): a server whose gRPC streams
# were cancelled (the storm, the soak) or whose orchestrator died waits all of it, as Triton
# keeps the ensemble loaded (docs/deploy.md, "Shutdown and rollouts").
EXIT_S = 3


def launch(tmp_path_factory, env: dict[str, str] | None = None):
    """A tritonserver on free loopback ports with the embedded pair and `env` (SPECDEC_*) over
    it; yields it ready, stops it after."""
    http, grpc, metrics = _free_port(), _free_port(), _free_port()
    log = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    full = {k: v for k, v in os.environ.items() if not k.startswith("SPECDEC_")}
    full.update(REFERENCE_NUMERICS)
    full.update(env or {})
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "specdec.launcher.launch", f"--http-port={http}",
             f"--grpc-port={grpc}", f"--metrics-port={metrics}", f"--exit-timeout-secs={EXIT_S}"],
            cwd=ROOT, env=full, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not _ready(f"127.0.0.1:{http}"):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"tritonserver did not become ready:\n{log.read_text()[-4000:]}")
        time.sleep(0.25)
    yield Server(f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"127.0.0.1:{metrics}", log, proc.pid)
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The defaults (auto placements): the target's engine, the draft model beside it, in
    speculative_decoding's process; no BLS call a round, target_model loads nothing."""
    yield from launch(tmp_path_factory)


@pytest.fixture(scope="session")
def target_model_server(tmp_path_factory):
    """The target's engine in target_model (SPECDEC_TARGET_PLACEMENT=separate), the draft model
    beside it there: a BLS call a round, the supervisor restarting target_model's process."""
    yield from launch(tmp_path_factory, {"SPECDEC_TARGET_PLACEMENT": "separate"})


EAGLE_HEAD = ROOT / "models" / "default" / "eagle"   # the shipped head
EAGLE_FAULTS = 3   # the head's first runs fail (test_eagle.py)


@pytest.fixture(scope="session")
def eagle_server(tmp_path_factory):
    """The draft model in draft_model, a process of its own (two BLS calls a round), and the
    shipped EAGLE-3 head in target_model (SPECDEC_TARGET_PLACEMENT=separate), whose first runs
    fail by script: test_eagle.py's, and test_placement.py's separate placement (drafting with
    the draft model only)."""
    yield from launch(tmp_path_factory, {
        "SPECDEC_EAGLE_HEAD": str(EAGLE_HEAD), "SPECDEC_MAX_SEQUENCES": "2",
        "SPECDEC_IN_TARGET_FAULT": f"error*{EAGLE_FAULTS}", "SPECDEC_DRAFT_TIMEOUT_S": "600",
        "SPECDEC_DRAFT_PLACEMENT": "separate", "SPECDEC_TARGET_PLACEMENT": "separate"})


@pytest.fixture(scope="session")
def distilled(tmp_path_factory) -> tuple[Path, Path]:
    """(parallel draft, Medusa-1 heads): `specdec distill --method pard`, converting the
    default draft, and `--method medusa` on the default target, tiny runs."""
    from tests.core.distill_helpers import DEFAULT_TARGET, distill
    out = tmp_path_factory.mktemp("distilled")
    assert distill(DEFAULT_TARGET, out / "pard", "--method", "pard", "--from-draft",
                   str(DEFAULT_TARGET.parent / "draft"), "--steps", "4") == 0
    assert distill(DEFAULT_TARGET, out / "medusa", "--method", "medusa", "--steps", "8") == 0
    return out / "pard", out / "medusa"


SELF_SKIP = "2,4"   # the set `specdec tune --self` finds on the default target (docs/swift.md)


@pytest.fixture(scope="session")
def distilled_server(tmp_path_factory, distilled):
    """All served: test_distill_serve.py's parallel draft (the default proposer) and, in
    test_in_target_proposers.py, the heads (`proposer=medusa`) and the target skipping layers
    2 and 4 of its 6 (`proposer=self`). Nothing times out on a busy machine: the rounds are then
    exactly the in-process loop's."""
    draft, heads = distilled
    yield from launch(tmp_path_factory, {
        "SPECDEC_DRAFT_MODEL": str(draft), "SPECDEC_MEDUSA_HEADS": str(heads),
        "SPECDEC_SELF_SKIP": SELF_SKIP,
        "SPECDEC_MAX_SEQUENCES": "2", "SPECDEC_DEFAULT_PROPOSER": "draft",
        "SPECDEC_DRAFT_TIMEOUT_S": "600"})


def post(server: Server, path: str, body: dict) -> tuple[int, dict]:
    """Raw HTTP, for what the client would refuse to send."""
    return post_raw(server, path, json.dumps(body).encode())


def post_raw(server: Server, path: str, data: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://{server.http}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def wait_for(predicate, timeout=60.0) -> bool:
    """Poll until `predicate()` holds; a generous default deadline, since a busy 2-core
    machine is slow, and a condition that holds returns at once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def heldout_prompts(n: int) -> list[str]:
    lines = (ROOT / "models" / "default" / "heldout_prompts.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt"] for line in lines[:n]]


# A ChatML template: the default target's tokenizer has none (it was trained on code).
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def templated_tokenizer(tmp_path_factory) -> Path:
    """The default target's tokenizer files with a chat template added (the vocabulary
    unchanged), in a directory named like a served model: specdec-chat."""
    target = ROOT / "models" / "default" / "target"
    path = tmp_path_factory.mktemp("tok") / "specdec-chat"
    path.mkdir()
    for f in target.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy(f, path / f.name)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template"] = CHATML
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def start_gateway(grpc: str, tokenizer, tmp_path_factory) -> tuple[subprocess.Popen, str]:
    """`specdec openai` on a free loopback port in front of `grpc`: (process, base URL)."""
    port = _free_port()
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "specdec.cli", "openai", "--grpc-url", grpc, "--port",
             str(port), "--tokenizer", str(tokenizer)], cwd=ROOT, stdout=out,
            stderr=subprocess.STDOUT)

    def live():
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/health/live",
                                          timeout=2).status == 200
        except OSError:
            return False
    if not wait_for(live, 120):
        proc.kill()
        pytest.fail(f"the gateway did not start:\n{log.read_text()[-4000:]}")
    return proc, f"http://127.0.0.1:{port}"
