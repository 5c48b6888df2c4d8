"""pyproject.toml's package list against the tree: every directory of Python modules under
specdec/ and client/ (installed as specdec_client) is a package of the wheel, and nothing else
is. tests/e2e/test_installed_package.py checks the built and installed artifact itself."""
from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import REPO

# Source directory -> the import name it is installed as.
ROOTS = {"specdec": "specdec", "client": "specdec_client"}


def setuptools_config() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:   # Python 3.10
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs Python 3.11+")
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def packages_in_tree() -> set[str]:
    out = set()
    for source, name in ROOTS.items():
        for module in (REPO / source).rglob("*.py"):
            parts = module.parent.relative_to(REPO / source).parts
            out.add(".".join((name, *parts)))
    return out


def test_every_package_of_the_tree_is_listed():
    listed = set(setuptools_config()["packages"])
    found = packages_in_tree()
    assert "specdec.proposers.eagle" in found, \
        "update this test: the tree walk found no specdec.proposers.eagle"
    assert found - listed == set(), f"pyproject.toml lists no {sorted(found - listed)}"
    assert listed - found == set(), f"pyproject.toml lists {sorted(listed - found)}: not found"


def test_every_package_directory_is_a_regular_package():
    """A directory without __init__.py would install only as a namespace package."""
    for package in packages_in_tree():
        name, *parts = package.split(".")
        source = next(s for s, n in ROOTS.items() if n == name)
        assert (REPO / source / Path(*parts) / "__init__.py").is_file(), package


def test_the_client_directory_is_installed_as_specdec_client():
    assert setuptools_config()["package-dir"] == {n: s for s, n in ROOTS.items() if s != n}
