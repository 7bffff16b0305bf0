"""What the built package promises a user: the spec it ships is found without a path, the license is
named in the metadata, the version is stated once, and the changelog follows Keep a Changelog.

Building and installing the wheel is CI's fresh-install check (.ci/run, .ci/fresh_install); these tests
check the files it is built from, in milliseconds."""

import re
import shutil
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")   # Python 3.11+

import minipos
from minipos.cli import main
from minipos.vectors import checker, files

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- the shipped spec

def test_spec_dir_prefers_the_spec_inside_the_package(tmp_path, monkeypatch):
    package = tmp_path / "site-packages" / "minipos"
    (package / "spec" / "vectors").mkdir(parents=True)
    (tmp_path / "site-packages" / "spec" / "vectors").mkdir(parents=True)    # a stray folder beside it
    monkeypatch.setattr(files, "_PACKAGE", str(package))
    assert files.spec_dir() == str(package / "spec" / "vectors")


def test_spec_dir_in_a_checkout_is_the_spec_beside_the_package(tmp_path, monkeypatch):
    (tmp_path / "minipos").mkdir()
    (tmp_path / "spec" / "vectors").mkdir(parents=True)
    monkeypatch.setattr(files, "_PACKAGE", str(tmp_path / "minipos"))
    assert files.spec_dir() == str(tmp_path / "spec" / "vectors")
    # and in this checkout, the committed spec
    monkeypatch.undo()
    assert Path(files.spec_dir()) == ROOT / "spec" / "vectors"


def test_spec_dir_without_a_spec_names_both_places(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_PACKAGE", str(tmp_path / "minipos"))
    with pytest.raises(FileNotFoundError, match=r"minipos/spec/vectors \(an installed wheel\) or .*/spec/vectors"):
        files.spec_dir()


def test_vectors_check_without_a_directory_checks_the_shipped_spec(tmp_path, monkeypatch, capsys):
    # the check itself is tested on spec/vectors elsewhere (and run on the installed wheel by CI): here,
    # that the command gives it the shipped directory when it is given none
    shipped = tmp_path / "minipos" / "spec" / "vectors"
    shipped.mkdir(parents=True)
    monkeypatch.setattr(files, "_PACKAGE", str(tmp_path / "minipos"))
    checked = []
    monkeypatch.setattr(checker, "check_families", lambda directory: checked.append(directory) or [])
    assert main(["vectors", "check"]) == 0
    assert checked == [str(shipped)]
    assert capsys.readouterr().out.strip().endswith(f"in 0 families of {shipped}")
    assert main(["vectors", "check", str(tmp_path)]) == 0 and checked[-1] == str(tmp_path)


def test_vectors_check_without_any_spec_is_one_line_and_status_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(files, "_PACKAGE", str(tmp_path / "minipos"))
    assert main(["vectors", "check"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("minipos vectors check: error: no golden vectors at ")


def test_the_wheel_carries_the_spec_where_spec_dir_looks():
    wheel = PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert sorted(wheel["packages"]) == ["minipos", "proofs"]
    force = wheel["force-include"]
    assert force["spec/vectors"] == "minipos/spec/vectors"
    for name in ("schema.json", "catalogue.md", "formulas.md", "README.md"):
        assert force[f"spec/{name}"] == f"minipos/spec/{name}"
        assert (ROOT / "spec" / name).is_file()
    assert (ROOT / "minipos" / "py.typed").is_file()


# ----------------------------------------------------------------------------- license, version, changelog

def test_the_license_is_named_in_the_pep_639_form_and_is_the_mit_text():
    project = PYPROJECT["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n")
    assert "Permission is hereby granted, free of charge, to any person obtaining a copy" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in text


def test_the_version_is_stated_once():
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["hatch"]["version"]["path"] == "minipos/__init__.py"
    assert re.fullmatch(r"\d+\.\d+\.\d+", minipos.__version__)
    citation = (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    assert not re.search(r"^version:", citation, re.M), "CITATION.cff takes the version from the release"
    assert "cff-version: 1.2.0" in citation and "license: MIT" in citation


def test_the_changelog_follows_keep_a_changelog():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog\n")
    assert "https://keepachangelog.com/en/1.1.0/" in text
    versions = re.findall(r"^## \[([^\]]+)\](.*)$", text, re.M)
    assert versions and versions[0][0] == "Unreleased"
    for version, rest in versions[1:]:                            # released: a version and its date
        assert re.fullmatch(r"\d+\.\d+\.\d+", version) and re.fullmatch(r" - \d{4}-\d{2}-\d{2}", rest)
    kinds = set(re.findall(r"^### (.+)$", text, re.M))
    assert kinds and kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
