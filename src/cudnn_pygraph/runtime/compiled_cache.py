"""The compiled-plan cache: every Triton kernel a python plan compiles is kept on disk, so a
later process on the same machine loads it in milliseconds instead of compiling it again.

`compile(src, target, options)` is the drop-in for `triton.compile` at every compile site
of the package (runtime/launch.py, runtime/launch_replay.py). It returns Triton's own
`CompiledKernel`: on a miss the one Triton compiled, persisted and read back from the
cache; on a hit the one read from the cache. Both are loaded and launched by the same
launcher (launch.Kernel), so what a hit runs is exactly what a miss runs; a bad artifact
fails when it is written, not at the next start-up.

Layout: <root>/v<SCHEMA>/<environment hash>/<entry hash>/
    <sha256>.cubin   the binary Triton's loader takes
    <sha256>.json    Triton's kernel metadata (what its launcher and `Kernel` read: shared
                     memory, warps, scratch sizes, cooperative / PDL launch, target)
    <sha256>.so      Triton's C launcher of the kernel's signature (a CPython extension
                     the host C compiler builds), when it could be built here
    record.json      the commit marker, written last: the full key, the environment, the
                     file names with their sha256 and sizes
<root>/v<SCHEMA>/.cudnn_pygraph-compiled-cache marks the schema directory as the cache's
own, written as it is made: only a marked directory is read, counted or ever deleted (a root
pointed at a project folder keeps that folder's own v1/, v7/). <root>/v<SCHEMA>/triton/ is
Triton's cache while this one compiles (below).
Every file is written to a temporary name in its directory and moved into place with
os.replace; artifact files are named by their digest, so concurrent writers of one entry
never mix bytes, and a process killed mid-write leaves no record, hence no entry.

Compiling on a miss: Triton keeps what it compiles in its cache directory (TRITON_CACHE_DIR,
else ~/.triton/cache) and hands back what it finds there instead of compiling, so what it
returns is only as trustworthy as that directory, which may be shared. A miss here points
Triton's cache at <root>/v<SCHEMA>/triton/ (checked as the rest of the root) for the compile
and the C modules it builds, so nothing planted in the user's Triton cache is ever kept.

The launcher: Triton builds it when a kernel is first loaded (CudaLauncher ->
compile_module_from_src), keyed in its own cache by the sha256 of the generated C source
and the platform, and loads it from there. A miss here has Triton build it (into the
private cache above) and keeps a copy; a hit recomputes Triton's key for
this kernel in this process, checks it is the one recorded, and puts the verified copy into
Triton's cache under that key unless Triton already has one. Triton's own lookup then finds
it and loads it by its own code; the compiler never runs. A process whose Triton cache
already holds the launcher loads that one, exactly as without this cache. Triton's driver
utilities (cuda_utils, compiled from its driver.c when its driver is first made in a
process) go the same way, once per environment, in <environment hash>/triton-driver/:
built in the private cache and kept at a process's first write, handed to Triton's cache
before its driver is made (`prepare_triton_driver`).

The rules (spec: "The compiled-plan cache"), kept here:
  * identity is hashed whole: the package version and a digest of every .py in it (an
    edited checkout does not move the version; a kernel compiles from the helpers it
    imports as much as from its own source), the triton / torch versions, the CUDA
    version torch was built for, the driver's CUDA version, Triton's cache-invalidating
    variables, the interpreter's extension ABI (the launcher is an extension module of
    it), and the device (name, compute capability, SM count, L2 size). Any change
    lands in another directory; an unreadable field hashes as "unknown", never skipped;
  * trust comes from ownership, not from digests: every directory from the root down and
    every file read must be this user's and writable by no one else, and every directory
    above the root root's or this user's and writable by no one else unless sticky (/tmp).
    A writer who could change an artifact could change its record too, so the sha256 in
    the record is a check against corruption, not an authentication;
  * an entry is reused only under its own embedded key and environment, compared whole
    on load, and only after every artifact's size and sha256 match its record;
  * anything doubtful (missing, malformed, mismatched, a symlink, a FIFO or device, a
    file of another owner or writable by others) is a miss, never an error in the
    caller's call, and never opened in a way that can block;
  * the root must pass those checks (and its schema directory be marked as ours);
    otherwise the cache is off for the process, with one warning saying why. Nothing
    inside the root is reached through a symlink; directories made here are 0700
    whatever the umask;
  * only kernels whose source is in this package are persisted (the source digest covers
    them), and only when every part of the key is a plain value; the cache stands aside
    while Triton is asked to compile every time, override or dump kernels.
Location: CUDNN_PYGRAPH_COMPILED_CACHE, else $XDG_CACHE_HOME/cudnn_pygraph/compiled_plans
(~/.cache when XDG_CACHE_HOME is unset); CUDNN_PYGRAPH_DISABLE_COMPILED_CACHE=1 turns it
off. A process's first write retires dead environments, whole directories, other marked schemas
first, then the private Triton cache, then oldest first, until what the cache marked as its
own is under CUDNN_PYGRAPH_COMPILED_CACHE_MAX_BYTES (4 GiB by default; 0: no limit); the
live environment is never a candidate.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import pathlib
import re
import shutil
import stat
import sysconfig
import tempfile
import threading
import time
import warnings

from .._log import log

CACHE_ENV = "CUDNN_PYGRAPH_COMPILED_CACHE"
DISABLE_ENV = "CUDNN_PYGRAPH_DISABLE_COMPILED_CACHE"
MAX_BYTES_ENV = "CUDNN_PYGRAPH_COMPILED_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 4 << 30
SCHEMA = 3  # bump on any incompatible change of the layout, the record or the key
RECORD = "record.json"
MARKER = ".cudnn_pygraph-compiled-cache"  # in each schema directory the cache made
_MARKER_TEXT = b"cudnn_pygraph compiled-plan cache: this directory is the cache's own\n"
_TRITON_DIR = "triton"  # Triton's cache while this one compiles (not an environment hash)
_PACKAGE = __name__.split(".")[0]
_PKG_ROOT = pathlib.Path(__file__).resolve().parent.parent
_SCHEMA_DIR = re.compile(r"v\d+")
_HASH_DIR = re.compile(r"[0-9a-f]{24}")
_ARTIFACT = re.compile(r"[0-9a-f]{64}\.(cubin|json|so)")
# The module name Triton's CudaLauncher builds a kernel's launcher under, and the file name
# it gives it (triton 3.6 backends/nvidia/driver.py, runtime/build.py).
_LAUNCHER = "__triton_launcher"
_DRIVER_MODULE = "cuda_utils"  # Triton's driver utilities (CudaUtils), built the same way
_DRIVER_DIR = "triton-driver"  # where an environment keeps them (not a kernel's entry name)
_EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or "unknown"
_SUFFIX = {
    "cubin": "cubin",
    "json": "json",
    "launcher": "so",
    "module": "so",
}  # an artifact's kind: its suffix
_RECORD_MAX_BYTES = 1 << 20
_MODULE_MAX_BYTES = 256 << 20  # a C module of Triton's read back from its cache
_TRITON_ENV = ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH", "TRITON_LIBDEVICE_PATH")


# ---------------------------------------------------------------- the environment
# (planning/autotune.py keys its cache on the same pieces; they live here, below it.)
def cache_home() -> pathlib.Path:
    """$XDG_CACHE_HOME/cudnn_pygraph (~/.cache/cudnn_pygraph): where the package's caches
    live unless their own variable moves them."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / _PACKAGE


