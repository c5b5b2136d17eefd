"""Triton GEMM with a fused pointwise epilogue (Hopper first): kernel, launch, configs."""

from .chain import EpilogueStep, step
from .knobs import GemmKnobs
from .spec import GemmSpec

__all__ = ["EpilogueStep", "GemmKnobs", "GemmSpec", "step"]
