"""Run the real tritonserver from the nvidia-pytriton wheel on this machine, CPU or GPU.

The wheel ships tritonserver, the Python backend and one backend stub per Python version. The
stub matching this interpreter goes beside libtriton_python.so; the wheel's bundled libraries go
on LD_LIBRARY_PATH; this virtual environment's bin goes first on PATH so the stub finds the
packages installed here (torch, transformers, specdec).

    python -m specdec.launcher.launch [--model-repository DIR] [--address 127.0.0.1] ...

Secure defaults: every endpoint listens on loopback unless `--address` says otherwise. Models
load and unload only from inside the server: model control is explicit (the orchestrator reloads
a model whose process died, through the Python backend's model-loading API), and the HTTP and
gRPC model-repository APIs demand a header whose value is random per start and never shown.

In a container whose image has tritonserver (NVIDIA's), `--tritonserver tritonserver` runs that
binary with its own backends instead of the nvidia-pytriton wheel's.

tritonserver runs as the launcher's child and is started again if it dies after it became
ready (keeper.py: bounded backoff, never for a server that could not start); `--no-restart`
execs it instead, for a supervisor of your own (systemd, or Kubernetes alone).
"""
from __future__ import annotations

import argparse
import filecmp
import math
import os
import secrets
import shutil
import sys
import sysconfig
from pathlib import Path

from . import shutdown
from .keeper import Keeper, http_health

# Not settings.REPO_ROOT: the launcher's path is the one that matters to it (an installed package
# points elsewhere than a checkout only through this file).
REPO_ROOT = Path(__file__).resolve().parents[2]


def pytriton_root() -> Path:
    import pytriton  # the nvidia-pytriton wheel
    return Path(pytriton.__file__).parent / "tritonserver"


def prepare_backends(dest: Path) -> Path:
    """A backend directory whose python backend has the stub for this Python version."""
    root = pytriton_root()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise SystemExit(f"{stub}: no Python backend stub for Python {version} in nvidia-pytriton")
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for f in (root / "backends" / "python").iterdir():
        if f.is_file():
            _install(f, python_dir / f.name)
    _install(stub, python_dir / "triton_python_backend_stub")
    return dest


def libpython_dir(dest: Path) -> Path | None:
    """A directory holding only this interpreter's libpython (a link), for LD_LIBRARY_PATH.

    The stub links libpython3.X.so.1.0: it must get this interpreter's, not another build of
    the same minor version elsewhere on the system (their extension modules' symbols differ).
    Not its LIBDIR itself: where that is a system directory (/usr/lib/x86_64-linux-gnu), every
    library there would come before the RUNPATH of torch's own (LD_LIBRARY_PATH is searched
    first), such as an image's system cuDNN before the one torch was built with. None: no
    shared libpython (a static build), nothing to add."""
    name = sysconfig.get_config_var("INSTSONAME") or ""
    lib = Path(sysconfig.get_config_var("LIBDIR") or "") / name
    if not name or not lib.is_file():
        return None
    own = dest / "libpython"
    own.mkdir(parents=True, exist_ok=True)
    link = own / name
    if not (link.is_symlink() and os.readlink(link) == str(lib)):
        tmp = own / f".{name}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(lib)
        os.replace(tmp, link)
    return own


def _install(src: Path, dst: Path) -> None:
    """Copy unless identical; replace atomically, since a running server may be executing dst."""
    if dst.exists() and filecmp.cmp(src, dst, shallow=False):
        return
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}")
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def environment(backends: Path) -> dict[str, str]:
    """The server's environment; backends: prepare_backends' directory."""
    env = dict(os.environ)
    # The wheel's bundled libraries sit beside its package, in the site-packages that holds
    # nvidia-pytriton, which need not be this environment's own.
    libs = [pytriton_root().parents[1] / "nvidia_pytriton.libs"]
    own = libpython_dir(backends / "python")
    if own is not None:
        libs.insert(0, own)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [str(p) for p in libs] + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else []))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # Draft and target run in separate stub processes; OpenMP threads that spin after each op
    # steal the cores the other model needs next (measured 3x slower rounds on 2 CPU cores).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


# The header that the model-repository APIs (load, unload, index) demand; see restricted().
ADMIN_HEADER = "specdec-admin-key"


def restricted(key: str) -> list[str]:
    """Close the HTTP and gRPC model-repository APIs to anyone without `key`."""
    return [f"--http-restricted-api=model-repository:{ADMIN_HEADER}={key}",
            f"--grpc-restricted-protocol=model-repository:{ADMIN_HEADER}={key}"]


def shm_prefix(start: int) -> str:
    """The Python backend's shared-memory region names for one start of the server: the keeper
    removes a dead server's regions by this prefix, and no other server's."""
    return f"specdec_{os.getpid()}_{start}_"