@functools.cache
def source_digest() -> str:
    """sha256 over every .py of the installed package (path and bytes), once per process.

    Every byte is read every process: a key on mtimes and sizes would miss an edit that
    keeps both. The walk skips __pycache__ (as many entries again, none of them sources)."""
    h = hashlib.sha256()
    for rel in _package_sources():
        h.update(rel.encode())
        try:
            with open(os.path.join(_PKG_ROOT, rel), "rb") as f:
                h.update(f.read())
        except OSError:
            h.update(b"unknown")
    return h.hexdigest()


def _package_sources() -> list:
    """The package's .py files as sorted '/'-joined paths relative to its root."""
    found = []
    for dirpath, dirnames, filenames in os.walk(_PKG_ROOT):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        rel = os.path.relpath(dirpath, _PKG_ROOT).replace(os.sep, "/")
        prefix = "" if rel == "." else rel + "/"
        found += [prefix + name for name in filenames if name.endswith(".py")]
    return sorted(found)


def dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except Exception:  # noqa: BLE001 - any metadata trouble is "unknown", never an error
        return "unknown"


def _driver_version():
    import ctypes

    try:
        v = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v)) == 0:
            return v.value
    except (OSError, AttributeError):
        pass
    return "unknown"


def _triton_env():
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars

        found = dict(get_cache_invalidating_env_vars())
    except Exception:  # noqa: BLE001 - an unreadable field hashes as "unknown"
        found = {"unknown": True}
    found.update({k: os.environ[k] for k in _TRITON_ENV if k in os.environ})
    return found


def environment(device: dict) -> dict:
    """The manifest an artifact was made under. `device`: {"name", "cc": [major, minor],
    "sm_count", "l2_bytes"} of the GPU the kernel is compiled for and loaded on."""
    from .._version import __version__

    # The loaded modules' own versions: what compiles and loads (and ~10 ms cheaper than
    # the distributions' metadata, on a path whose goal is milliseconds).
    try:
        import torch

        torch_version, cuda = torch.__version__, torch.version.cuda or "none"
    except ImportError:
        torch_version = cuda = "unknown"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "unknown"
    return {
        "package": __version__,
        "sources": source_digest(),
        "triton": triton_version,
        "torch": torch_version,
        "cuda": cuda,
        "driver": _driver_version(),
        "triton_env": _triton_env(),
        "python": _EXT_SUFFIX,
        "device": device,
    }


def device_facts(ordinal: int) -> dict:
    """What the environment records of CUDA device `ordinal` (torch's view of it)."""
    import torch

    try:
        p = torch.cuda.get_device_properties(ordinal)
        return {
            "name": p.name,
            "cc": [p.major, p.minor],
            "sm_count": p.multi_processor_count,
            "l2_bytes": getattr(p, "L2_cache_size", "unknown"),
        }
    except Exception:  # noqa: BLE001 - unreadable: the environment says so, never skips it
        return {"name": "unknown", "ordinal": ordinal}


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def environment_hash(env: dict) -> str:
    return _digest(env)[:24]


# ---------------------------------------------------------------- the key
class _NotPlain(Exception):
    pass


def _plain(v):
    """v as JSON-ready data that names it exactly, or _NotPlain (such a kernel is not
    persisted: a value whose text does not pin it could name two different kernels)."""
    if v is None or type(v) in (bool, int, float, str):
        return v
    if type(v) in (tuple, list):
        return [_plain(x) for x in v]
    if type(v) is dict:
        return [[_plain(k), _plain(x)] for k, x in v.items()]
    import triton.language as tl

    if isinstance(v, tl.constexpr):
        return _plain(v.value)
    if isinstance(v, tl.dtype):
        return {"dtype": str(v)}
    raise _NotPlain(type(v).__name__)


