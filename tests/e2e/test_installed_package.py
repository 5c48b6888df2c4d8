"""What users run is the installed package: the project installed as the Dockerfile installs it
(its COPYs, its `pip install --no-deps` of the copied source, its ENV), in a virtual environment
without the editable install and with the source tree off sys.path, serves a real tritonserver
with the draft model and an EAGLE-3 head, and its greedy output is the editable tree's."""
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from specdec.runtime.config import ModelArgs
from specdec.runtime.engine import Engine
from specdec.proposers.eagle.checkpoint import HeadCheckpoint
from specdec.records import Request
from specdec_client import GenerationParams, generate
from tests.core.conftest import generate as generate_in_process
from tests.deploy.helpers import copy_destination
from tests.e2e.conftest import ROOT, STARTUP_TIMEOUT_S, Server, _free_port, _ready, heldout_prompts
from tests.e2e.installed import PROBE_ENV, clean_environment, install

PROMPT = heldout_prompts(1)[0]
MAX_TOKENS, K = 24, 4
SERVED = ("preprocessing", "postprocessing", "speculative_decoding", "draft_model",
          "target_model", "supervisor")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    return install(tmp_path_factory.mktemp("installed"))


@pytest.fixture(scope="module")
def installed_server(installed):
    http, grpc, metrics = _free_port(), _free_port(), _free_port()
    log = installed.root / "tritonserver.log"
    env = {**clean_environment(),
           **{k: v for k, v in installed.env.items() if not k.startswith("PIP_")},
           "SPECDEC_EAGLE_HEAD": str(Path(installed.env["SPECDEC_DEFAULT_MODELS"]) / "eagle"),
           # Rounds exactly the in-process loop's on a busy machine: no draft call times out.
           "SPECDEC_MAX_SEQUENCES": "2", "SPECDEC_DRAFT_TIMEOUT_S": "600",
           PROBE_ENV: str(installed.probe_dir)}
    repository = installed.image_path(copy_destination("model_repository"))
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(installed.python), "-m", "specdec.launcher.launch",
             f"--model-repository={repository}", f"--http-port={http}", f"--grpc-port={grpc}",
             f"--metrics-port={metrics}", "--exit-timeout-secs=10"],
            cwd=installed.root, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _ready(f"127.0.0.1:{http}"):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the installed package did not serve:\n{log.read_text()[-6000:]}")
            time.sleep(0.5)
        yield Server(f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"127.0.0.1:{metrics}", log,
                     proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def test_every_copied_module_is_installed(installed):
    """The install holds every module of the copied specdec/ and client/ (as specdec_client)."""
    copied = installed.image_path(copy_destination("pyproject.toml"))
    for source, package in ((copied / "specdec", "specdec"), (copied / "client", "specdec_client")):
        want = {p.relative_to(source) for p in source.rglob("*.py")}
        got = {p.relative_to(installed.site_packages / package)
               for p in (installed.site_packages / package).rglob("*.py")}
        assert want - got == set(), f"not installed in {package}: {sorted(map(str, want - got))}"


def test_greedy_output_is_the_editable_trees(installed_server, installed):
    target_dir = ROOT / "models" / "default" / "target"
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    cpu = torch.device("cpu")
    target = Engine.load(str(target_dir), 1, 128, torch.float32, cpu,
                         head=HeadCheckpoint(str(target_dir.parent / "eagle")))
    draft = Engine.load(str(target_dir.parent / "draft"), 1, 128, torch.float32, cpu)
    ids = tokenizer(PROMPT)["input_ids"]
    eos = ModelArgs.from_dir(target_dir).eos_token_ids
    for proposer in ("draft", "eagle"):
        (tokens, stats, _), = generate_in_process(
            target, draft if proposer == "draft" else None,
            [Request(ids, MAX_TOKENS, K, eos=eos, proposer=proposer)])
        served = generate(installed_server.http, PROMPT, GenerationParams(
            max_tokens=MAX_TOKENS, temperature=0.0, num_draft_tokens=K, proposer=proposer))
        assert served.text == tokenizer.decode(tokens), proposer
        assert (served.total_draft_tokens, served.total_accepted_draft_tokens) == \
            (stats.total_draft_tokens, stats.total_accepted_draft_tokens), proposer
        assert stats.total_accepted_draft_tokens > 0, proposer


def test_served_code_is_the_installed_copy(installed_server, installed):
    """Every process that imported specdec (the launcher and each model's backend stub) found
    every module of it in the installed site-packages, the head's package included."""
    stubs = {model: installed_server.backend_pid(model) for model in SERVED}
    origins = installed.origins()
    for model, pid in stubs.items():
        assert pid in origins, f"{model}'s backend process (pid {pid}) imported no specdec module"
    # The target's engine, and with it the head's package, loads in speculative_decoding's
    # process by default; target_model and draft_model load nothing there (no torch either).
    assert "specdec.proposers.eagle" in origins[stubs["speculative_decoding"]]
    for pid, modules in origins.items():
        for name, origin in modules.items():
            assert origin.startswith(str(installed.site_packages) + "/"), \
                f"pid {pid} imported {name} from {origin}, not the installed copy"
    assert installed_server.pid in origins   # the launcher
