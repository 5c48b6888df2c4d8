"""The Dockerfile, read statically (no Docker engine needed) and checked against the code."""
from __future__ import annotations

import fnmatch
import importlib.metadata
import os
import re
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from specdec.launcher import launch

from .helpers import (DOCKERFILE, REPO, args_of, build_args, cmd, comment_above, copies,
                      copy_destination, dockerfile, env, env_names_read_by_code, flag, normalize,
                      openai_args, pip_requirements)

BASE = "nvcr.io/nvidia/tritonserver"
BASE_TAG = "26.04-py3"        # NGC 26.04: Triton 2.68.0, CUDA 13.2.1, Ubuntu 24.04, Python 3.12
IMAGE_PYTHON = "cp312"        # the image's system Python, the one Triton's Python backend stub runs
IMAGE_CUDA_MAJOR = 13         # CUDA 13.2.1: torch and flash-attn must be CUDA 13 builds
# The first NGC release with all three upstream fixes for Triton 2.51's gRPC stream crashes:
# server pull requests 7840 (Triton 2.53, NGC 24.12), 8078 (2.57, 25.04), 8708 (2.68, 26.04).
FIRST_FIXED_RELEASE = (26, 4)
# Pins allowed to differ from constraints.txt, and why (the Dockerfile's comments say the same).
# None today: the image's Python 3.12 takes constraints.txt's transformers, and PyPI's torch 2.13.0
# for cp312 is a CUDA 13 build, the image's CUDA major.
CONSTRAINT_EXCEPTIONS: dict[str, str] = {}
# The newest torch minor that Dao-AILab's flash-attn release wheels are built for (flash-attn
# 2.8.3, cu13torch2.10; its wheel workflow's torch table ends at 2.10): for a newer torch there
# is no prebuilt wheel, and FLASH_ATTN_WHEEL defaults to empty.
FLASH_ATTN_NEWEST_TORCH = Version("2.10")
FLASH_ATTN_WHEEL_NAME = re.compile(
    r"flash_attn-[\w.]+(?:%2B|\+)cu(\d+)torch(\d+\.\d+)cxx11abi(TRUE|FALSE)-(cp\d+)-cp\d+-"
    r"linux_x86_64\.whl")
# What the OpenAI gateway (`specdec openai`) imports, and tritonclient[grpc]'s grpcio and
# protobuf, written out as name==version.
GATEWAY_PACKAGES = ("fastapi", "starlette", "uvicorn", "uvloop", "httptools", "pydantic",
                    "tritonclient", "grpcio", "protobuf")
OPENAI_PORT = 9000


def test_base_image_is_triton_with_a_pinned_tag():
    froms = args_of("FROM")
    assert froms, "no FROM"
    for ref in froms:
        image = ref.split()[0]
        assert "$" not in image, f"FROM {image}: the tag must be written out, not an ARG"
        name, _, tag = image.rpartition(":")
        assert name == BASE, f"FROM {image}: expected {BASE}"
        assert re.fullmatch(r"\d{2}\.\d{2}-py3", tag), f"FROM {image}: tag {tag!r} is not pinned"
    assert froms[-1].split()[0] == f"{BASE}:{BASE_TAG}"


def test_base_release_has_the_grpc_stream_crash_fixes():
    """Triton 2.51 (NGC 24.10, what nvidia-pytriton 0.7.0 bundles) can crash in its gRPC stream
    handling when clients disconnect abruptly: two cancellation races, fixed by server pull
    requests 7840 (Triton 2.53, NGC 24.12) and 8078 (Triton 2.57, NGC 25.04), and a
    use-after-free in the `triton_grpc_error` streaming mode, fixed by 8708 (Triton 2.68, NGC
    26.04). The image must be on 26.04 or later, the releases with all three fixes."""
    tag = args_of("FROM")[-1].split()[0].rpartition(":")[2]
    m = re.fullmatch(r"(\d{2})\.(\d{2})-py3", tag)
    assert m, f"tag {tag!r} is not an NGC YY.MM-py3 release"
    assert (int(m.group(1)), int(m.group(2))) >= FIRST_FIXED_RELEASE, \
        f"NGC {tag} predates 26.04 (Triton 2.68): it lacks the fix of server PR 8708 or more"
    about = comment_above("FROM ")
    for fact in ("Triton 2.68", "CUDA 13", f"Python 3.{IMAGE_PYTHON[3:]}", "7840", "8078", "8708"):
        assert fact in about, f"the comment above FROM does not say {fact!r}"


