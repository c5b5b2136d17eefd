"""Builds the one native piece: the variant pack (a CPython extension in plain C, no
framework headers). Everything else is declared in pyproject.toml.

The extension is optional: where it cannot be built (no C compiler, no Python headers) the
install goes on with one line saying so, and the package runs the pure-Python variant pack
(runtime/_variant_pack_python.py: the same rules and errors, slower per operand), which
`cudnn-pygraph doctor` names. The wheels CI builds carry the compiled module."""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NOTICE = (
    "cudnn-pygraph: the native variant pack was not built ({reason}); installing without it "
    "-- the pure-Python variant pack runs instead (same behaviour, slower per operand)"
)


class OptionalBuildExt(build_ext):
    """build_ext whose failure is one line, not a failed install."""

    skipped = False

    def run(self):
        try:
            super().run()
        except Exception as error:  # no compiler at all; or, once skipped, the copy in place
            if not self.skipped:  # (an editable install) of the module that was not built
                self._skip(error)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as error:  # the compiler failed or is missing (CC=/bin/false, no gcc)
            self._skip(error)

    def _skip(self, error):
        self.skipped = True
        compiler = getattr(getattr(self, "compiler", None), "compiler_so", None)
        if compiler:  # the compiler ran, or was not found: name it, not its whole command line
            reason = f"compiling with {compiler[0]!r} failed: {type(error).__name__}"
        else:
            reason = " ".join(str(error).split())[:160] or type(error).__name__
        print(NOTICE.format(reason=reason), file=sys.stderr)


setup(
    cmdclass={"build_ext": OptionalBuildExt},
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
    ],
)