def kernel_key(src, target, options):
    """The entry's key: the kernel (module, name, the digest of its own source text), its
    specialization (signature, constexprs, attributes), the compile options as Triton's
    backend completes them (defaults that Triton's variables can move included) and the
    target. None when it cannot be persisted: a kernel outside this package, or a part
    that is not a plain value."""
    fn = getattr(src, "fn", None)
    module = getattr(getattr(fn, "fn", None), "__module__", "") or ""
    if not module.startswith(_PACKAGE + "."):
        return None
    from triton.compiler import make_backend

    try:
        options = make_backend(target).parse_options(dict(options or {})).__dict__
        key = {
            "kernel": f"{module}:{fn.fn.__qualname__}",
            "source": hashlib.sha256(fn.src.encode()).hexdigest(),
            "signature": _plain(dict(src.signature)),
            "constexprs": _plain(dict(src.constants)),
            "attrs": _plain(dict(src.attrs)),
            "options": _plain(dict(options or {})),
            "target": [target.backend, target.arch, target.warp_size],
        }
    except (_NotPlain, AttributeError, TypeError, ValueError):
        return None
    return json.loads(json.dumps(key))  # the form a record reads back, compared whole


def _compile_requested() -> bool:
    """Triton asked to compile every time (TRITON_ALWAYS_COMPILE), to override a kernel's IR
    from files (TRITON_KERNEL_OVERRIDE) or to dump it (TRITON_KERNEL_DUMP): a cached binary
    would defeat what the user is doing, so the cache stands aside; so it does under a cache
    manager of the user's (TRITON_CACHE_MANAGER), which the private directory cannot
    replace."""
    try:
        from triton import knobs

        c = knobs.compilation
        # a cache manager of the user's: where Triton reads its cache is not ours to check
        return bool(c.always_compile or c.override or c.dump_ir or knobs.cache.manager_class)
    except Exception:  # noqa: BLE001 - a Triton without these knobs asks for nothing
        return False


# ---------------------------------------------------------------- Triton's C modules
def _launcher_source(src, metadata) -> str:
    """The C source of this kernel's launcher as CudaLauncher (triton 3.6
    backends/nvidia/driver.py) generates it: make_launcher on the kernel's constants (by
    parameter index), signature and tensor descriptors."""
    from triton.backends.nvidia.driver import make_launcher

    names = src.fn.arg_names
    constants = {
        ((names.index(k),) if isinstance(k, str) else k): v
        for k, v in getattr(src, "constants", {}).items()
    }
    return make_launcher(constants, dict(src.signature), getattr(metadata, "tensordesc_meta", None))


def _module_key(text: str) -> str:
    """The key Triton's cache holds a C module of source `text` under, as
    compile_module_from_src (runtime/build.py) computes it. Should Triton change this or
    the source it generates, the key misses Triton's: Triton then builds the module
    itself, as without this cache (tests/runtime/test_compiled_cache_launcher.py)."""
    from triton.runtime.build import platform_key

    return hashlib.sha256((text + platform_key()).encode()).hexdigest()


def _module_file(name) -> str:
    """The file name Triton's cache gives C module `name` (an extension of this interpreter)."""
    return f"{name}{_EXT_SUFFIX}"


def _driver_module_key() -> str:
    """Triton's key of its driver utilities: their C source, as CudaUtils reads it."""
    from triton.backends.nvidia import driver as nvidia

    return _module_key(pathlib.Path(nvidia.dirname, "driver.c").read_text())


def _offer_module(key, name, blob) -> bool:
    """Put a verified C module `name` of Triton's into Triton's cache under `key`, unless
    Triton has one there: its own lookup (compile_module_from_src) then loads it instead of
    compiling it. True when Triton's cache holds one; never raises (Triton then builds it,
    as without this cache)."""
    from triton.runtime.cache import get_cache_manager

    file = _module_file(name)
    try:
        cache = get_cache_manager(key)
        if cache.get_file(file) is None:
            cache.put(blob, file, binary=True)
    except Exception as exc:  # noqa: BLE001 - Triton's cache unusable: it compiles, as before
        log.info("compiled-plan cache: %s not handed to Triton's cache: %s", name, exc)
        return False
    return True


# ---------------------------------------------------------------- counters
# This process's traffic: hits, misses (no entry), invalid (an entry there but doubtful),
# bypassed (off, refused, or a kernel that is not persisted), written, pruned (environment
# directories retired), refused (a cache root that failed the safety checks).
_STATS = dict.fromkeys(("hits", "misses", "invalid", "bypassed", "written", "pruned", "refused"), 0)
_LOCK = threading.Lock()


def _count(name, n=1):
    with _LOCK:
        _STATS[name] += n


def stats() -> dict:
    """A copy of this process's counters."""
    with _LOCK:
        return dict(_STATS)


# ---------------------------------------------------------------- location and safety
def enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "") in ("", "0")


def cache_root() -> pathlib.Path:
    given = os.environ.get(CACHE_ENV)
    return pathlib.Path(given) if given else cache_home() / "compiled_plans"


def max_bytes() -> int:
    try:
        return max(0, int(os.environ.get(MAX_BYTES_ENV, DEFAULT_MAX_BYTES)))
    except ValueError:
        return DEFAULT_MAX_BYTES


