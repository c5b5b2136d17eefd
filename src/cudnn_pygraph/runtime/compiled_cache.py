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
Every file is written to a temporary name in its directory and moved into place with
os.replace; artifact files are named by their digest, so concurrent writers of one entry
never mix bytes, and a process killed mid-write leaves no record, hence no entry.

The launcher: Triton builds it when a kernel is first loaded (CudaLauncher ->
compile_module_from_src), keyed in its own cache by the sha256 of the generated C source
and the platform, and loads it from there. A miss here has Triton build it (into Triton's
cache, as loading would a moment later) and keeps a copy; a hit recomputes Triton's key for
this kernel in this process, checks it is the one recorded, and puts the verified copy into
Triton's cache under that key unless Triton already has one. Triton's own lookup then finds
it and loads it by its own code; the compiler never runs. A process whose Triton cache
already holds the launcher loads that one, exactly as without this cache. Triton's driver
utilities (cuda_utils, compiled from its driver.c when its driver is first made in a
process) go the same way, once per environment, in <environment hash>/triton-driver/:
kept at a process's first write, handed to Triton's cache before its driver is made
(`prepare_triton_driver`).

The rules (spec: "The compiled-plan cache"), kept here:
  * identity is hashed whole: the package version and a digest of every .py in it (an
    edited checkout does not move the version; a kernel compiles from the helpers it
    imports as much as from its own source), the triton / torch versions, the CUDA
    version torch was built for, the driver's CUDA version, Triton's cache-invalidating
    variables, the interpreter's extension ABI (the launcher is an extension module of
    it), and the device (name, compute capability, SM count, L2 size). Any change
    lands in another directory; an unreadable field hashes as "unknown", never skipped;
  * an entry is reused only under its own embedded key and environment, compared whole
    on load, and only after every artifact's size and sha256 match its record;
  * anything doubtful (missing, malformed, mismatched, a symlink, a file of another
    owner) is a miss, never an error in the caller's call;
  * the root must be a directory owned by this user and not writable by group or others;
    otherwise the cache is off for the process, with one warning saying why. Nothing
    inside the root is reached through a symlink;
  * only kernels whose source is in this package are persisted (the source digest covers
    them), and only when every part of the key is a plain value; the cache stands aside
    while Triton is asked to compile every time, override or dump kernels.
