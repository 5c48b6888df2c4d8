"""The project installed as the Docker image installs it, in a virtual environment of its own.

The Dockerfile is read, not restated: every COPY from the build context goes under a temporary
root (a container path /x becomes <root>/x), its `pip install` of the copied source runs with the
same arguments and PIP_* settings, and its ENV (paths moved under the root) is what the server
gets. The new environment borrows the test environment's packages (torch, transformers,
nvidia-pytriton) through a .pth path entry: a path entry adds that directory to sys.path but
runs none of the .pth files in it, so the editable install's finder stays out, and `specdec`
can come only from this environment's own site-packages.

A probe (a .pth hook in that site-packages) records, per process, the file each `specdec` and
`specdec_client` module was found in: the Triton Python backend stubs too, since their embedded
Python starts like this environment's interpreter.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from tests.deploy import helpers as dockerfile

PROBE_ENV = "INSTALLED_PACKAGE_PROBE_DIR"
PROBE = f'''"""tests/e2e/installed.py: records where this process finds specdec's modules."""
import os
import sys


class OriginProbe:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in ("specdec", "specdec_client"):
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        with open(os.path.join(os.environ["{PROBE_ENV}"], str(os.getpid())), "a") as f:
            f.write(f"{{name}} {{spec.origin if spec else None}}\\n")
        return spec


if os.environ.get("{PROBE_ENV}"):
    sys.meta_path.insert(0, OriginProbe())
'''


@dataclass
class Installed:
    root: Path            # the image's filesystem, as far as the Dockerfile writes it
    venv: Path
    site_packages: Path
    env: dict[str, str]   # the Dockerfile's ENV, paths under root
    probe_dir: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def image_path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def origins(self) -> dict[int, dict[str, str]]:
        """pid -> module -> the file it was found in, for every process that imported one."""
        out: dict[int, dict[str, str]] = {}
        for f in self.probe_dir.iterdir():
            for line in f.read_text().splitlines():
                name, _, origin = line.partition(" ")
                out.setdefault(int(f.name), {})[name] = origin
        return out


def install(tmp: Path) -> Installed:
    """A fresh virtual environment with the project installed from the Dockerfile's copies."""
    root = tmp / "image"
    for sources, dest in dockerfile.copies():
        _copy(sources, dest, root)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site_packages = Path(subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    borrowed = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site_packages / "test_environment.pth").write_text("".join(f"{p}\n" for p in borrowed))
    (site_packages / "installed_package_probe.py").write_text(PROBE)
    (site_packages / "installed_package_probe.pth").write_text("import installed_package_probe\n")
    probe_dir = tmp / "probe"
    probe_dir.mkdir()

    image_env = {k: (str(root / v.lstrip("/")) if v.startswith("/") else v)
                 for k, v in dockerfile.env().items()}
    argv, source = _pip_install_command()
    pip_env = {**clean_environment(),
               **{k: v for k, v in image_env.items() if k.startswith("PIP_")}}
    done = subprocess.run([python, *argv[1:-1], str(root / source.lstrip("/"))],
                          cwd=tmp, env=pip_env, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout}{done.stderr}"
    return Installed(root, venv, site_packages, image_env, probe_dir)


def clean_environment() -> dict[str, str]:
    """The test process's environment without anything that would put the source tree or the
    test environment's own settings in front of the installed copy."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("SPECDEC_", "PYTHON", "PIP_", "VIRTUAL_ENV"))}


def _pip_install_command() -> tuple[list[str], str]:
    """The Dockerfile's `python3 -m pip install ... <dir>` of the copied source, and <dir>."""
    source = dockerfile.copy_destination("pyproject.toml")
    found = [shlex.split(part) for run in dockerfile.args_of("RUN")
             for part in re.split(r"&&|\|\||;", run)
             if "pip" in part.split() and part.split()[-1].rstrip("/") == source]
    assert len(found) == 1, f"expected one RUN that pip-installs {source}, found {found}"
    (argv,) = found
    assert argv[:4] == ["python3", "-m", "pip", "install"], argv
    return argv, source


def _copy(sources: list[str], dest: str, root: Path) -> None:
    """COPY's rules: a directory's contents go to dest; files go into dest when it ends in /."""
    target = root / dest.lstrip("/")
    for s in sources:
        src = dockerfile.REPO / s
        if src.is_dir():
            shutil.copytree(src, target, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            to = target / src.name if dest.endswith("/") or len(sources) > 1 else target
            to.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, to)
