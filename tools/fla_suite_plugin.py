"""A pytest plugin for tools/fla_suite.py's runs. In both modes each test's cached device
memory goes back to the driver as it ends: the tool runs up to ten pytest processes on one
GPU, and a process's allocator otherwise keeps its peak for the rest of its file. In the
accelerated run ($FLA_SUITE_ROUTES set) it activates every fla target before the first test
and writes each test's route (its last rebound call: "ours" or "fallback:<reason>", None
when it called no target) there as JSON."""

import json
import os

import torch
from fla_suite import case_id  # tools/ is on the path of the runs that load this plugin

_ACCELERATED = bool(os.environ.get("FLA_SUITE_ROUTES"))
_ROUTES: dict = {}


def pytest_configure(config):
    if _ACCELERATED:
        import cudnn_pygraph.fla as cfla

        cfla.accelerate_fla(verbose=False)


def pytest_runtest_setup(item):
    if _ACCELERATED:
        import cudnn_pygraph.fla as cfla

        cfla._LAST.path = None


def pytest_runtest_teardown(item):
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    if not _ACCELERATED:
        return
    import cudnn_pygraph.fla as cfla

    _ROUTES[case_id(item.nodeid)] = cfla.last_path()


def pytest_unconfigure(config):
    path = os.environ.get("FLA_SUITE_ROUTES")
    if path:
        with open(path, "w") as f:
            json.dump(_ROUTES, f)