def command(model_repository: Path, backend_dir: Path | None, http: int, grpc: int, metrics: int,
            extra: list[str] = (), address: str = "127.0.0.1",
            tritonserver: str | None = None, start: int = 0) -> list[str]:
    """backend_dir None: the binary's own backend directory (a Triton image)."""
    return [
        tritonserver or str(pytriton_root() / "bin" / "tritonserver"),
        f"--model-repository={model_repository}",
        *([f"--backend-directory={backend_dir}"] if backend_dir else []),
        f"--http-address={address}", f"--grpc-address={address}", f"--metrics-address={address}",
        f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
        # Explicit control lets the orchestrator reload a model whose stub died; `*` loads every
        # model at start, as the default mode would.
        "--model-control-mode=explicit", "--load-model=*",
        # Every config.pbtxt is complete. With auto-completion on, the Python backend starts a
        # stub per model only to ask it for a config (importing torch there too), then the
        # instance's own: 13.2 against 9.7 s to ready here, measured twice each (2 vCPUs).
        # --strict-model-config=false (a user's partial configs) turns it back on.
        *([] if any(a.startswith("--strict-model-config") for a in extra)
          else ["--disable-auto-complete-config"]),
        *restricted(secrets.token_urlsafe(24)),
        # Draft probabilities ([K, V] fp32 per sequence) travel through shared memory.
        *_unless_set(extra, "--backend-config=python,shm-default-byte-size=16777216"),
        *_unless_set(extra, "--backend-config=python,shm-growth-byte-size=16777216"),
        *_unless_set(extra, f"--backend-config=python,shm-region-prefix-name={shm_prefix(start)}"),
        # After SIGTERM, in-flight requests (streams) finish for this long; new ones are refused.
        *_unless_set(extra, f"--exit-timeout-secs={math.ceil(shutdown.grace_s())}"),
        "--log-verbose=0",
        *extra,
    ]


def _unless_set(extra, flag: str) -> list[str]:
    """[flag], or [] when `extra` (the user's flags) sets the same option: one value per option,
    the user's. (tritonserver 2.51 keeps the last of a repeated backend-config, measured; the
    order is no contract, and a log that shows both values misleads.)"""
    option = flag.rpartition("=")[0]
    return [] if any(a.startswith(option + "=") for a in extra) else [flag]


def _sets_prefix(extra) -> bool:
    return not _unless_set(extra, "--backend-config=python,shm-region-prefix-name=x")


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    """The launcher's own options, and the tritonserver flags it passes on (`extra`)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-repository", type=Path, default=None,
                    help="the model repository (default: model_repository/ of a source "
                         "checkout; required where the package is installed, as in the image)")
    ap.add_argument("--backend-directory", type=Path, default=REPO_ROOT / ".triton" / "backends")
    ap.add_argument("--address", default="127.0.0.1",
                    help="address HTTP, gRPC and metrics listen on (0.0.0.0: every interface)")
    ap.add_argument("--tritonserver", default=None,
                    help="a tritonserver binary with its own backends (default: nvidia-pytriton's)")
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--grpc-port", type=int, default=8001)
    ap.add_argument("--metrics-port", type=int, default=8002)
    ap.add_argument("--no-restart", action="store_true",
                    help="exec tritonserver instead of keeping it (restarting it if it dies)")
    ap.add_argument("--openai-port", type=int, default=0,
                    help="also serve the OpenAI API (`specdec openai`) on this port, on the same "
                         "address; kept like the server. Default 0: off")
    args, extra = ap.parse_known_args(argv)
    if args.model_repository is None:
        args.model_repository = REPO_ROOT / "model_repository"
        if not args.model_repository.is_dir():   # an installed copy: REPO_ROOT is site-packages
            ap.error(f"--model-repository is required: no {args.model_repository} (the default "
                     f"exists only in a source checkout)")
    return args, extra


def main(argv=None) -> None:
    args, extra = parse_args(argv)
    if args.tritonserver:
        binary = shutil.which(args.tritonserver) or args.tritonserver
        backends, env = None, {"OMP_WAIT_POLICY": "PASSIVE", **os.environ}
    else:
        backends = prepare_backends(args.backend_directory).resolve()
        binary, env = None, environment(backends)

    def cmd(start: int) -> list[str]:
        return command(args.model_repository.resolve(), backends, args.http_port, args.grpc_port,
                       args.metrics_port, extra, args.address, binary, start)
    host = args.address
    print(f"tritonserver: HTTP {host}:{args.http_port}  gRPC {host}:{args.grpc_port}  "
          f"metrics {host}:{args.metrics_port}/metrics  repository {args.model_repository}",
          flush=True)
    companions = {}
    if args.openai_port:
        local = "127.0.0.1" if args.address in ("0.0.0.0", "::", "") else args.address
        companions["specdec openai"] = [
            sys.executable, "-m", "specdec.cli", "openai", "--grpc-url",
            f"{local}:{args.grpc_port}", "--host", host, "--port", str(args.openai_port)]
        print(f"OpenAI API: http://{host}:{args.openai_port}/v1", flush=True)
    if args.no_restart:
        if companions:
            raise SystemExit("--no-restart execs tritonserver: run `specdec openai` yourself")
        os.execve(cmd(0)[0], cmd(0), env)
    keeper = Keeper(cmd, env, http_health(args.address, args.http_port, "ready"),
                    http_health(args.address, args.http_port, "live"),
                    None if _sets_prefix(extra) else shm_prefix, companions=companions)
    sys.exit(keeper.run())


if __name__ == "__main__":
    main()
