"""Release metadata: the version users see is the installed one, the package says it is typed,
ships with a license and a changelog, and the wheel takes every subpackage and py.typed."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import flax_transformer

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_is_the_installed_distributions():
    assert flax_transformer.__version__ == metadata.version("flax-transformer")


def test_version_of_a_tree_that_is_not_installed_comes_from_pyproject(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert flax_transformer._version() == PYPROJECT["project"]["version"]


def test_py_typed_ships_with_the_package():
    assert (ROOT / "flax_transformer" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["flax_transformer"]


def test_every_subpackage_is_packaged():
    """A bare `packages = [...]` list leaves subpackages out of the wheel: find them instead."""
    find = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    assert "packages" not in PYPROJECT["tool"]["setuptools"] or not isinstance(
        PYPROJECT["tool"]["setuptools"]["packages"], list
    )
    assert {"flax_transformer*", "torch_reference*"} <= set(find["include"])


def test_console_script_license_and_changelog():
    assert PYPROJECT["project"]["scripts"] == {"ftx": "flax_transformer.cli.main:main"}
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## {PYPROJECT['project']['version']}" in changelog
    for section in ("### Added", "### Changed", "### Deprecated", "### Fixed"):
        assert section in changelog
