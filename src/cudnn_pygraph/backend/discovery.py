"""Where NVIDIA's cuDNN frontend lives, found by what it is: the files of its distribution
(`nvidia-cudnn-frontend`) and of the libcudnn wheels, read from their install records.

Never by importing the name `cudnn`: users of libraries that `import cudnn` themselves
(FlashInfer, TransformerEngine) alias `sys.modules["cudnn"] = cudnn_pygraph`, and a probe
by name would then find this very package. Nothing here loads anything; lowering.py loads
the compiled module from the path found here. Imports nothing heavy (importlib.metadata
only when first asked, once per process).
"""

import dataclasses
import functools
import os
import sys

DISTRIBUTION = "nvidia-cudnn-frontend"
# The compiled module's file stem: `_compiled_module` (1.x, also older releases), with
# `_pybind_module` accepted for a build that names the file as the package names it.
_COMPILED_STEMS = ("_compiled_module", "_pybind_module")
# The libcudnn wheels, newest CUDA first (their files: nvidia/cudnn/lib/libcudnn.so.9).
_LIBCUDNN_DISTRIBUTIONS = ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12")
_LIBCUDNN_NAMES = ("libcudnn.so.9", "libcudnn.so") if os.name != "nt" else ("cudnn64_9.dll",)


@dataclasses.dataclass(frozen=True)
class FrontendFiles:
    version: str  # the distribution's version, e.g. "1.32.0"
    module_name: str  # the compiled module's qualified name, e.g. "cudnn._compiled_module"
    module_path: str  # its file


def _distribution(name):
    import importlib.metadata

    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _is_extension(name):
    import importlib.machinery

    return any(name.endswith(suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES)


@functools.cache
def frontend_files():
    """(FrontendFiles, None), or (None, why not) when the frontend is not installed or
    its record names no compiled module."""
    dist = _distribution(DISTRIBUTION)
    if dist is None:
        return None, f"{DISTRIBUTION} is not installed"
    for f in dist.files or ():
        stem = f.name.split(".", 1)[0]
        if f.parts[0] != "cudnn" or stem not in _COMPILED_STEMS or not _is_extension(f.name):
            continue
        path = os.fspath(dist.locate_file(f))
        if os.path.isfile(path):
            name = ".".join(f.parts[:-1] + (stem,))
            return FrontendFiles(dist.version, name, path), None
    return (
        None,
        f"{DISTRIBUTION} {dist.version} is installed but its record names no compiled module",
    )


def libcudnn_candidates():
    """Paths (or bare library names) to try, in order: the dynamic loader's search path
    first (so a local libcudnn build overrides the wheel, as the frontend itself does),
    then the libcudnn wheels' own files, then the loader's search by library name."""
    found = []
    if os.name != "nt":
        for folder in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
            for name in _LIBCUDNN_NAMES:
                path = os.path.join(folder, name)
                if folder and os.path.isfile(path):
                    found.append(path)
    for dist_name in _LIBCUDNN_DISTRIBUTIONS:
        dist = _distribution(dist_name)
        for f in (dist.files or ()) if dist is not None else ():
            if f.name.startswith(("libcudnn.so.", "cudnn64_")) and f.parent.name in ("lib", "bin"):
                path = os.fspath(dist.locate_file(f))
                if os.path.isfile(path):
                    found.append(path)
    return found + list(_LIBCUDNN_NAMES)


def installed():
    """True when the frontend's compiled module is on disk (nothing is loaded)."""
    return frontend_files()[0] is not None


def loaded_module(files):
    """The compiled module when this process has already loaded it from `files` (NVIDIA's
    own `import cudnn` did), else None."""
    module = sys.modules.get(files.module_name)
    if module is not None and os.path.realpath(
        getattr(module, "__file__", "") or ""
    ) == os.path.realpath(files.module_path):
        return module
    return None