def test_every_copied_path_exists_and_is_in_the_build_context():
    ignore = [p.strip() for p in (REPO / ".dockerignore").read_text().splitlines()
              if p.strip() and not p.startswith("#")]
    assert ".venv" in ignore and ".git" in ignore, "keep .venv and .git out of the build context"
    pairs = copies()
    assert len(pairs) >= 4
    for sources, _ in pairs:
        for src in sources:
            rel = src.strip("/")
            assert (REPO / rel).exists(), f"COPY {src}: no such path in the repository"
            for pattern in ignore:
                p = pattern.strip("/")
                assert not (fnmatch.fnmatch(rel, p) or rel.startswith(p + "/")), \
                    f"COPY {src} is excluded by .dockerignore pattern {pattern!r}"


def test_copies_what_the_server_needs():
    for path in ("specdec", "client", "pyproject.toml", "README.md", "model_repository",
                 "models/default"):
        copy_destination(path)   # raises when missing


def test_project_is_installed_from_the_copied_sources_not_editable():
    src = copy_destination("pyproject.toml").rstrip("/")
    assert copy_destination("specdec") == f"{src}/specdec"
    assert copy_destination("client") == f"{src}/client"
    pattern = re.compile(rf"pip install\b[^&;]*\s{re.escape(src)}/?(\s|$)")
    installs = [r for r in args_of("RUN") if pattern.search(r)]
    assert len(installs) == 1, f"expected one RUN that pip-installs {src}"
    (run,) = installs
    assert "--no-deps" in run
    assert not re.search(r"\s(-e|--editable)\s", run), "the image must not use an editable install"


def test_runs_as_a_non_root_user():
    steps = dockerfile()
    users = [i for i, (w, _) in enumerate(steps) if w == "USER"]
    assert users, "no USER: the server would run as root"
    last = users[-1]
    user = steps[last][1].split(":")[0]
    assert user not in ("root", "0"), f"USER {steps[last][1]} is root"
    assert last < max(i for i, (w, _) in enumerate(steps) if w == "CMD")


def test_cmd_runs_the_launcher_on_the_image_tritonserver_and_copied_repository():
    """The launcher's flags (backend config, explicit model control, closed repository APIs)
    are those of `make serve`; in a container it listens on every interface. No --no-restart:
    the launcher (PID 1) keeps tritonserver and restarts it after a crash."""
    argv = cmd()
    assert argv[:3] == ["python3", "-m", "specdec.launcher.launch"]
    assert "--no-restart" not in argv
    assert flag(argv, "--tritonserver") == "tritonserver"
    assert flag(argv, "--address") == "0.0.0.0"
    repo = flag(argv, "--model-repository")
    assert repo is not None, "CMD has no --model-repository"
    assert repo.rstrip("/") == copy_destination("model_repository")
    assert flag(argv, "--openai-port") == str(OPENAI_PORT)


def test_the_image_cmd_runs_the_openai_gateway_beside_tritonserver(monkeypatch):
    """The launcher, given the CMD's arguments, keeps `specdec openai` as a companion on every
    interface of the container (its --address) and port 9000, calling the local gRPC port;
    --openai-port is the launcher's own flag, never passed on to tritonserver."""
    seen = {}

    class Keeper:
        def __init__(self, command, env, ready, live, shm_prefix, companions=None, **_):
            seen.update(command=command, companions=companions)

        def run(self):
            return 0

    monkeypatch.setattr(launch, "Keeper", Keeper)
    argv = cmd()
    with pytest.raises(SystemExit) as done:
        launch.main(argv[3:])
    assert done.value.code == 0
    (gateway,) = seen["companions"].values()
    assert gateway[1:4] == ["-m", "specdec.cli", "openai"]
    args = openai_args(gateway[4:])
    assert args.host == "0.0.0.0" and args.port == OPENAI_PORT
    assert args.grpc_url == f"127.0.0.1:{flag(argv, '--grpc-port') or 8001}"
    server = seen["command"](0)
    assert server[0] == "tritonserver"
    assert not any("openai" in a for a in server), server


