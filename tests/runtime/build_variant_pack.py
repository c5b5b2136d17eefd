"""Build the variant pack's extension in place, for tests before the package build does.

    cd /work/main && python tests/runtime/build_variant_pack.py

The package's own build (setup.py) declares the same Extension; this script exists only so
the tests can run from a source tree. Temporary objects go to a scratch directory.
"""

import pathlib
import sys
import tempfile

from setuptools import Distribution, Extension
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNTIME = "src/cudnn_pygraph/runtime"
EXTENSION = Extension(
    "cudnn_pygraph.runtime._variant_pack",
    [f"{RUNTIME}/_variant_pack.c"],
    depends=[  # headers of the one translation unit: a change rebuilds
        str(p.relative_to(ROOT)) for p in sorted((ROOT / RUNTIME).glob("_*.h"))
    ],
    extra_compile_args=[
        "-O2",
        "-Wall",
        "-Wextra",
        "-Wno-unused-parameter",
        "-Wno-missing-field-initializers",
        "-Wno-cast-function-type",
    ],
)


def build() -> pathlib.Path:
    distribution = Distribution(
        {"name": "cudnn_pygraph", "ext_modules": [EXTENSION], "package_dir": {"": "src"}}
    )
    command = build_ext(distribution)
    command.inplace = True
    command.build_temp = tempfile.mkdtemp(prefix="variant_pack_build_")
    command.ensure_finalized()
    command.run()
    return pathlib.Path(command.get_ext_fullpath(EXTENSION.name))


if __name__ == "__main__":
    import os

    os.chdir(ROOT)
    print(build(), file=sys.stderr)