class Unsafe(Exception):
    """A path the cache will not use; the message says why."""


_GO_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _check_dir(st, path):
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise Unsafe(f"{path} is {kind}")
    _check_owner(st, path)


def _check_owner(st, path):
    if st.st_uid != os.geteuid():
        raise Unsafe(f"{path} is owned by uid {st.st_uid}, not this user ({os.geteuid()})")
    if st.st_mode & _GO_WRITE:
        raise Unsafe(f"{path} is writable by group or others (mode {st.st_mode & 0o777:o})")


def _check_file(st, path):
    if not stat.S_ISREG(st.st_mode):
        raise Unsafe(f"{path} is not a regular file")
    _check_owner(st, path)


def _check_ancestors(path):
    """Every directory above `path` (as given and as resolved; those not made yet are
    skipped) is root's or this user's and writable by no one else, unless sticky (/tmp):
    otherwise another user could move `path` aside and put one of their own in its place."""
    for start in {os.path.abspath(path), os.path.realpath(path)}:
        parent = os.path.dirname(start)
        while True:
            try:
                st = os.stat(parent)
            except FileNotFoundError:
                parent = os.path.dirname(parent)
                continue
            if st.st_uid not in (0, os.geteuid()):
                raise Unsafe(f"{parent}, above the cache, is owned by uid {st.st_uid}")
            if st.st_mode & _GO_WRITE and not st.st_mode & stat.S_ISVTX:
                raise Unsafe(
                    f"{parent}, above the cache, is writable by group or others "
                    f"(mode {st.st_mode & 0o777:o})"
                )
            if os.path.dirname(parent) == parent:
                break
            parent = os.path.dirname(parent)


