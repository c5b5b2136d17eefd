"""Builds the one native piece: the variant pack (a CPython extension in plain C, no
framework headers). Everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "cudnn_pygraph.runtime._variant_pack",
            sources=["src/cudnn_pygraph/runtime/_variant_pack.c"],
            # one translation unit; the headers are its parts (edit one, rebuild)
            depends=[
                f"src/cudnn_pygraph/runtime/{h}"
                for h in (
                    "_dlpack.h",
                    "_variant_pack_view.h",
                    "_variant_pack_layout.h",
                    "_variant_pack_read.h",
                    "_variant_pack_buffer.h",
                    "_variant_pack_exec.h",
                )
            ],
            extra_compile_args=["-O2", "-std=c11"],
        )
    ]
)
