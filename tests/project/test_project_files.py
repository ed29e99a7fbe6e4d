"""The project's adoption files: one version number, a changelog that names it, a license, a security policy."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]


def _pyproject_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@pytest.mark.pure
def test_version_is_semver_and_the_settings_use_it() -> None:
    """pyproject.toml holds the version (MAJOR.MINOR.PATCH, or a PEP 440 pre-release of one before a release is
    cut); settings and the schema settings take it from there."""
    version = _pyproject_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.dev\d+)?", version), version
    assert settings.VERSION == version
    assert settings.SPECTACULAR_SETTINGS["VERSION"] == version


@pytest.mark.django_db
def test_openapi_schema_carries_the_package_version() -> None:
    """The served OpenAPI document's info.version is the package version."""
    response = Client().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    assert response.json()["info"]["version"] == _pyproject_version()


@pytest.mark.pure
def test_changelog_has_unreleased_and_the_current_version() -> None:
    """CHANGELOG.md keeps an Unreleased section first; a released version has a heading of its own, a pre-release
    is named in the Unreleased section (it has no release to head)."""
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", text, flags=re.MULTILINE)
    assert headings[0] == "Unreleased"
    version = _pyproject_version()
    if re.fullmatch(r"\d+\.\d+\.\d+", version):
        assert version in headings
    else:
        unreleased = text.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
        assert f"`{version}`" in unreleased


@pytest.mark.pure
def test_license_and_security_policy() -> None:
    """An Apache-2.0 LICENSE (as pyproject declares) and a SECURITY.md that points at docs/security.md."""
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"
    assert "docs/security.md" in (ROOT / "SECURITY.md").read_text()