def test_the_launcher_builds_the_image_command():
    def build():
        return launch.command(Path("/opt/specdec/model_repository"), None, 8000, 8001, 8002,
                              address="0.0.0.0", tritonserver="/opt/tritonserver/bin/tritonserver")
    built = build()
    assert built[0] == "/opt/tritonserver/bin/tritonserver"
    assert not any(a.startswith("--backend-directory") for a in built)   # the image's own
    assert "--backend-config=python,shm-default-byte-size=16777216" in built
    assert "--model-control-mode=explicit" in built and "--load-model=*" in built
    for a in ("--http-address=0.0.0.0", "--grpc-address=0.0.0.0", "--metrics-address=0.0.0.0"):
        assert a in built
    key = [a for a in built if a.startswith("--http-restricted-api=model-repository:")]
    assert len(key) == 1 and len(key[0].rsplit("=", 1)[1]) >= 24
    assert key != [a for a in build() if a.startswith("--http-restricted")]   # random per start


def test_exposes_http_grpc_metrics_and_openai():
    ports = {int(p.split("/")[0]) for rest in args_of("EXPOSE") for p in rest.split()}
    assert ports == {8000, 8001, 8002, OPENAI_PORT}
    argv = cmd()
    for name, default in (("--http-port", 8000), ("--grpc-port", 8001), ("--metrics-port", 8002),
                          ("--openai-port", None)):
        assert int(flag(argv, name) or default) in ports
    # The gateway's own default port, the one `specdec openai` and docs/openai.md name.
    assert openai_args([]).port == OPENAI_PORT


def test_env_names_are_read_by_the_code(monkeypatch):
    names = {k for k in env() if k.startswith("SPECDEC_")}
    assert "SPECDEC_DEFAULT_MODELS" in names
    unknown = names - env_names_read_by_code(monkeypatch)
    assert not unknown, f"the code never reads {sorted(unknown)}"


def test_default_models_env_points_at_the_copied_pair():
    """settings.py's default pair sits relative to a source checkout; the image names its
    directory, and no draft: an image-set SPECDEC_DRAFT_MODEL would look like a user's and be
    served beside a user's target."""
    e = env()
    assert e["SPECDEC_DEFAULT_MODELS"] == copy_destination("models/default")
    assert "SPECDEC_DRAFT_MODEL" not in e
    assert "SPECDEC_TARGET_MODEL" not in e


def test_healthcheck_probes_the_models():
    (check,) = args_of("HEALTHCHECK")
    words = check.split()
    assert words[words.index("CMD") + 1:words.index("CMD") + 3] == ["specdec", "probe"]
    assert flag(cmd(), "--http-port") in (None, "8000")   # the probe's default URL
    assert "start-period" in check, "model loading needs a start period"


def test_every_pip_install_is_pinned():
    defaults = build_args()
    for run in args_of("RUN"):
        for command in re.split(r"&&|\|\||;", run):
            words = command.split()
            if "pip" not in words or "install" not in words:
                continue
            for w in words[words.index("install") + 1:]:
                w = re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m.group(1), m.group(0)), w)
                if w.startswith(("-", "/", ".", '"', "$", "http")):
                    continue
                assert re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][\w.+]*", w), f"{w!r} is not pinned"