def _mkdir_private(path) -> bool:
    """Make directory `path` 0700 whatever the umask; False when it was already there."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return False
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    try:
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return True


def check_root(root, create=False):
    """None when `root` is usable, else why not. `create` makes it (and any missing parent)
    0700 if absent. The root may itself be reached through a symlink (a home on another
    disk); nothing under it may."""
    root = pathlib.Path(root)
    try:
        _check_ancestors(root)  # before anything is made there
        if create:
            missing = [root.absolute()]
            while not os.path.lexists(missing[-1].parent):
                missing.append(missing[-1].parent)
            for d in reversed(missing):
                _mkdir_private(d)
        _check_dir(os.stat(root), root)
        _check_ancestors(root)
    except FileNotFoundError:
        return None if not create else f"{root} could not be created"
    except Unsafe as exc:
        return str(exc)
    except OSError as exc:
        return f"{root}: {exc.strerror or exc}"
    return None


def _inner_dir(path, create):
    """A directory under the root, never through a symlink: (made and) checked by lstat.
    False when absent and not created."""
    if create:
        _mkdir_private(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    _check_dir(st, path)
    return True


def _is_marked(path) -> bool:
    """`path` is a directory the cache made (see MARKER), passing the inner directories'
    checks; never raises."""
    try:
        _check_dir(os.lstat(path), path)
        return _read_file(os.path.join(path, MARKER), len(_MARKER_TEXT)) == _MARKER_TEXT
    except (OSError, Unsafe):
        return False


def _schema_dir(path, create):
    """The schema directory: an inner directory that is also marked as the cache's own. An
    existing one without the marker (a folder of the user's that happens to be named v3) is
    not ours: Unsafe. Made under a temporary name with its marker and moved into place, so
    no one sees it unmarked. False when absent and not created."""
    if create and not os.path.lexists(path):
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(path))
        try:
            os.chmod(tmp, 0o700)
            _write_file(tmp, MARKER, _MARKER_TEXT)
            if not os.path.lexists(path):  # never over one that appeared meanwhile
                with contextlib.suppress(OSError):  # another process made it: checked below
                    os.rename(tmp, path)
        finally:
            _remove(tmp)
    if not _inner_dir(path, create=False):
        return False
    if not _is_marked(path):
        raise Unsafe(f"{path} was not made by this cache (it has no {MARKER})")
    return True


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_READ_FLAGS = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _read_file(path, limit):
    """The bytes of a file of ours at `path`. A FIFO, a device or a symlink is refused by
    lstat before any open; the open follows no symlink and never blocks (a FIFO swapped in
    meanwhile), and fstat checks the file opened is that regular file, this user's and
    writable by no one else, before a byte is read."""
    before = os.lstat(path)
    _check_file(before, path)
    fd = os.open(path, _READ_FLAGS)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        _check_file(st, path)
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise Unsafe(f"{path} changed while it was opened")
        if st.st_size > limit:
            raise Unsafe(f"{path} is larger than {limit} bytes")
        return f.read(limit + 1)


def _write_file(directory, name, data: bytes):
    """Temp file in `directory` + os.replace: a reader sees no file or the whole one."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_TRITON_LOCK = threading.RLock()


@contextlib.contextmanager
def _private_triton_cache(directory):
    """Triton's cache is `directory` for what runs inside: a miss's compile and the C
    modules it builds read and write only there. Triton reads one process-wide setting, so
    such compiles take turns (one that switched back mid-build would read the user's cache
    again); a compile on another thread meanwhile writes there too, which costs it only its
    own cache."""
    from triton import knobs

    with _TRITON_LOCK, knobs.cache.scope():
        knobs.cache.dir = str(directory)
        yield


_WARNED = set()


def _once(what) -> bool:
    """True the first time `what` is seen in this process: what is logged once."""
    with _LOCK:
        if what in _WARNED:
            return False
        _WARNED.add(what)
        return True


def _refuse(root, why):
    """The cache is off for this root: say so once per process, never raise (a caller who
    turns warnings into errors still gets the kernel)."""
    _count("refused")
    if not _once(root):
        return
    message = (
        f"cudnn_pygraph: compiled-plan cache not used: {why}; kernels compile as if it were "
        f"off (point {CACHE_ENV} at a private directory, or set {DISABLE_ENV}=1)"
    )
    log.warning("%s", message)
    with contextlib.suppress(Warning):
        warnings.warn(message, RuntimeWarning, stacklevel=4)


# ---------------------------------------------------------------- the store
class Store:
    """The cache of one root for one environment (one device's)."""

    def __init__(self, root, env: dict):
        self.root = pathlib.Path(root)
        self.environment = json.loads(json.dumps(env))
        self.env_hash = environment_hash(self.environment)
        self.env_dir = self.root / f"v{SCHEMA}" / self.env_hash
        self.triton_dir = self.root / f"v{SCHEMA}" / _TRITON_DIR
        self._pruned = False

    def entry_dir(self, key) -> pathlib.Path:
        return self.env_dir / _digest(key)[:32]

    def _chain(self, directory, create) -> bool:
        """Check (with `create`, make) every directory from the root down to `directory`,
        one under the root: the root as check_root does, the schema directory as a marked
        one, every other as an inner one. False when one is absent; Unsafe on any doubt."""
        why = check_root(self.root, create=create)
        if why is not None:
            raise Unsafe(why)
        if not self.root.is_dir():
            return False
        parts = pathlib.Path(directory).relative_to(self.root).parts
        path = self.root / parts[0]
        if not _schema_dir(path, create):
            return False
        for part in parts[1:]:
            path = path / part
            if not _inner_dir(path, create):
                return False
        return True

    def _usable(self):
        """None when this store can read and write here (made as needed), else why not."""
        try:
            self._chain(self.env_dir, create=True)
            self._chain(self.triton_dir, create=True)
        except Unsafe as exc:
            return str(exc)
        except OSError as exc:
            return f"{self.root}: {exc.strerror or exc}"
        return None

    def _build_module(self, text, name):
        """(Triton's key, the bytes) of C module `name` of source `text`, built by Triton's
        own compile_module_from_src into the private Triton cache (or found there) and read
        back from there with the checks every file here gets. Raises when it cannot be built
        (no C compiler, no libcuda to link)."""
        from triton.backends.nvidia import driver as nvidia
        from triton.runtime.cache import get_cache_manager

        key = _module_key(text)
        with _private_triton_cache(self.triton_dir):
            nvidia.compile_module_from_src(
                src=text,
                name=name,
                library_dirs=nvidia.library_dirs(),
                include_dirs=nvidia.include_dirs,
                libraries=nvidia.libraries,
            )
            path = get_cache_manager(key).get_file(_module_file(name))
        if path is None:
            raise FileNotFoundError(f"the private Triton cache does not hold the {name} it built")
        path = pathlib.Path(path)  # under self.triton_dir, as Triton joined it
        if not self._chain(path.parent, create=False):
            raise FileNotFoundError(f"{path} is gone")
        return key, _read_file(path, _MODULE_MAX_BYTES)

    def compile(self, src, target, options=None):
        """triton.compile(src, target, options) through the cache."""
        import triton

        key = None if _compile_requested() else kernel_key(src, target, options)
        why = None if key is None else self._usable()
        if key is None or why is not None:
            if why is not None:
                _refuse(str(self.root), why)
            _count("bypassed")
            return triton.compile(src, target=target, options=options)
        hit, doubtful = self.load(src, key)
        if hit is not None:
            _count("hits")
            return hit
        _count("invalid" if doubtful else "misses")
        with _private_triton_cache(self.triton_dir):
            compiled = triton.compile(src, target=target, options=options)
        if not self.save(key, compiled):
            return compiled
        again, why = self.load(src, key)
        if again is None:  # what was just written does not read back: never reuse it
            log.warning("compiled-plan cache: %s did not read back (%s)", key["kernel"], why)
            self.discard(key)
            return compiled
        return again

    def load(self, src, key):
        """(CompiledKernel, None) on a hit; (None, why) when the entry is there but
        doubtful; (None, None) when there is none. Never raises for what is on disk."""
        entry = self.entry_dir(key)
        try:
            record = self._read_record(entry)
            if record is None:
                return None, None
            return self._verified(src, key, entry, record), None
        except Exception as exc:  # noqa: BLE001 - whatever is on disk, a doubt is a miss
            why = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, Unsafe):
                log.info("compiled-plan cache: %s: entry %s doubtful, a miss (%s)",
                         key["kernel"], entry.name, why)  # fmt: skip
            elif _once(("untrusted", str(entry), why)):
                log.warning("compiled-plan cache: %s: entry %s not trusted, a miss: %s",
                            key["kernel"], entry, exc)  # fmt: skip
            return None, why

    def _verified(self, src, key, entry, record):
        from triton.compiler import CompiledKernel

        launcher = record["launcher"]
        kinds = ("cubin", "json") + (() if launcher is None else ("launcher",))
        data, paths = self._artifacts(key, entry, record, kinds)
        metadata = json.loads(data["json"])
        target = metadata["target"]
        if [target["backend"], target["arch"], target["warp_size"]] != key["target"]:
            raise ValueError(f"the metadata's target {target} is not the key's")
        if metadata["name"] != record["name"] or metadata["hash"] != record["triton_hash"]:
            raise ValueError("the metadata names another kernel")
        name = record["name"]
        group = {f"{name}.json": str(paths["json"]), f"{name}.cubin": str(paths["cubin"])}
        compiled = CompiledKernel(src, group, record["triton_hash"])
        # what Triton read is what was verified (the binary is loaded only later, by `run`)
        if compiled.kernel != data["cubin"] or compiled.metadata.hash != record["triton_hash"]:
            raise ValueError("the artifact changed while it was read")
        if launcher is not None:
            # Triton's key for this kernel's launcher, computed here and now: a launcher of
            # another signature, another Triton or another interpreter is never handed over.
            triton_key = _module_key(_launcher_source(src, compiled.metadata))
            if launcher != {"triton_key": triton_key, "file": _module_file(_LAUNCHER)}:
                raise ValueError("the launcher was built for another signature or interpreter")
            _offer_module(triton_key, _LAUNCHER, data["launcher"])
        return compiled

    def _artifacts(self, key, entry, record, kinds):
        """({kind: bytes}, {kind: path}) of an entry's artifacts, each read without
        following a symlink and checked against the record's name, size and sha256, after
        the record's schema, key and environment; raises on any doubt."""
        if record.get("schema") != SCHEMA:
            raise ValueError(f"schema {record.get('schema')!r}, expected {SCHEMA}")
        if record.get("key") != key:
            raise ValueError("the record's key differs")
        if record.get("environment") != self.environment:
            raise ValueError("the record's environment differs")
        if sorted(record["files"]) != sorted(kinds):
            raise ValueError(f"the record lists {sorted(record['files'])}, expected {kinds}")
        data, paths = {}, {}
        for kind in kinds:
            meta = record["files"][kind]
            name = meta["name"]
            if (
                not isinstance(name, str)
                or not _ARTIFACT.fullmatch(name)
                or not name.endswith("." + _SUFFIX[kind])
            ):
                raise ValueError(f"artifact name {name!r}")
            blob = _read_file(entry / name, int(meta["bytes"]))
            # A corruption check (a torn copy, a flipped bit), not an authentication: whoever
            # could write the artifact could write this record too. What keeps others out is
            # the ownership and modes checked on the way here.
            if len(blob) != meta["bytes"] or hashlib.sha256(blob).hexdigest() != meta["sha256"]:
                raise ValueError(f"{name}: size or sha256 differs from the record")
            data[kind], paths[kind] = blob, entry / name
        return data, paths

    def _read_record(self, entry):
        """The record of `entry` (None: no entry), reached through checked directories."""
        if not self._chain(entry, create=False):
            return None
        try:
            return json.loads(_read_file(entry / RECORD, _RECORD_MAX_BYTES))
        except FileNotFoundError:
            return None

    def _write_entry(self, entry, key, blobs, **fields):
        """Write `entry`: each (kind, bytes) under its digest, then the record, last."""
        self._chain(entry, create=True)
        files = {}
        for kind, blob in blobs:
            digest = hashlib.sha256(blob).hexdigest()
            name = f"{digest}.{_SUFFIX[kind]}"
            _write_file(entry, name, blob)
            files[kind] = {"name": name, "sha256": digest, "bytes": len(blob)}
        record = {
            "schema": SCHEMA,
            "key": key,
            "environment": self.environment,
            "files": files,
            **fields,
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        _write_file(entry, RECORD, json.dumps(record, indent=1, sort_keys=True).encode())

    def save(self, key, compiled) -> bool:
        """Persist a freshly compiled kernel; False (and nothing usable left) on failure."""
        try:
            binary = compiled.asm["cubin"]
            md = compiled.metadata._asdict()
            md["target"] = vars(md["target"])
            meta = json.dumps(md, sort_keys=True).encode()
            blobs = [("cubin", binary), ("json", meta)]
            try:
                triton_key, launcher = self._build_module(
                    _launcher_source(compiled.src, compiled.metadata), _LAUNCHER
                )
                blobs.append(("launcher", launcher))
                launcher = {"triton_key": triton_key, "file": _module_file(_LAUNCHER)}
            except Exception as exc:  # noqa: BLE001 - kept without it: Triton builds it at load
                launcher = None
                log.info("compiled-plan cache: %s: launcher not kept: %s: %s",
                         key["kernel"], type(exc).__name__, exc)  # fmt: skip
            self._write_entry(self.entry_dir(key), key, blobs, name=compiled.metadata.name,
                              triton_hash=compiled.hash, launcher=launcher)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - failing to persist never fails the build
            log.warning("compiled-plan cache: %s not persisted: %s", key["kernel"], exc)
            return False
        _count("written")
        if not self._pruned:
            self._pruned = True
            _count("pruned", prune(self.root, keep=self.env_hash))
            self.keep_driver_module()
        return True

    # Triton's driver utilities (cuda_utils, from its driver.c) are built, like a launcher,
    # by the host compiler into Triton's cache, once per process at its driver's set-up,
    # before any kernel. Each environment keeps them once, in a directory of their own.
    def _driver_slot(self):
        """(key, entry directory) of the kept driver utilities of this environment."""
        key = {"kernel": f"triton:{_DRIVER_MODULE}", "triton_key": _driver_module_key()}
        return key, self.env_dir / _DRIVER_DIR

    def _kept_driver_module(self, key, entry):
        """The kept, verified bytes (None when there are none); raises when doubtful."""
        record = self._read_record(entry)
        if record is None:
            return None
        return self._artifacts(key, entry, record, ("module",))[0]["module"]

    def keep_driver_module(self) -> bool:
        """Keep the driver utilities, built in (or found in) the private Triton cache,
        unless this environment has good ones. Never raises."""
        from triton.backends.nvidia import driver as nvidia

        try:
            key, entry = self._driver_slot()
            try:
                if self._kept_driver_module(key, entry) is not None:
                    return False
            except Exception:  # noqa: BLE001, S110 - doubtful ones are written anew
                pass
            text = pathlib.Path(nvidia.dirname, "driver.c").read_text()
            triton_key, blob = self._build_module(text, _DRIVER_MODULE)
            if triton_key != key["triton_key"]:
                return False
            self._write_entry(entry, key, [("module", blob)], name=_DRIVER_MODULE)
        except Exception as exc:  # noqa: BLE001 - not kept: Triton compiles them, as before
            log.info("compiled-plan cache: Triton's driver utilities not kept: %s", exc)
            return False
        return True

    def offer_driver_module(self) -> bool:
        """Before Triton's driver is made in this process: put the driver utilities this
        environment keeps into Triton's cache (unless it has them), checked as a kernel's
        artifacts are, so Triton's set-up loads them instead of compiling driver.c. False
        when there are none or they are doubtful; never raises."""
        try:
            key, entry = self._driver_slot()
            kept = self._kept_driver_module(key, entry)
        except Exception as exc:  # noqa: BLE001 - doubtful: Triton compiles them, as before
            log.info("compiled-plan cache: Triton's driver utilities doubtful: %s", exc)
            return False
        return kept is not None and _offer_module(key["triton_key"], _DRIVER_MODULE, kept)

    def discard(self, key):
        with contextlib.suppress(OSError):
            os.unlink(self.entry_dir(key) / RECORD)


_STORES = {}


def _live_store():
    """The store of the current CUDA device under the configured root; None when off."""
    if not enabled():
        return None
    try:
        import torch

        # is_available first: current_device() initializes CUDA, which on a machine without
        # a driver is slow and, under a preloaded sanitizer runtime, aborts the process.
        if not torch.cuda.is_available():
            return None
        ordinal = torch.cuda.current_device()
    except Exception:  # noqa: BLE001 - no device to key on: compile as if the cache were off
        return None
    root = cache_root()
    with _LOCK:
        store = _STORES.get((root, ordinal))
        if store is None:
            store = _STORES[(root, ordinal)] = Store(root, environment(device_facts(ordinal)))
    return store


_DRIVER_PREPARED = False


def prepare_triton_driver() -> bool:
    """Before Triton's driver is first made in this process (the first kernel compiled or
    launched): hand Triton's cache the driver utilities the live environment keeps, so the
    driver's set-up loads them instead of compiling driver.c. Once per process that has a
    live store; True when handed over. Never raises."""
    global _DRIVER_PREPARED
    if _DRIVER_PREPARED:
        return False
    store = _live_store()
    if store is None or _compile_requested():
        return False
    _DRIVER_PREPARED = True
    return store.offer_driver_module()


def compile(src, target, options=None, _env_vars=None):  # noqa: A001 - triton.compile's drop-in
    """triton.compile behind the cache of the current CUDA device (the build's). The JIT's
    async mode passes `_env_vars`: the environment already holds them."""
    store = _live_store()
    if store is None:
        import triton

        _count("bypassed")
        return triton.compile(src, target=target, options=options)
    return store.compile(src, target, options)


# ---------------------------------------------------------------- inspection and upkeep
def _tree_bytes(path) -> int:
    total = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in filenames + dirnames:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                if not stat.S_ISDIR(st.st_mode):
                    total += st.st_size
    return total


def _remove(path) -> None:
    """Remove a directory of ours; a symlink in its place goes, never its target."""
    if os.path.islink(path):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    shutil.rmtree(path, ignore_errors=True)


def _scan(path, pattern):
    try:
        with os.scandir(path) as it:
            return sorted((e for e in it if pattern.fullmatch(e.name)), key=lambda e: e.name)
    except OSError:
        return []


def _own_schemas(root) -> list:
    """The schema directories under `root` that the cache marked as its own (paths)."""
    return [e.path for e in _scan(root, _SCHEMA_DIR) if _is_marked(e.path)]


def _own_bytes(root) -> int:
    """Bytes in what the cache marked as its own under `root` (nothing else there counts)."""
    return sum(_tree_bytes(p) for p in _own_schemas(root))


def prune(root=None, keep=None, limit=None) -> int:
    """Retire whole directories of the cache's own until they hold under `limit` bytes
    (default CUDNN_PYGRAPH_COMPILED_CACHE_MAX_BYTES; 0: no limit): other marked schemas
    first, then the private Triton cache, then the oldest written environments; `keep`
    (the live environment's hash) never goes. Nothing unmarked is counted or touched.
    Returns how many directories went; never raises."""
    root = pathlib.Path(root or cache_root())
    limit = max_bytes() if limit is None else limit
    if limit <= 0 or check_root(root) is not None:
        return 0
    schemas = _own_schemas(root)
    size = sum(_tree_bytes(p) for p in schemas)
    if size <= limit:
        return 0
    live = str(root / f"v{SCHEMA}")
    doomed = [p for p in schemas if p != live]
    if live in schemas:
        doomed += [e.path for e in _scan(live, re.compile(_TRITON_DIR))]
        envs = [e for e in _scan(live, _HASH_DIR) if e.name != keep]
        envs.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime)
        doomed += [e.path for e in envs]
    gone = 0
    for path in doomed:
        if size <= limit:
            break
        freed = _tree_bytes(path)
        _remove(path)
        size -= freed
        gone += 1
    return gone


