"""What the engine-level test modules (test_engines.py, test_gdn_engine.py,
test_gdp_engine.py) share: the device they run on, the relative error, a graph's tensors
declared over torch tensors, and a graph planned, built and executed."""

from __future__ import annotations

import torch

import cudnn_pygraph as cudnn
from cudnn_pygraph import data_type as dt

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
_DTYPES = {torch.float32: dt.FLOAT, torch.bfloat16: dt.BFLOAT16, torch.int32: dt.INT32,
           torch.int64: dt.INT64}  # fmt: skip


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def declare(g, x):
    """{name: graph tensor} of x's {name: torch tensor}, at their dims, strides and dtypes."""
    return {
        n: g.tensor(list(t.shape), list(t.stride()), data_type=_DTYPES[t.dtype], name=n)
        for n, t in x.items()
    }


def run_graph(g, pack):
    """g planned by heuristic A, built and executed on pack ({uid or tensor: torch tensor})."""
    g.create_execution_plans([cudnn.heur_mode.A])
    g.build_plans()
    size = g.get_workspace_size()
    workspace = torch.empty(size, dtype=torch.uint8, device=DEVICE) if size else None
    g.execute(pack, workspace)
    return g
