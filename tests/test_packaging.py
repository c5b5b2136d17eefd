"""What pyproject declares is what CI tests: the Pythons .ci/run installs are the oldest
and the newest that the classifiers name, and requires-python admits the oldest."""

import pathlib
import re

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