def test_pip_can_install_into_ubuntus_system_python():
    """The image's Python 3.12 is Ubuntu 24.04's: PEP 668 marks it externally managed (pip
    refuses without PIP_BREAK_SYSTEM_PACKAGES), and its pip and setuptools are Debian packages
    without a RECORD file, which pip cannot uninstall ("Cannot uninstall pip 24.0, RECORD file
    not found"): upgrading them must not try, so they are installed with --ignore-installed.
    torch 2.13 requires setuptools >= 77.0.3, more than Ubuntu's 68.1.2; below 82, setuptools
    still ships pkg_resources, which code in the base image may import."""
    assert env().get("PIP_BREAK_SYSTEM_PACKAGES") == "1"
    pins = pip_requirements()
    assert Version("77.0.3") <= Version(pins["setuptools"]) < Version("82")
    for run in args_of("RUN"):
        for command in re.split(r"&&|\|\||;", run):
            words = command.split()
            if "pip" in words and "install" in words and any(
                    w.startswith(("pip==", "setuptools==")) for w in words):
                assert "--ignore-installed" in words, f"{command.strip()!r}: Debian's copy stays"


def constraint_pins() -> dict[str, str]:
    """name -> version that constraints.txt pins for the image's Python (its markers applied)."""
    python = f"{IMAGE_PYTHON[2]}.{IMAGE_PYTHON[3:]}"
    out = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        req = Requirement(line)
        if req.marker and not req.marker.evaluate({"python_version": python,
                                                   "python_full_version": f"{python}.0"}):
            continue
        (spec,) = req.specifier
        assert spec.operator == "==", f"constraints.txt: {line!r} is not a pin"
        assert normalize(req.name) not in out, f"constraints.txt pins {req.name} twice for {python}"
        out[normalize(req.name)] = spec.version
    return out


def pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:   # Python 3.10
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs Python 3.11+")
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_pins_match_constraints_and_pyproject():
    pins = pip_requirements()
    for name in ("torch", "numpy", "safetensors", "tokenizers", "transformers",
                 *GATEWAY_PACKAGES):
        assert name in pins, f"the Dockerfile does not pin {name}"
    constraints = constraint_pins()
    for name in GATEWAY_PACKAGES:
        assert name in constraints, f"constraints.txt does not pin {name}: the tests use what?"
    differ = {n for n, v in pins.items() if n in constraints and constraints[n] != v}
    assert differ <= set(CONSTRAINT_EXCEPTIONS), \
        f"pins differ from constraints.txt: {sorted(differ - set(CONSTRAINT_EXCEPTIONS))}"
    assert set(CONSTRAINT_EXCEPTIONS) <= differ, \
        f"stale exceptions, these pins now match: {sorted(set(CONSTRAINT_EXCEPTIONS) - differ)}"
    project = pyproject()
    requirements = [Requirement(r) for r in project["dependencies"]
                    + project["optional-dependencies"]["serve"]]
    for req in requirements:
        if normalize(req.name) in pins:
            assert Version(pins[normalize(req.name)]) in req.specifier, \
                f"{req.name}=={pins[normalize(req.name)]} violates pyproject's {req}"


def test_the_serve_extra_is_installed_except_pytriton():
    """The image installs what pyproject's serve extra lists (the tokenizer steps, the OpenAI
    gateway), pinned, but nvidia-pytriton: it bundles a tritonserver 2.51 for machines without
    one, and the image has its own."""
    pins = pip_requirements()
    serve = [Requirement(r) for r in pyproject()["optional-dependencies"]["serve"]]
    assert "nvidia-pytriton" in {normalize(r.name) for r in serve}
    assert "nvidia-pytriton" not in pins
    missing = [str(r) for r in serve
               if normalize(r.name) not in pins and normalize(r.name) != "nvidia-pytriton"]
    assert not missing, f"the serve extra's {missing} are not installed in the image"


