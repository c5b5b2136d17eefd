"""Builds the one native piece: the variant pack (a CPython extension in plain C, no
framework headers). Everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "cudnn_pygraph.runtime._variant_pack",
            sources=["src/cudnn_pygraph/runtime/_variant_pack.c"],
            extra_compile_args=["-O2", "-std=c11"],
        )
    ]
)
