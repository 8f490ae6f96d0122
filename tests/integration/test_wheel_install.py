"""The built wheel, installed as a user installs it (issue #21).

Before issue #21 the wheel shipped six top-level packages; ``proto``, ``crypto`` and
``coordinator`` collided with proto-plus (overwriting its ``proto/__init__.py``, so
``google.api_core`` broke), with the public index's ``crypto`` (which then broke every
spherecal command) and, on case-insensitive file systems, with pycryptodome's
``Crypto``. This test builds the wheel from a copy of the repository, installs it
into throwaway venvs next to exactly those packages — the neighbours first in one,
spherecal first in the other — and checks that everyone still works, that
``import spherecal`` adds no other top-level name of ours, that RECORD holds one
top-level package, that a small federation runs from a directory outside the
repository, and that ``pip uninstall spherecal`` removes nothing of the neighbours'.

The venvs are bare (``--without-pip``; the running interpreter's pip drives them
through ``pip --python``) and see the heavy dependencies (torch, grpc, …) of the
interpreter running this test through one ``.pth`` line naming its site-packages
(derived from ``sysconfig``, so CI's ``.venv`` works the same). A plain path line adds
that directory without running its ``.pth`` files, so the editable install of the
source tree living there is *not* visible: ``spherecal`` comes from the wheel. The
neighbours are installed with ``--ignore-installed --no-deps`` so they land in the
throwaway venv's own site-packages, the directory the wheel writes into: that is
where files collide. Network: the package index, for the four neighbours only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
NEIGHBOURS = ("proto-plus", "google-api-core", "pycryptodome", "crypto")
# the file of each neighbour that a top-level package of ours would overwrite or delete
NEIGHBOUR_FILES = ("proto/__init__.py", "crypto/__init__.py", "Crypto/__init__.py")
# what each neighbour must still do
NEIGHBOURS_WORK = (
    "import proto, crypto, Crypto.Cipher.AES, google.api_core.rest_streaming; "
    "assert hasattr(proto, 'Message'), 'proto-plus lost its proto package'; "
    "print('neighbours ok')"
)
# the project's old top-level names: none may appear in sys.modules after import spherecal
OURS = ("proto", "crypto", "spherefed", "participant", "coordinator", "spherecal")
IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "*.so"
)
# setup.py builds the native masking kernel where a compiler and OpenSSL's headers exist
CAN_BUILD_KERNEL = bool(shutil.which("cc")) and Path("/usr/include/openssl/evp.h").exists()


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, (
        f"{cmd}: {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def _pip(venv: Path, *args: str) -> str:
    python = str(venv / "bin" / "python")
    return _run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", python, *args],
        cwd=venv,
    )


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _site_packages(venv: Path) -> Path:
    found = list((venv / "lib").glob("python3*/site-packages"))
    assert len(found) == 1, found
    return found[0]


def _venv(root: Path) -> Path:
    _run([sys.executable, "-m", "venv", "--without-pip", str(root)], cwd=root.parent)
    heavy = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (_site_packages(root) / "heavy-dependencies.pth").write_text("\n".join(sorted(heavy)) + "\n")
    return root


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the repository (the build writes build/ and
    *.egg-info next to the sources; the working tree stays as it is)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    shutil.copytree(REPO, source, symlinks=True, ignore=IGNORE)
    out = tmp / "dist"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(source),
        ],
        cwd=tmp,
    )
    (built,) = out.glob("spherecal-*.whl")
    return built


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The four neighbours' wheels, fetched from the package index once."""
    house = tmp_path_factory.mktemp("neighbours")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "--no-deps",
            "-q",
            "-d",
            str(house),
            *NEIGHBOURS,
        ],
        cwd=house,
    )
    return house


def _install_neighbours(venv: Path, house: Path) -> None:
    _pip(
        venv,
        "install",
        "-q",
        "--no-index",
        "--find-links",
        str(house),
        "--no-deps",
        "--ignore-installed",
        *NEIGHBOURS,
    )