def test_the_extras_pyproject_asks_for_are_written_out():
    """pyproject asks for tritonclient[grpc]; the Dockerfile writes the extra out as name==version
    pins (the pin test allows nothing else). Every requirement of the image's tritonclient with
    that extra that constraints.txt pins is pinned here too, within tritonclient's bounds (read
    from the tritonclient installed here, the same version)."""
    pins, constraints = pip_requirements(), constraint_pins()
    serve = [Requirement(r) for r in pyproject()["optional-dependencies"]["serve"]]
    extras = {normalize(r.name): r.extras for r in serve if r.extras}
    assert extras.get("tritonclient") == {"grpc"}, "update this test: pyproject's extras changed"
    for name, wanted in extras.items():
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{name} is not installed here: its requirements are unknown")
        if dist.version != pins[name]:
            pytest.skip(f"{name} {dist.version} is installed here, the image pins {pins[name]}")
        checked = set()
        for req in map(Requirement, dist.requires or []):
            markers = [{"extra": e, "python_version": "3.12", "python_full_version": "3.12.3"}
                       for e in wanted]
            if req.marker is not None and not any(req.marker.evaluate(m) for m in markers):
                continue
            dep = normalize(req.name)
            if dep in constraints:
                assert dep in pins, f"{name}{sorted(wanted)} needs {req}: pin {dep} in the image"
                assert Version(pins[dep]) in req.specifier, f"{dep}=={pins[dep]} violates {req}"
                checked.add(dep)
        if name == "tritonclient":
            assert {"grpcio", "protobuf"} <= checked


def flash_attn_wheel_problems(url: str, torch: Version) -> list[str]:
    """Why a flash-attn wheel URL does not fit the image's torch, CUDA, Python and C++ ABI."""
    m = FLASH_ATTN_WHEEL_NAME.search(url)
    if not m:
        return [f"{url!r} is not a flash-attn linux_x86_64 wheel name"]
    cuda, torch_minor, abi, python = m.groups()
    problems = []
    if int(cuda) != IMAGE_CUDA_MAJOR:
        problems.append(f"built for CUDA {cuda}, the image has CUDA {IMAGE_CUDA_MAJOR}")
    if torch_minor != f"{torch.major}.{torch.minor}":
        problems.append(f"built for torch {torch_minor}, the image has {torch}")
    if python != IMAGE_PYTHON:
        problems.append(f"built for {python}, the image's Python is {IMAGE_PYTHON}")
    # PyPI's torch builds use the C++11 ABI from 2.7 on.
    if abi != ("TRUE" if torch >= Version("2.7") else "FALSE"):
        problems.append(f"C++11 ABI {abi} does not match PyPI's torch {torch}")
    return problems


def test_flash_attn_wheel_check_tells_a_fitting_wheel_from_the_others():
    torch = Version(pip_requirements()["torch"])
    minor = f"{torch.major}.{torch.minor}"
    fits = (f"https://example.com/flash_attn-2.8.3%2Bcu{IMAGE_CUDA_MAJOR}torch{minor}"
            f"cxx11abiTRUE-{IMAGE_PYTHON}-{IMAGE_PYTHON}-linux_x86_64.whl")
    assert flash_attn_wheel_problems(fits, torch) == []
    for wrong in (fits.replace(f"cu{IMAGE_CUDA_MAJOR}", "cu12"),
                  fits.replace(f"torch{minor}", "torch2.7"),
                  fits.replace(IMAGE_PYTHON, "cp310"),
                  fits.replace("cxx11abiTRUE", "cxx11abiFALSE"),
                  "https://example.com/flash_attn-2.8.3.tar.gz"):
        assert len(flash_attn_wheel_problems(wrong, torch)) >= 1, wrong


