"""A pytest plugin for tools/fla_suite.py's accelerated run: activate every fla target
before the first test, and write each test's route (its last rebound call: "ours" or
"fallback:<reason>", None when it called no target) to $FLA_SUITE_ROUTES as JSON."""

import json
import os
import pathlib

import cudnn_pygraph.fla as cfla

_ROUTES: dict = {}


def pytest_configure(config):
    cfla.accelerate_fla(verbose=False)


def pytest_runtest_setup(item):
    cfla._LAST.path = None


def pytest_runtest_teardown(item):
    # tools/fla_suite.py's case id: the test's module (or class) and its name
    parts = item.nodeid.split("::")
    owner = parts[-2] if len(parts) > 2 else pathlib.Path(parts[0]).stem
    _ROUTES[f"{owner}::{parts[-1]}"] = cfla.last_path()


def pytest_unconfigure(config):
    path = os.environ.get("FLA_SUITE_ROUTES")
    if path:
        with open(path, "w") as f:
            json.dump(_ROUTES, f)
