"""The launcher's paths where the package is installed, not checked out: REPO_ROOT is then
site-packages, and nvidia-pytriton may sit in another site-packages than the launcher's."""
import os

import pytest

from specdec.serving import launch


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
    paths = launch.environment()["LD_LIBRARY_PATH"].split(os.pathsep)
    assert str(elsewhere / "nvidia_pytriton.libs") in paths


def test_pytriton_root_is_the_wheels_server_directory():
    root = launch.pytriton_root()
    assert (root / "bin" / "tritonserver").is_file()
    assert (root.parents[1] / "nvidia_pytriton.libs").is_dir()