def _install_wheel(venv: Path, wheel: Path) -> None:
    _pip(venv, "install", "-q", "--no-deps", "--ignore-installed", str(wheel))


def _python(venv: Path, code: str, cwd: Path) -> str:
    return _run([str(venv / "bin" / "python"), "-c", code], cwd=cwd, env=_clean_env())


def test_the_wheel_records_one_top_level_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (record,) = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
        rows = archive.read(record).decode().splitlines()
    tops = {row.split(",")[0].split("/")[0] for row in rows if row}
    assert tops == {"spherecal", record.split("/")[0]}, tops
    files = {row.split(",")[0] for row in rows}
    # the components are inside, as files (not links): the namespace is complete
    for inside in ("crypto/ring.py", "proto/spherecal_pb2.py", "coordinator/__init__.py"):
        assert f"spherecal/{inside}" in files, inside
    kernel = [
        f for f in files if f.startswith("spherecal/crypto/_maskkernel.") and f.endswith(".so")
    ]
    assert len(kernel) == (1 if CAN_BUILD_KERNEL else len(kernel)), kernel


@pytest.mark.parametrize("order", ["neighbours first", "spherecal first"])
def test_the_wheel_installs_beside_its_namesakes(
    order: str, wheel: Path, neighbours: Path, tmp_path: Path
) -> None:
    venv = _venv(tmp_path / "venv")
    site = _site_packages(venv)
    if order == "neighbours first":
        _install_neighbours(venv, neighbours)
        _install_wheel(venv, wheel)
    else:
        _install_wheel(venv, wheel)
        _install_neighbours(venv, neighbours)
    outside = tmp_path / "elsewhere"
    outside.mkdir()

    # spherecal comes from the wheel in this venv, not from a source tree
    where = _python(venv, "import spherecal; print(spherecal.__file__)", outside).strip()
    assert Path(where).resolve() == (site / "spherecal" / "__init__.py").resolve()
    assert _python(venv, NEIGHBOURS_WORK, outside).strip() == "neighbours ok"

    # import spherecal loads no other top-level name of ours (nor theirs, by our doing)
    probe = (
        "import sys, json; before = set(sys.modules); import spherecal; "
        "print(json.dumps(sorted({m.split('.')[0] for m in set(sys.modules) - before})))"
    )
    added = set(json.loads(_python(venv, probe, outside)))
    assert added - set(sys.stdlib_module_names) == {"spherecal"}, added
    assert not (added & set(OURS[:-1])), added

    # the wheel's native masking kernel loads where it was built (issue #24)
    loaded = _python(
        venv, "from spherecal.crypto import native; print(native.available())", outside
    )
    assert loaded.strip() == str(CAN_BUILD_KERNEL), loaded

    # every command still parses (the old crypto collision broke --help itself)
    spherecal = str(venv / "bin" / "spherecal")
    assert "simulate" in _run([spherecal, "--help"], cwd=outside, env=_clean_env())

    if order == "neighbours first":
        # a small federation, run from a directory that is not the repository
        out = outside / "run"
        _run(
            [
                spherecal,
                "simulate",
                "--participants",
                "3",
                "--rounds",
                "1",
                "--out",
                str(out),
                "--quiet",
            ],
            cwd=outside,
            env=_clean_env(),
        )
        results = json.loads((out / "results.json").read_text())
        assert results["status"] == "completed", results.get("status_reasons")
        assert results["settings"]["participants"] == 3

    before = {f: (site / f).read_bytes() for f in NEIGHBOUR_FILES}
    _pip(venv, "uninstall", "-y", "-q", "spherecal")
    assert not (site / "spherecal").exists()
    assert {f: (site / f).read_bytes() for f in NEIGHBOUR_FILES if (site / f).exists()} == before
    assert _python(venv, NEIGHBOURS_WORK, outside).strip() == "neighbours ok"