def test_flash_attn_default_fits_torch_or_is_empty_because_no_wheel_exists():
    """flash-attn is optional (the code falls back to PyTorch SDPA). The default is a release
    wheel that fits the image, or empty when Dao-AILab publishes none for this torch (their
    wheels stop at torch 2.10): then the Dockerfile says why, and a torch that has a release
    wheel would make this fail, so the default cannot stay empty by mistake."""
    url = build_args()["FLASH_ATTN_WHEEL"]
    torch = Version(pip_requirements()["torch"])
    if url:
        assert flash_attn_wheel_problems(url, torch) == []
        assert url.startswith("https://github.com/Dao-AILab/flash-attention/releases/download/v")
        return
    assert Version(f"{torch.major}.{torch.minor}") > FLASH_ATTN_NEWEST_TORCH, \
        f"flash-attn has release wheels for torch {torch}: set FLASH_ATTN_WHEEL to the one that fits"
    why = comment_above("ARG FLASH_ATTN_WHEEL=")
    for fact in (f"torch {FLASH_ATTN_NEWEST_TORCH}", f"torch {torch.major}.{torch.minor}",
                 f"CUDA {IMAGE_CUDA_MAJOR}", IMAGE_PYTHON, "SDPA", "--build-arg FLASH_ATTN_WHEEL="):
        assert fact in why, f"the comment above ARG FLASH_ATTN_WHEEL does not say {fact!r}"


def _run_flash_attn_step(tmp_path, value):
    (step,) = [r for r in args_of("RUN") if "FLASH_ATTN_WHEEL" in r]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    fake = bin_dir / "python3"
    fake.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\n')
    fake.chmod(0o755)
    environ = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FLASH_ATTN_WHEEL": value}
    done = subprocess.run(["/bin/sh", "-c", step], env=environ, capture_output=True, text=True)
    return done, (log.read_text() if log.exists() else "")


def test_flash_attn_step_is_skipped_when_the_arg_is_empty(tmp_path):
    done, calls = _run_flash_attn_step(tmp_path, "")
    assert done.returncode == 0, done.stderr
    assert calls == ""


def test_flash_attn_step_with_the_default_arg(tmp_path):
    """The default build: installs the default wheel, or, with the default empty, nothing."""
    url = build_args()["FLASH_ATTN_WHEEL"]
    done, calls = _run_flash_attn_step(tmp_path, url)
    assert done.returncode == 0, done.stderr
    assert calls.split() == (["-m", "pip", "install", url] if url else [])


def test_flash_attn_step_installs_the_arg(tmp_path):
    torch = Version(pip_requirements()["torch"])
    url = build_args()["FLASH_ATTN_WHEEL"] or (
        f"https://example.com/flash_attn-2.8.3%2Bcu{IMAGE_CUDA_MAJOR}torch{torch.major}."
        f"{torch.minor}cxx11abiTRUE-{IMAGE_PYTHON}-{IMAGE_PYTHON}-linux_x86_64.whl")
    done, calls = _run_flash_attn_step(tmp_path, url)
    assert done.returncode == 0, done.stderr
    assert calls.split() == ["-m", "pip", "install", url]


def test_dockerfile_has_no_stray_latest_or_add():
    text = DOCKERFILE.read_text()
    assert ":latest" not in text
    assert not args_of("ADD"), "use COPY (ADD fetches URLs and unpacks archives)"


# What PyPI's torch 2.13.0 cp312 manylinux_2_28_x86_64 wheel requires on Linux for NCCL: read
# from the wheel's METADATA (Requires-Dist) on 2026-11-25; its libtorch_cuda.so needs
# libnccl.so.2 from that wheel's nvidia/nccl/lib. Tensor parallelism on GPUs needs it.
TORCH_NCCL_WHEEL = "nvidia-nccl-cu13"


def test_nccl_comes_with_the_cuda_torch_wheel():
    """NCCL reaches the image as a dependency of PyPI's CUDA torch: torch must come from PyPI's
    default index (a CPU-only index or a +cpu build has no NCCL), and no pin of our own may
    fight torch's exact NCCL pin."""
    assert "+cpu" not in pip_requirements()["torch"]
    assert not {"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"} & set(env())
    for run in args_of("RUN"):
        for command in re.split(r"&&|\|\||;", run):
            if "torch==" in command:
                assert "index-url" not in command and "download.pytorch.org" not in command, \
                    command
    assert not [n for n in pip_requirements() if n.startswith("nvidia-nccl")], \
        "torch pins its own NCCL wheel: install none beside it"
    note = comment_above("ARG TORCH_VERSION=")
    assert TORCH_NCCL_WHEEL in note and "NCCL" in note