def _text(value, what, limit=300) -> str:
    if type(value) is not str or len(value) > limit or not value.isprintable():
        raise ValueError(f"its {what} is not a short printable string")
    return value


def _small_int(value, what) -> int:
    if type(value) is not int or not 0 <= value < 1 << 20:
        raise ValueError(f"its {what} is not a small integer")
    return value


def _field(record, name, kind):
    value = record.get(name)
    if type(value) is not kind:
        raise ValueError(f"its {name} is a {type(value).__name__}, not a {kind.__name__}")
    return value


def describe(record) -> dict:
    """What `cudnn-pygraph cache list` / `stats` show of a record: kernel, arch, written,
    device, as short printable text. Raises ValueError naming the first garbled field (a
    record is whatever the disk holds)."""
    if type(record) is not dict:
        raise ValueError(f"it is a JSON {type(record).__name__}, not an object")
    key = _field(record, "key", dict)
    target = _field(key, "target", list)
    if len(target) != 3:
        raise ValueError("its target is not [backend, arch, warp size]")
    device = _field(_field(record, "environment", dict), "device", dict)
    cc = _field(device, "cc", list)
    if not 1 <= len(cc) <= 3:
        raise ValueError("its device's cc is not [major, minor]")
    return {
        "kernel": _text(key.get("kernel"), "kernel"),
        "arch": str(_small_int(target[1], "arch")),
        "written": _text(record.get("written"), "write time", 40),
        "device": f"{_text(device.get('name'), 'device name')} sm_"
        + "".join(str(_small_int(c, "compute capability")) for c in cc),
    }