Location: CUDNN_PYGRAPH_COMPILED_CACHE, else $XDG_CACHE_HOME/cudnn_pygraph/compiled_plans
(~/.cache when XDG_CACHE_HOME is unset); CUDNN_PYGRAPH_DISABLE_COMPILED_CACHE=1 turns it
off. A process's first write retires dead environments, whole directories, other schemas
first and then oldest first, until the root is under CUDNN_PYGRAPH_COMPILED_CACHE_MAX_BYTES
(4 GiB by default; 0: no limit); the live environment is never a candidate.
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
SCHEMA = 2  # bump on any incompatible change of the layout, the record or the key
RECORD = "record.json"
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
    would defeat what the user is doing, so the cache stands aside."""
    try:
        from triton import knobs

        c = knobs.compilation
        return bool(c.always_compile or c.override or c.dump_ir)
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


def _built_launcher(compiled):
    """(Triton's key, the bytes) of a freshly compiled kernel's launcher, built by Triton's
    own compile_module_from_src into its own cache (what loading the kernel does next
    anyway, and then loads from that cache) and read back from there. Raises when it
    cannot be built (no C compiler, no libcuda to link): the entry is kept without it."""
    from triton.backends.nvidia import driver as nvidia
    from triton.runtime.cache import get_cache_manager

    text = _launcher_source(compiled.src, compiled.metadata)
    nvidia.compile_module_from_src(
        src=text,
        name=_LAUNCHER,
        library_dirs=nvidia.library_dirs(),
        include_dirs=nvidia.include_dirs,
        libraries=nvidia.libraries,
    )
    key = _module_key(text)
    path = get_cache_manager(key).get_file(_module_file(_LAUNCHER))
    if path is None:
        raise FileNotFoundError("Triton's cache does not hold the launcher it built")
    with open(path, "rb") as f:
        return key, f.read()


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


def _check_dir(st, path):
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise Unsafe(f"{path} is {kind}")
    if st.st_uid != os.geteuid():
        raise Unsafe(f"{path} is owned by uid {st.st_uid}, not this user ({os.geteuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Unsafe(f"{path} is writable by group or others (mode {st.st_mode & 0o777:o})")


def check_root(root, create=False):
    """None when `root` is usable, else why not. `create` makes it (mode 0700) if absent.
    The root may itself be reached through a symlink (a home on another disk); nothing
    under it may."""
    root = pathlib.Path(root)
    try:
        if create:
            root.mkdir(parents=True, mode=0o700, exist_ok=True)
        _check_dir(os.stat(root), root)
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
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    _check_dir(st, path)
    return True


def _read_file(path, limit):
    """The bytes of a regular file of ours at `path`, opened without following a symlink."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise Unsafe(f"{path} is not a regular file of this user")
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


_WARNED = set()


def _refuse(root, why):
    """The cache is off for this root: say so once per process, never raise (a caller who
    turns warnings into errors still gets the kernel)."""
    _count("refused")
    if root in _WARNED:
        return
    _WARNED.add(root)
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
        self._pruned = False

    def entry_dir(self, key) -> pathlib.Path:
        return self.env_dir / _digest(key)[:32]

    def compile(self, src, target, options=None):
        """triton.compile(src, target, options) through the cache."""
        import triton

        key = None if _compile_requested() else kernel_key(src, target, options)
        why = None if key is None else check_root(self.root, create=True)
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
            log.info("compiled-plan cache: %s: entry %s doubtful, a miss (%s)",
                     key["kernel"], entry.name, why)  # fmt: skip
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
            if len(blob) != meta["bytes"] or hashlib.sha256(blob).hexdigest() != meta["sha256"]:
                raise ValueError(f"{name}: size or sha256 differs from the record")
            data[kind], paths[kind] = blob, entry / name
        return data, paths

    def _read_record(self, entry):
        """The record of `entry` (None: no entry), reached through checked directories."""
        for d in (self.env_dir.parent, self.env_dir, entry):
            if not _inner_dir(d, create=False):
                return None
        try:
            return json.loads(_read_file(entry / RECORD, _RECORD_MAX_BYTES))
        except FileNotFoundError:
            return None

    def _write_entry(self, entry, key, blobs, **fields):
        """Write `entry`: each (kind, bytes) under its digest, then the record, last."""
        for d in (self.env_dir.parent, self.env_dir, entry):
            _inner_dir(d, create=True)
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
                triton_key, launcher = _built_launcher(compiled)
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
        """Keep the driver utilities Triton's cache holds (what its set-up in this process
        built or loaded) unless this environment has good ones. Never raises."""
        from triton.runtime.cache import get_cache_manager

        try:
            key, entry = self._driver_slot()
            try:
                if self._kept_driver_module(key, entry) is not None:
                    return False
            except Exception:  # noqa: BLE001, S110 - doubtful ones are written anew
                pass
            path = get_cache_manager(key["triton_key"]).get_file(_module_file(_DRIVER_MODULE))
            if path is None:
                return False
            with open(path, "rb") as f:
                blob = f.read()
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


def prune(root=None, keep=None, limit=None) -> int:
    """Retire whole environment directories until `root` is under `limit` bytes (default
    CUDNN_PYGRAPH_COMPILED_CACHE_MAX_BYTES; 0: no limit): other schemas first, then the
    oldest written; `keep` (the live environment's hash) never goes. Returns how many
    directories went; never raises."""
    root = pathlib.Path(root or cache_root())
    limit = max_bytes() if limit is None else limit
    if limit <= 0 or check_root(root) is not None:
        return 0
    size = _tree_bytes(root)
    if size <= limit:
        return 0
    live = f"v{SCHEMA}"
    doomed = [e.path for e in _scan(root, _SCHEMA_DIR) if e.name != live]
    envs = [e for e in _scan(root / live, _HASH_DIR) if e.name != keep]
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


def entries(root=None) -> list:
    """Every entry of this schema under `root`: dicts with env (hash), entry (hash), path,
    bytes, and the record (None when it is missing or unreadable: a miss)."""
    root = pathlib.Path(root or cache_root())
    out = []
    for env in _scan(root / f"v{SCHEMA}", _HASH_DIR):
        if not env.is_dir(follow_symlinks=False):
            continue
        for entry in _scan(env.path, re.compile(r"[0-9a-f]{32}")):
            if not entry.is_dir(follow_symlinks=False):
                continue
            try:
                record = json.loads(_read_file(os.path.join(entry.path, RECORD), _RECORD_MAX_BYTES))
                record = record if isinstance(record, dict) else None
            except (OSError, ValueError, Unsafe):
                record = None
            out.append({"env": env.name, "entry": entry.name, "path": entry.path,
                        "bytes": _tree_bytes(entry.path), "record": record})  # fmt: skip
    return out


def usage(root=None) -> dict:
    """What `cudnn-pygraph cache stats` prints: the root, its state, the limit, and per
    environment the entries, bytes, last write and device."""
    root = pathlib.Path(root or cache_root())
    envs = {}
    for e in entries(root):
        row = envs.setdefault(e["env"], {"entries": 0, "bytes": 0, "written": "", "device": "?"})
        row["entries"] += 1
        row["bytes"] += e["bytes"]
        rec = e["record"] or {}
        row["written"] = max(row["written"], str(rec.get("written", "")))
        dev = (rec.get("environment") or {}).get("device") or {}
        if isinstance(dev, dict) and dev.get("name"):
            row["device"] = f"{dev['name']} sm_{''.join(map(str, dev.get('cc', [])))}"
    return {
        "root": str(root),
        "enabled": enabled(),
        "refused": check_root(root),
        "schema": SCHEMA,
        "max_bytes": max_bytes(),
        "bytes": _tree_bytes(root) if root.is_dir() else 0,
        "environments": envs,
    }


def clear(root=None) -> tuple:
    """Remove every schema directory under `root` (nothing else there is touched);
    returns (entries, bytes) removed. A root of another user is left alone (Unsafe)."""
    root = pathlib.Path(root or cache_root())
    if not root.exists():
        return 0, 0
    st = os.stat(root)
    if st.st_uid != os.geteuid():
        raise Unsafe(f"{root} is owned by uid {st.st_uid}, not this user: not clearing it")
    count, size = len(entries(root)), 0
    for d in _scan(root, _SCHEMA_DIR):
        size += _tree_bytes(d.path)
        _remove(d.path)
    return count, size


__all__ = [
    "CACHE_ENV", "DEFAULT_MAX_BYTES", "DISABLE_ENV", "MAX_BYTES_ENV", "SCHEMA", "Store",
    "Unsafe", "cache_home", "cache_root", "check_root", "clear", "compile", "device_facts",
    "dist_version", "enabled", "entries", "environment", "environment_hash", "kernel_key",
    "max_bytes", "prepare_triton_driver", "prune", "source_digest", "stats", "usage",
]  # fmt: skip
