"""One shared library from this package's C sources, built once per machine and loaded.

The sources are compiled with the system's C compiler (`$CC`, else cc or gcc) and -march=native,
for the CPU that runs them (AVX-512 where it has it), into a cache directory
(`$SPECDEC_CACHE_DIR`, else ~/.cache/specdec) under a name that hashes the sources, the flags, the
compiler and the CPU's features; then loaded with ctypes. `load` returns None, and `reason` says
why, where there is no compiler, the build fails, or the built kernels compute wrongly here
(linear.check, attention.check, pointwise.check): the engine then keeps PyTorch's operators.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

SOURCES = tuple(sorted(Path(__file__).parent.glob("*.c")))
HEADERS = tuple(sorted(Path(__file__).parent.glob("*.h")))
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fPIC", "-shared")

_loaded: dict[str, ctypes.CDLL | str] = {}


def load() -> ctypes.CDLL | None:
    """The library with its functions' signatures set, built and checked on first use in this
    process; None (the reason logged once, `reason()`) where it cannot be."""
    if "lib" not in _loaded:
        try:
            lib = ctypes.CDLL(str(build()))
            from . import attention, linear, pointwise
            lib.set_threads.argtypes = [ctypes.c_int]
            lib.set_threads.restype = ctypes.c_int
            lib.get_threads.restype = ctypes.c_int
            for kind in (linear, attention, pointwise):
                kind.declare(lib)
            for kind in (linear, attention, pointwise):
                kind.check(lib)
            _loaded["lib"] = lib
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            _loaded["lib"] = str(e)
            log.warning("the CPU kernels are unavailable, PyTorch's operators serve instead: %s",
                        e)
    lib = _loaded["lib"]
    return lib if isinstance(lib, ctypes.CDLL) else None


def set_threads(n: int) -> int:
    """Threads each kernel call uses from now on, the calling one included (pool.c; 1 until
    set); returns the number set. Where the library is not loaded, 1."""
    lib = load()
    return lib.set_threads(n) if lib is not None else 1


def threads() -> int:
    """Threads each kernel call uses (set_threads)."""
    lib = load()
    return lib.get_threads() if lib is not None else 1


def reason() -> str | None:
    """Why `load` gives None (None where it gives the library)."""
    load()
    lib = _loaded["lib"]
    return lib if isinstance(lib, str) else None


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE_DIR") or Path.home() / ".cache" / "specdec")


def build() -> Path:
    """The library's path, compiled now unless the cache holds it."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (set CC, or install gcc)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                             timeout=60).stdout.splitlines()[:1]
    texts = [s.read_text() for s in SOURCES + HEADERS]
    key = hashlib.sha256("\0".join([*texts, *FLAGS, *version, platform.machine(),
                                    _cpu_flags()]).encode()).hexdigest()
    out = _writable(cache_dir()) / f"specdec-cpu-{key[:16]}.so"
    if out.is_file():
        return out
    # Compiled beside its name and renamed: model processes that start together each build,
    # and none loads a half-written library.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *FLAGS, "-pthread", "-o", tmp, *map(str, SOURCES), "-lm"],
                              capture_output=True, text=True, timeout=300)
        if done.returncode:
            raise RuntimeError(f"{cc} failed on the CPU kernels: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _writable(preferred: Path) -> Path:
    """preferred, or where it cannot be written (a read-only home in a container) a directory
    of this user's under the system's temporary one."""
    for d in (preferred, Path(tempfile.gettempdir()) / f"specdec-{os.getuid()}"):
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(d, os.W_OK):
            return d
    raise RuntimeError(f"cannot write the CPU kernels' build to {preferred} nor a temporary "
                       f"directory (set SPECDEC_CACHE_DIR)")


def _cpu_flags() -> str:
    """The CPU's feature flags: -march=native builds for them, so a cache shared between
    machines (a mounted home) keeps one library per kind of CPU."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""
