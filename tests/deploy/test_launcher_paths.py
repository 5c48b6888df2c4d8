"""The launcher's paths where the package is installed, not checked out: REPO_ROOT is then
site-packages, and nvidia-pytriton may sit in another site-packages than the launcher's."""
import os
from pathlib import Path

import pytest

from specdec.launcher import launch


def test_the_default_model_repository_is_the_checkouts(tmp_path, monkeypatch):
    (tmp_path / "model_repository").mkdir()
    monkeypatch.setattr(launch, "REPO_ROOT", tmp_path)
    args, extra = launch.parse_args(["--exit-timeout-secs=10"])
    assert args.model_repository == tmp_path / "model_repository"
    assert extra == ["--exit-timeout-secs=10"]


def test_an_installed_copy_needs_model_repository(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launch, "REPO_ROOT", tmp_path)   # site-packages: no model_repository/
    with pytest.raises(SystemExit) as done:
        launch.parse_args([])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "--model-repository is required" in err and str(tmp_path / "model_repository") in err
    args, _ = launch.parse_args(["--model-repository", str(tmp_path / "repo")])
    assert args.model_repository == tmp_path / "repo"


def test_the_wheels_libraries_are_found_beside_nvidia_pytriton(tmp_path, monkeypatch):
    """Not this interpreter's site-packages: the installed-package test's venv borrows
    nvidia-pytriton from another one."""
    elsewhere = tmp_path / "other" / "site-packages"
    monkeypatch.setattr(launch, "pytriton_root", lambda: elsewhere / "pytriton" / "tritonserver")
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    paths = launch.environment(tmp_path / "backends")["LD_LIBRARY_PATH"].split(os.pathsep)
    assert str(elsewhere / "nvidia_pytriton.libs") in paths


def test_the_stub_gets_this_interpreters_libpython_and_nothing_beside_it(tmp_path, monkeypatch):
    """Its LIBDIR may be a system directory (a distribution's python3: /usr/lib/x86_64-linux-
    gnu), whose other libraries on LD_LIBRARY_PATH would come before torch's own (RUNPATH):
    an image's system cuDNN, for one. The path holds a directory of the one link instead."""
    libdir = tmp_path / "usr-lib"
    libdir.mkdir()
    (libdir / "libpython3.99.so.1.0").write_bytes(b"")
    (libdir / "libcudnn.so.9").write_bytes(b"")
    config = {"LIBDIR": str(libdir), "INSTSONAME": "libpython3.99.so.1.0"}
    monkeypatch.setattr(launch.sysconfig, "get_config_var", config.get)
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/mine")
    backends = tmp_path / "backends"
    paths = launch.environment(backends)["LD_LIBRARY_PATH"].split(os.pathsep)
    assert str(libdir) not in paths
    own = backends / "python" / "libpython"
    assert paths[0] == str(own) and paths[-1] == "/opt/mine"
    assert [p.name for p in own.iterdir()] == ["libpython3.99.so.1.0"]
    assert (own / "libpython3.99.so.1.0").resolve() == libdir / "libpython3.99.so.1.0"
    # A second start over the same directory keeps the one link
    launch.environment(backends)
    assert [p.name for p in own.iterdir()] == ["libpython3.99.so.1.0"]
    # A static build: nothing to add
    config["INSTSONAME"] = None
    assert launch.environment(tmp_path / "b2")["LD_LIBRARY_PATH"].split(os.pathsep)[0] != \
        str(tmp_path / "b2" / "python" / "libpython")


def test_pytriton_root_is_the_wheels_server_directory():
    root = launch.pytriton_root()
    assert (root / "bin" / "tritonserver").is_file()
    assert (root.parents[1] / "nvidia_pytriton.libs").is_dir()


def test_auto_completion_is_off_unless_the_user_wants_partial_configs():
    """Every config.pbtxt here is complete (each e2e server loads them so); auto-completion
    would start a stub per model for nothing. A user's --strict-model-config=false keeps it."""
    def build(extra=()):
        return launch.command(Path("repo"), None, 8000, 8001, 8002, list(extra))
    assert "--disable-auto-complete-config" in build()
    lenient = build(["--strict-model-config=false"])
    assert "--disable-auto-complete-config" not in lenient
    assert "--strict-model-config=false" in lenient