def entries(root=None) -> list:
    """Every entry of this schema under `root` (in a schema directory the cache marked):
    dicts with env (hash), entry (hash), path, bytes, and either `shown` (describe's
    fields) or `problem` (why the record cannot be shown: it is a miss)."""
    root = pathlib.Path(root or cache_root())
    out = []
    schema = root / f"v{SCHEMA}"
    if not _is_marked(schema):
        return out
    for env in _scan(schema, _HASH_DIR):
        if not env.is_dir(follow_symlinks=False):
            continue
        for entry in _scan(env.path, re.compile(r"[0-9a-f]{32}")):
            if not entry.is_dir(follow_symlinks=False):
                continue
            row = {"env": env.name, "entry": entry.name, "path": entry.path,
                   "bytes": _tree_bytes(entry.path), "shown": None, "problem": None}  # fmt: skip
            try:
                blob = _read_file(os.path.join(entry.path, RECORD), _RECORD_MAX_BYTES)
                row["shown"] = describe(json.loads(blob))
            except FileNotFoundError:
                row["problem"] = "no record"
            except (OSError, Unsafe) as exc:
                row["problem"] = f"unreadable: {exc.strerror if isinstance(exc, OSError) else exc}"
            except RecursionError:
                row["problem"] = "garbled: nested too deep"
            except UnicodeDecodeError:
                row["problem"] = "garbled: not UTF-8"
            except ValueError as exc:  # json's own errors included
                row["problem"] = f"garbled: {exc}"[:200]
            out.append(row)
    return out


