"""What pyproject declares is what CI tests: the Pythons .ci/run installs are the oldest
and the newest that the classifiers name, and requires-python admits the oldest; the
extras install the tested stack; the license, the version and the sdist are each what a
packager expects."""

import pathlib
import re
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parent.parent


def declared_pythons():
    text = (ROOT / "pyproject.toml").read_text()
    versions = re.findall(r'"Programming Language :: Python :: 3\.(\d+)"', text)
    return sorted(int(v) for v in versions)


def test_ci_runs_the_oldest_and_newest_declared_python():
    minors = declared_pythons()
    assert minors, "pyproject.toml declares no 'Programming Language :: Python :: 3.N'"
    ci = (ROOT / ".ci" / "run").read_text()
    tested = re.search(r'^PYTHONS="([^"]*)"', ci, re.M).group(1).split()
    assert tested == [f"3.{minors[0]}", f"3.{minors[-1]}"]


def test_requires_python_admits_the_oldest_declared():
    text = (ROOT / "pyproject.toml").read_text()
    floor = re.search(r'requires-python\s*=\s*">=3\.(\d+)', text)
    assert floor is not None and int(floor.group(1)) == declared_pythons()[0]


def _extra(name):
    """The requirement strings of one optional-dependencies extra, read from pyproject."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(rf"^{re.escape(name)} = \[(.*?)\]", text, re.M | re.S).group(1)
    return re.findall(r'"([^"]+)"', block)


# The Triton each torch release's Linux wheel pins (torch's own metadata): a torch the extras
# admit must bring a Triton the tests admit, or pip installs an untested Triton (or
# backtracks through 0.5 GB torch downloads to find one that fits).
TORCH_PINS_TRITON = {"2.10.0": "3.6.0", "2.11.0": "3.6.0", "2.12.0": "3.7.0", "2.13.0": "3.7.1"}


@pytest.mark.parametrize("extra", ["torch", "demo", "test"])
def test_every_torch_an_extra_admits_pins_the_tested_triton(extra):
    torch_spec = next(Requirement(r) for r in _extra(extra) if r.startswith("torch"))
    triton_spec = next(Requirement(r) for r in _extra("test") if r.startswith("triton"))
    admitted = [t for t in TORCH_PINS_TRITON if torch_spec.specifier.contains(t)]
    assert admitted, f"[{extra}] admits none of the torch releases we know"
    for torch_version in admitted:
        assert triton_spec.specifier.contains(TORCH_PINS_TRITON[torch_version]), torch_version


@pytest.mark.parametrize("extra", ["torch", "triton", "demo", "test"])
def test_the_cpu_users_extras_bring_nothing_of_nvidias(extra):
    """NVIDIA's frontend and libcudnn (and the CuTe DSL the frontend pulls) come only with
    the backend's extras; the backend's tests skip without them."""
    names = {Requirement(r).name for r in _extra(extra)}
    assert not {n for n in names if n.startswith(("nvidia-", "cuda-"))}, names


@pytest.mark.parametrize("extra", ["cudnn", "cudnn-cu12"])
def test_the_backend_extras_bring_libcudnn(extra):
    names = {Requirement(r).name for r in _extra(extra)}
    assert "nvidia-cudnn-frontend" in names
    assert names & {"nvidia-cudnn-cu12", "nvidia-cudnn-cu13"}, names


def test_the_license_is_a_file_and_an_spdx_expression():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^license = "Apache-2\.0"$', text, re.M)  # PEP 639, not a TOML table
    assert re.search(r'^license-files = \["LICENSE"\]$', text, re.M)
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]


def test_the_version_is_written_in_one_place():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text and "cudnn_pygraph._version.__version__" in text
    version = re.search(
        r'__version__ = "([^"]+)"', (ROOT / "src/cudnn_pygraph/_version.py").read_text()
    ).group(1)
    written = [
        p.relative_to(ROOT).as_posix()
        for p in [ROOT / "pyproject.toml", ROOT / "setup.py", *(ROOT / "src").rglob("*.py")]
        if f'"{version}"' in p.read_text()
    ]
    assert written == ["src/cudnn_pygraph/_version.py"]
    assert (ROOT / "src/cudnn_pygraph/py.typed").exists()


def test_the_sdist_carries_the_tests_with_their_helpers(tmp_path):
    """setuptools' own file list for the sdist (egg_info reads MANIFEST.in): the tests run
    from an unpacked sdist only with their conftests, fakes and reference helpers."""
    pytest.importorskip("setuptools", minversion="77")  # reads PEP 639's license fields
    subprocess.run(
        [sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    files = set((next(tmp_path.glob("*.egg-info")) / "SOURCES.txt").read_text().split())
    for needed in (
        "tests/conftest.py",
        "tests/runtime/conftest.py",
        "tests/fakes/__init__.py",
        "tests/linear_attention/reference.py",
        "src/cudnn_pygraph/runtime/_variant_pack.c",
        "src/cudnn_pygraph/runtime/_variant_pack_python.py",
        "src/cudnn_pygraph/py.typed",  # PEP 561: the annotations are for type checkers
        "LICENSE",
    ):
        assert needed in files, needed
    assert not [f for f in files if f.endswith((".so", ".pyc"))]
