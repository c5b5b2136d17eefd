"""Every benchmark's cases in one table: a new row of a bench table is one entry of CASES.

A case is (table, name, params): `table` names the bench table it is a row of, `name` is
the row's label (what a script's --only matches: bench/runner.py), `params` what the script
builds the row from (sequence lengths, a shape). The scripts take their rows from here
through the runner and keep no list of their own. Importing this module touches no GPU.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Case:
    table: str
    name: str
    params: dict


def _mixed_lengths(count, lo, hi, seed):
    """`count` sequence lengths in [lo, hi], the same on every run (a CPU generator)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, (count,), generator=gen).tolist()


def _gemm(table, shapes):
    return [Case(table, "x".join(map(str, mnk)), {"mnk": mnk}) for mnk in shapes]


_GEMM_SQUARE = [(1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192)]
_GEMM_LLM = [(m, n, k) for m in (16, 128, 4096) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336))]  # fmt: skip
# sixteen sequences of 256..8192 tokens, long and short interleaved (43840 in all)
_SDPA_THD_LENS = (256, 8192, 512, 4096, 1024, 2048, 384, 6144, 768, 3072, 1536, 5120, 320,
                      7168, 640, 2560)  # fmt: skip

CASES = (
    # The linear-attention rows, bf16, H = HV = 16, K = V = 128 (bench/la_families.py):
    # gdn.py, kda.py, gdp.py, gdn_wy_bwd.py, la_stages.py and la_training.py.
    Case("la", "(a) 8 x 4096", {"seqlens": [4096] * 8}),
    Case("la", "(b) 1 x 32768", {"seqlens": [32768]}),
    Case("la", "(c) 64 mixed 64..2048", {"seqlens": _mixed_lengths(64, 64, 2048, seed=0)}),
    # CPU smoke runs under the interpreter (fla_accel.py --dry): two short sequences.
    Case("la.dry", "dry 16 + 24", {"seqlens": [16, 24]}),
    # Compile only: row (a)'s kernel binaries on few tokens (gdn_wy_bwd.py --warm).
    Case("la.warm", "warm 8 x 128", {"seqlens": [128] * 8}),
    # One long sequence run as a chain of pieces (gdn.py --chain).
    Case("la.chain", "(d) 1 x 131072", {"seqlens": [131072]}),
    # backend.py: host µs per execute where the device idles (sdpa: b, h, s, d, causal) ...
    Case("backend.host", "matmul 128x256x128 bf16", {"kind": "matmul", "shape": (128, 256, 128)}),
    Case(
        "backend.host",
        "sdpa B1 H1 S128 D64 bf16",
        {"kind": "sdpa", "shape": (1, 1, 128, 64, False)},
    ),
    # ... and kernel ms of the backend's first plan where it does not.
    Case(
        "backend.kernel",
        "sdpa fwd B2 H16 S8192 D128 bf16 causal",
        {"kind": "sdpa", "shape": (2, 16, 8192, 128, True)},
    ),
    Case("backend.kernel", "matmul 8192^3 bf16", {"kind": "matmul", "shape": (8192, 8192, 8192)}),
    # gemm.py: bf16 square and LLM projection shapes, fp8 at two sizes.
    *_gemm("gemm.bf16", _GEMM_SQUARE + [s for s in _GEMM_LLM if s not in _GEMM_SQUARE]),
    *_gemm("gemm.fp8", [(4096, 4096, 4096), (8192, 8192, 8192)]),
    # cold_start.py: what each family declares, full size and --small (the GPU test's).
    Case(
        "cold_start",
        "gemm",
        {"full": {"M": 4096, "N": 4096, "K": 4096}, "small": {"M": 256, "N": 384, "K": 512}},
    ),
    Case(
        "cold_start",
        "sdpa_prefill",
        {
            "full": {"b": 2, "h": 16, "s": 2048, "d": 128},
            "small": {"b": 1, "h": 2, "s": 128, "d": 64},
        },
    ),
    Case(
        "cold_start",
        "decode",
        {
            "full": {"b": 8, "hq": 32, "hkv": 8, "kv": 1024, "page": 16, "d": 128},
            "small": {"b": 2, "hq": 4, "hkv": 2, "kv": 100, "page": 16, "d": 64},
        },
    ),
    Case(
        "cold_start",
        "gdn_op",
        {
            "full": {"seqs": 2, "len": 1024, "h": 16, "dim": 128},
            "small": {"seqs": 2, "len": 64, "h": 2, "dim": 128},
        },
    ),
    # sdpa_fwd.py, bf16: dense (b, h, s, d, causal), THD, then the serving decode (which
    # sdpa_host.py times back to back too); "budget" is the share of sdpa_fwd's --budget-s
    # the run may have spent when the row's configs stop.
    Case(
        "sdpa_fwd.dense",
        "B2 H16 S8192 D128 causal",
        {"shape": (2, 16, 8192, 128, True), "budget": 0.3},
    ),
    Case(
        "sdpa_fwd.dense",
        "B2 H16 S8192 D128 non-causal",
        {"shape": (2, 16, 8192, 128, False), "budget": 0.5},
    ),
    Case(
        "sdpa_fwd.dense",
        "B8 H16 S2048 D64 causal",
        {"shape": (8, 16, 2048, 64, True), "budget": 0.62},
    ),
    Case(
        "sdpa_fwd.thd",
        "THD 16 seqs 256..8192 (sum 43840) GQA 32/8 D128 causal",
        {"lens": _SDPA_THD_LENS, "hq": 32, "hkv": 8, "d": 128, "budget": 0.8},
    ),
    *(
        Case(
            "sdpa.decode",
            f"decode 64 req x 1 q, 4096 paged kv (page {page}), GQA 32/8 D128",
            {"b": 64, "hq": 32, "hkv": 8, "d": 128, "kv": 4096, "page": page, "budget": share},
        )
        for page, share in ((16, 0.9), (64, 1.0))
    ),
    # sdpa_ranked.py: the graphs the plan lists are ranked for; tiny under --dry.
    *(
        Case("sdpa_ranked", name, {"graph": graph, "args": args})
        for name, graph, args in (
            ("B2 H16 S8192 D128 causal", "dense", (2, 16, 8192, 128, True)),
            ("B2 H16 S8192 D128 non-causal", "dense", (2, 16, 8192, 128, False)),
            ("B8 H16 S2048 D64 causal", "dense", (8, 16, 2048, 64, True)),
            ("THD 16 seqs GQA 32/8 D128 causal", "thd", (list(_SDPA_THD_LENS), 32, 8, 128)),
            ("decode 64 x 4096 keys GQA 32/8 D128 page 16", "paged", (64, 32, 8, 128, 16, 4096)),
            ("decode 64 x 4096 keys GQA 32/8 D128 page 64", "paged", (64, 32, 8, 128, 64, 4096)),
        )
    ),
    *(
        Case("sdpa_ranked.dry", name, {"graph": graph, "args": args})
        for name, graph, args in (
            ("dense B1 H2 S32 D64 causal", "dense", (1, 2, 32, 64, True)),
            ("THD 3 seqs GQA 4/2 D64", "thd", ([5, 17, 9], 4, 2, 64)),
            ("decode 2 x 64 keys GQA 4/2 D64 page 16", "paged", (2, 4, 2, 64, 16, 64)),
        )
    ),
    # sdpa_bwd.py, bf16: dense (b, h, s, d, causal), then THD sequences with GQA, causal.
    Case("sdpa_bwd.dense", "B2 H16 S8192 D128 causal", {"shape": (2, 16, 8192, 128, True)}),
    Case("sdpa_bwd.dense", "B2 H16 S8192 D128 non-causal", {"shape": (2, 16, 8192, 128, False)}),
    Case("sdpa_bwd.dense", "B8 H16 S2048 D64 causal", {"shape": (8, 16, 2048, 64, True)}),
    Case(
        "sdpa_bwd.thd",
        "THD 16 seqs 256..8192 GQA 32/8 D128 causal",
        {"lens": _SDPA_THD_LENS, "hq": 32, "hk": 8, "d": 128},
    ),
)


def cases(table: str) -> list:
    """The cases of one table, in the order it runs them."""
    found = [c for c in CASES if c.table == table]
    if not found:
        raise KeyError(f"bench/cases.py has no table {table!r}")
    return found
