"""The compiled-plan cache's hit path on the GPU: a fresh process builds every python plan
of a family from a warm cache (no kernel compiled: every one read back and loaded) and its
first execute gives bit-identical outputs to the process that compiled them, also with
Triton's own cache empty (then without running the C compiler); with every cached binary
corrupted, the next process misses (never loads one) and still gives the same outputs. The children are bench/cold_start.py's (`--child FAMILY --small`), each a
fresh interpreter with private caches. The CPU suite covers the store itself
(tests/runtime/test_compiled_cache.py). Run:
PYTHONPATH=src:tests python -m pytest -q tests/gpu/test_compiled_cache_gpu.py
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("cold_start", ROOT / "bench" / "cold_start.py")
cold_start = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cold_start)


def _flip_one_byte_of_every_binary(root):
    """Every binary of the cache's entries (not those of the Triton cache it compiles in)."""
    from cudnn_pygraph.runtime import compiled_cache

    flipped = 0
    for cubin in (
        c for e in compiled_cache.entries(root) for c in pathlib.Path(e["path"]).glob("*.cubin")
    ):
        data = bytearray(cubin.read_bytes())
        data[len(data) // 2] ^= 0x5A
        cubin.write_bytes(bytes(data))
        flipped += 1
    return flipped


@pytest.mark.parametrize("family", cold_start.FAMILIES)
def test_a_fresh_process_builds_from_a_warm_cache_with_identical_outputs(tmp_path, family):
    ours, triton_dir = tmp_path / "ours", tmp_path / "triton"
    for d in (ours, triton_dir, tmp_path / "triton-empty"):
        d.mkdir(mode=0o700)
    outputs = [tmp_path / f"out{i}.pt" for i in range(3)]

    def run(i):
        return cold_start.run_child(family, "warm", ours, triton_dir, small=True,
                                    save=outputs[i])["cache"]  # fmt: skip

    first = run(0)
    assert first["misses"] >= 1, f"{family}: no kernel went through the cache: {first}"
    assert first["written"] == first["misses"] and first["invalid"] == 0, first

    second = run(1)
    assert second["hits"] == first["misses"], second
    assert second["misses"] == 0 and second["invalid"] == 0 and second["written"] == 0, second
    assert torch.equal(torch.load(outputs[0]), torch.load(outputs[1]))

    # a new machine that carries only our cache (Triton's empty): the kernels' launchers and
    # Triton's driver utilities come from our cache, so the C compiler runs for none of
    # them; only a kernel the cache does not persist (bypassed) may need a launcher built
    alone = cold_start.run_child(family, "ours", ours, tmp_path / "triton-empty", small=True,
                                 save=outputs[1])  # fmt: skip
    c = alone["cache"]
    assert c["hits"] == first["misses"] and c["misses"] == 0 and c["invalid"] == 0, c
    gcc = alone["where"].get("gcc", [0, 0])[1]
    assert gcc <= c["bypassed"], f"{family}: the C compiler ran {gcc} times: {alone['where']}"
    assert torch.equal(torch.load(outputs[0]), torch.load(outputs[1]))

    assert _flip_one_byte_of_every_binary(ours) == first["misses"]
    third = run(2)
    assert third["hits"] == 0 and third["invalid"] == first["misses"], third
    assert torch.equal(torch.load(outputs[0]), torch.load(outputs[2]))
