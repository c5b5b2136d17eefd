#!/usr/bin/env bash
# The variant pack under AddressSanitizer and UBSan: builds the extension with
# -fsanitize=address,undefined into a temporary copy of the package and runs tests/runtime
# against that copy. A use-after-free, an out-of-bounds read or a signed overflow aborts
# the run (UBSan does not recover), where a normal build may pass by luck.
#
#   tools/sanitizer_check.sh            (from the repository root; gcc or clang)
#
# The interpreter is not instrumented, so libasan is preloaded; PYTHONMALLOC=malloc makes
# Python objects ordinary heap blocks, so a freed object read through a borrowed pointer
# is reported. Leak detection is off: the interpreter keeps its own allocations to exit.
# The source tree is not touched.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CC=${CC:-gcc}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/sanitizer_check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

libasan=$("$CC" -print-file-name=libasan.so)
if [ ! -e "$libasan" ]; then
  echo "sanitizer_check: $CC has no libasan.so ($libasan); install the compiler's sanitizer runtime" >&2
  exit 1
fi

# A copy of the package (Python sources only), so the sanitized build shadows nothing.
mkdir -p "$WORK/src"
cp -r src/cudnn_pygraph "$WORK/src/"
rm -f "$WORK"/src/cudnn_pygraph/runtime/_variant_pack*.so
find "$WORK/src" -name __pycache__ -type d -prune -exec rm -rf {} +

flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1"
(
  cd "$WORK"
  CC="$CC" CFLAGS="$flags" LDFLAGS="-fsanitize=address,undefined" python3 - <<'EOF'
from setuptools import Distribution, Extension
from setuptools.command.build_ext import build_ext
import pathlib

runtime = pathlib.Path("src/cudnn_pygraph/runtime")
ext = Extension(
    "cudnn_pygraph.runtime._variant_pack",
    [str(runtime / "_variant_pack.c")],
    depends=[str(p) for p in sorted(runtime.glob("_*.h"))],
    extra_compile_args=["-std=c11", "-Wall", "-Wno-unused-parameter",
                        "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
)
dist = Distribution({"name": "cudnn_pygraph", "ext_modules": [ext], "package_dir": {"": "src"}})
cmd = build_ext(dist)
cmd.inplace = True
cmd.build_temp = "build_temp"
cmd.ensure_finalized()
cmd.run()
EOF
) >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log" >&2; exit 1; }

so=$(find "$WORK/src/cudnn_pygraph/runtime" -name '_variant_pack*.so' | head -1)
if ! nm -D "$so" | grep __asan_init >/dev/null; then
  echo "sanitizer_check: $so is not instrumented" >&2
  exit 1
fi
echo "sanitizer_check: built $so with $flags"

# The tests' own conftest rebuilds the source tree's extension when stale; that build is
# not the one imported here (PYTHONPATH puts the sanitized copy first).
export LD_PRELOAD="$libasan"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:alloc_dealloc_mismatch=0:new_delete_type_mismatch=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export PYTHONMALLOC=malloc
export CUDNN_PYGRAPH_TEST_VARIANT_PACKS=native  # the pure-Python pack has no C to check
export PYTHONPATH="$WORK/src:$ROOT/tests"
python3 -c '
import sys, cudnn_pygraph.runtime._variant_pack as m
assert "sanitizer_check" in m.__file__, f"imported {m.__file__}, not the sanitized build"
print("sanitizer_check: testing", m.__file__)
'
# The compiled-plan cache's tests hold no C of ours, and they load what aborts under the
# preloaded ASan runtime: libcudnn (the doctor case), Triton's gcc-built launchers and a
# stub libcuda (the launcher cases).
python3 -m pytest -q -p no:cacheprovider "$ROOT/tests/runtime" \
  --ignore="$ROOT/tests/runtime/test_compiled_cache.py" \
  --ignore="$ROOT/tests/runtime/test_compiled_cache_launcher.py" "$@"