def usage(root=None) -> dict:
    """What `cudnn-pygraph cache stats` prints: the root, its state, the limit, and per
    environment the entries (and how many cannot be read), bytes, last write and device."""
    root = pathlib.Path(root or cache_root())
    envs = {}
    for e in entries(root):
        row = envs.setdefault(
            e["env"], {"entries": 0, "unreadable": 0, "bytes": 0, "written": "", "device": "?"}
        )
        row["entries"] += 1
        row["bytes"] += e["bytes"]
        if e["shown"] is None:
            row["unreadable"] += 1
            continue
        row["written"] = max(row["written"], e["shown"]["written"])
        row["device"] = e["shown"]["device"]
    return {
        "root": str(root),
        "enabled": enabled(),
        "refused": check_root(root),
        "schema": SCHEMA,
        "max_bytes": max_bytes(),
        "bytes": _own_bytes(root) if root.is_dir() else 0,
        "environments": envs,
    }


def clear(root=None) -> tuple:
    """Remove every schema directory under `root` that the cache marked as its own (nothing
    else there is touched); returns (entries, bytes) removed. A root of another user is
    left alone (Unsafe)."""
    root = pathlib.Path(root or cache_root())
    if not root.exists():
        return 0, 0
    st = os.stat(root)
    if st.st_uid != os.geteuid():
        raise Unsafe(f"{root} is owned by uid {st.st_uid}, not this user: not clearing it")
    count, size = len(entries(root)), 0
    for path in _own_schemas(root):
        size += _tree_bytes(path)
        _remove(path)
    return count, size


__all__ = [
    "CACHE_ENV", "DEFAULT_MAX_BYTES", "DISABLE_ENV", "MARKER", "MAX_BYTES_ENV", "SCHEMA",
    "Store", "Unsafe", "cache_home", "cache_root", "check_root", "clear", "compile",
    "describe", "device_facts",
    "dist_version", "enabled", "entries", "environment", "environment_hash", "kernel_key",
    "max_bytes", "prepare_triton_driver", "prune", "source_digest", "stats", "usage",
]  # fmt: skip
