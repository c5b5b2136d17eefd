"""The compiled-plan cache keeps each kernel's C launcher (runtime/compiled_cache.py), and
the launch path tells Triton where libcuda is (runtime/launch.py), without a GPU.

What a user relies on: a process that starts with our cache warm and Triton's own cache
empty (a new machine, a container that carries only our cache) never runs the host C
compiler for a kernel's launcher; Triton's own loading code finds the launcher we kept; a
launcher artifact that is truncated, garbled, missing, or built for another signature or
interpreter is a miss (the launcher is built anew), never an error and never handed to
Triton; an entry written by the previous schema is a miss.

Triton builds a launcher with the host C compiler against libcuda.so.1 (its own bundled
CUDA headers). This machine has no driver, so the tests link against a stub library that
defines what a launcher imports, under a soname of its own (nothing else in the process
that asks for libcuda.so.1 gets it). Without a host C compiler they skip: Triton could not
build a launcher there either. Launching is the GPU suite's part."""

import ctypes
import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest
from cache_artifacts import TARGET, restore_triton_language, source, store

from cudnn_pygraph.runtime import compiled_cache as cc
from cudnn_pygraph.runtime import launch

STUB_SONAME = "libcudnn_pygraph_test_cuda_stub.so"


@pytest.fixture(autouse=True)
def _real_compiles():
    restore_triton_language()  # see cache_artifacts.restore_triton_language


@pytest.fixture(scope="module")
def stub_libcuda(tmp_path_factory):
    """A directory holding a stub libcuda.so.1 (loaded into this process): the functions a
    launcher imports, each failing if ever called."""
    import triton

    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    if not compiler:
        pytest.skip("no host C compiler (gcc, clang or CC): Triton builds launchers with one")
    restore_triton_language()
    src, options = source(16)
    text = cc._launcher_source(src, triton.compile(src, target=TARGET, options=options).metadata)
    names = sorted(set(re.findall(r"\b(cu[A-Z]\w*)\s*\(", text + driver_source())))
    assert names, "a launcher that calls no driver function: the stub would prove nothing"
    d = tmp_path_factory.mktemp("libcuda")
    (d / "stub.c").write_text("".join(f"int {n}(void) {{ return 1; }}\n" for n in names))
    built = subprocess.run(
        [compiler, "-shared", "-fPIC", f"-Wl,-soname,{STUB_SONAME}", "-o", str(d / "libcuda.so.1"),
         str(d / "stub.c")],
        capture_output=True, text=True,
    )  # fmt: skip
    if built.returncode != 0:
        pytest.skip(f"the host C compiler cannot build a shared library: {built.stderr[-300:]}")
    ctypes.CDLL(str(d / "libcuda.so.1"))  # a launcher's NEEDED entry resolves to it by soname
    return d


def driver_source():
    from triton.backends.nvidia import driver as nvidia

    return pathlib.Path(nvidia.dirname, "driver.c").read_text()


def triton_driver_setup():
    """What Triton's driver set-up builds or loads first (CudaUtils.__init__): its driver
    utilities, through compile_module_from_src (without making the process-wide driver)."""
    from triton.backends.nvidia import driver as nvidia

    mod = nvidia.compile_module_from_src(
        src=driver_source(), name="cuda_utils", library_dirs=nvidia.library_dirs(),
        include_dirs=nvidia.include_dirs, libraries=nvidia.libraries,
    )  # fmt: skip
    assert callable(mod.load_binary)


def _clear_triton_libcuda():
    from triton.backends.nvidia import driver as nvidia

    nvidia.libcuda_dirs.cache_clear()
    nvidia.library_dirs.cache_clear()


@pytest.fixture
def toolchain(stub_libcuda, tmp_path, monkeypatch):
    """Triton links launchers against the stub and keeps its cache under tmp_path; returns
    a function giving Triton a fresh, empty cache."""
    monkeypatch.setenv("TRITON_LIBCUDA_PATH", str(stub_libcuda))
    _clear_triton_libcuda()

    def empty_triton_cache(name):
        path = tmp_path / name
        monkeypatch.setenv("TRITON_CACHE_DIR", str(path))
        return path

    empty_triton_cache("triton-a")
    yield empty_triton_cache
    _clear_triton_libcuda()


@pytest.fixture
def compiler_runs(monkeypatch):
    """Every host C compiler run Triton makes from here on, counted (Triton's one entry to
    the compiler, runtime/build._build); `forbid()` makes the next one fail the test."""
    import triton.runtime.build as build

    original, runs, forbidden = build._build, [], []

    def counted(name, *args, **kwargs):
        runs.append(name)
        if forbidden:
            raise AssertionError(f"the C compiler ran for {name} although the cache holds it")
        return original(name, *args, **kwargs)

    monkeypatch.setattr(build, "_build", counted)
    counted.runs = runs
    counted.forbid = lambda: forbidden.append(True)
    return counted


def compile_16(root):
    src, options = source(16)
    before = cc.stats()
    got = store(root).compile(src, TARGET, options)
    after = cc.stats()
    return got, {k: after[k] - before[k] for k in after if after[k] != before[k]}


def entry_16(root):
    src, options = source(16)
    return store(root).entry_dir(cc.kernel_key(src, TARGET, options))


def record_16(root):
    return json.loads((entry_16(root) / cc.RECORD).read_text())


def triton_launcher(compiled):
    """The launcher file Triton's cache holds for `compiled` (None: none), by Triton's own
    key of it."""
    from triton.runtime.cache import get_cache_manager

    key = cc._module_key(cc._launcher_source(compiled.src, compiled.metadata))
    return get_cache_manager(key).get_file(cc._module_file(cc._LAUNCHER))


def load_launcher(compiled):
    """What loading a kernel does first (CompiledKernel._init_handles): Triton's
    CudaLauncher for it, which finds its launcher in Triton's cache or compiles it."""
    from triton.backends.nvidia.driver import CudaLauncher

    launcher = CudaLauncher(compiled.src, compiled.metadata)
    assert callable(launcher.launch)
    return launcher


# ---------------------------------------------------------------- the warm start
def test_our_cache_alone_starts_a_kernel_without_the_c_compiler(tmp_path, toolchain,
                                                                compiler_runs, monkeypatch):  # fmt: skip
    import triton

    root = tmp_path / "ours"
    first, delta = compile_16(root)
    assert delta == {"misses": 1, "written": 1}
    # built once, at the miss, in our own Triton cache; so are the driver utilities, kept
    # at a process's first write
    built = ["__triton_launcher", "cuda_utils"]
    assert compiler_runs.runs == built
    rec = record_16(root)
    kept = entry_16(root) / rec["files"]["launcher"]["name"]
    with open(triton_launcher(first), "rb") as f:
        assert kept.read_bytes() == f.read()
    load_launcher(first)  # Triton's own load of it, from its cache: no second build
    assert compiler_runs.runs == built

    # a new machine: our cache copied, Triton's empty; neither compiler may run
    fresh = toolchain("triton-b")
    compiler_runs.forbid()
    monkeypatch.setattr(triton, "compile", lambda *a, **k: pytest.fail("compiled the kernel"))
    again, delta = compile_16(root)
    assert delta == {"hits": 1}
    placed = triton_launcher(again)
    assert placed is not None and placed.startswith(str(fresh))
    with open(placed, "rb") as f:
        assert f.read() == kept.read_bytes()
    load_launcher(again)
    assert compiler_runs.runs == built


def test_a_launcher_already_in_triton_s_cache_is_left_as_it_is(tmp_path, toolchain):
    root = tmp_path / "ours"
    first, _ = compile_16(root)
    path = triton_launcher(first)
    with open(path, "rb") as f:
        theirs = f.read()
    with open(path, "ab") as f:  # Triton's cache is Triton's: a hit never rewrites it
        f.write(b"\0")
    _, delta = compile_16(root)
    assert delta == {"hits": 1}
    with open(path, "rb") as f:
        assert f.read() == theirs + b"\0"


# ---------------------------------------------------------------- doubtful launchers
def _launcher_file(root):
    return entry_16(root) / record_16(root)["files"]["launcher"]["name"]


def _edit_record(root, edit):
    path = entry_16(root) / cc.RECORD
    rec = json.loads(path.read_text())
    edit(rec)
    path.write_text(json.dumps(rec))


def _flip_last_byte(p):
    data = bytearray(p.read_bytes())
    data[-1] ^= 0xFF
    p.write_bytes(bytes(data))


DOUBTFUL = {
    "truncated": lambda root: _launcher_file(root).write_bytes(
        _launcher_file(root).read_bytes()[:4096]
    ),
    "one byte flipped": lambda root: _flip_last_byte(_launcher_file(root)),
    "missing": lambda root: _launcher_file(root).unlink(),
    "replaced by the kernel's binary": lambda root: _launcher_file(root).write_bytes(
        next(entry_16(root).glob("*.cubin")).read_bytes()
    ),
    "of another signature": lambda root: _edit_record(
        root, lambda rec: rec["launcher"].update(triton_key="0" * 64)
    ),
    "of another interpreter": lambda root: _edit_record(
        root, lambda rec: rec["launcher"].update(file="__triton_launcher.cpython-399-x.so")
    ),
    "not listed with its file": lambda root: _edit_record(
        root, lambda rec: rec["files"].pop("launcher")
    ),
    "named as a binary": lambda root: _edit_record(
        root,
        lambda rec: rec["files"]["launcher"].update(
            name=rec["files"]["launcher"]["name"][:-3] + ".cubin"
        ),
    ),
}


@pytest.mark.parametrize("how", sorted(DOUBTFUL), ids=lambda h: h.replace(" ", "-"))
def test_a_doubtful_launcher_is_a_miss_never_handed_to_triton(
    tmp_path, toolchain, compiler_runs, how
):
    root = tmp_path / "ours"
    compile_16(root)
    artifact = _launcher_file(root)
    kept = artifact.read_bytes()
    DOUBTFUL[how](root)
    left = artifact.read_bytes() if artifact.exists() else None
    fresh = toolchain("triton-b")  # Triton's cache empty: nothing of its own to fall back on
    runs = len(compiler_runs.runs)
    got, delta = compile_16(root)
    assert delta == {"invalid": 1, "written": 1}
    assert compiler_runs.runs[runs:] == []  # our own Triton cache still holds the good one
    placed = triton_launcher(got)
    assert placed is not None and placed.startswith(str(fresh))
    with open(placed, "rb") as f:
        built = f.read()
    assert built == kept
    if left is not None and left != kept:
        assert built != left  # the damaged bytes never reach Triton
    load_launcher(got)
    # the entry was rewritten whole with the new launcher: the next start hits again
    assert _launcher_file(root).read_bytes() == built
    toolchain("triton-c")
    compiler_runs.forbid()
    _, delta = compile_16(root)
    assert delta == {"hits": 1}
    load_launcher(got)


def test_a_launcher_planted_in_a_shared_triton_cache_is_never_kept(tmp_path, toolchain):
    """Triton loads a launcher from its cache directory before it builds one: a miss here
    builds in a Triton cache of our own, so one another user rewrote in a shared
    TRITON_CACHE_DIR (still a loadable module) is never kept."""
    import triton

    src, options = source(16)
    compiled = triton.compile(src, target=TARGET, options=options)
    load_launcher(compiled)  # Triton builds it into its (shared) cache
    with open(triton_launcher(compiled), "ab") as f:
        f.write(b"planted")
    load_launcher(compiled)  # and would load the rewritten one
    root = tmp_path / "ours"
    compile_16(root)
    assert not _launcher_file(root).read_bytes().endswith(b"planted")


# ---------------------------------------------------------------- the previous schema
def _as_schema_1(rec):
    """The record the previous schema wrote: no launcher, no interpreter in the
    environment."""
    rec["schema"] = 1
    rec.pop("launcher")
    rec["files"].pop("launcher", None)
    rec["environment"].pop("python")


def test_an_entry_of_the_previous_schema_is_a_miss(tmp_path):
    root = tmp_path / "ours"
    compile_16(root)
    _edit_record(root, _as_schema_1)
    entry = entry_16(root)
    # where the previous schema kept it: another schema's directory, never looked in
    old = root / "v1" / entry.parent.name / entry.name
    old.parent.mkdir(parents=True)
    shutil.copytree(entry, old)
    shutil.rmtree(entry)
    _, delta = compile_16(root)
    assert delta == {"misses": 1, "written": 1}
    # the same record found in this schema's place: doubtful, a miss
    shutil.rmtree(entry)
    shutil.copytree(old, entry)
    _, delta = compile_16(root)
    assert delta == {"invalid": 1, "written": 1}
    assert record_16(root)["schema"] == cc.SCHEMA


# ---------------------------------------------------------------- libcuda's directory
@pytest.fixture
def untold(monkeypatch):
    """Triton told nothing yet, the user's variable unset; undone afterwards."""
    from triton import knobs

    monkeypatch.delenv("TRITON_LIBCUDA_PATH", raising=False)
    monkeypatch.setattr(launch, "_LIBCUDA_TOLD", False)
    vars(knobs.nvidia).pop("libcuda_path", None)
    _clear_triton_libcuda()
    yield knobs
    vars(knobs.nvidia).pop("libcuda_path", None)
    _clear_triton_libcuda()


def test_triton_finds_the_loaded_libcuda_without_ldconfig_and_children_see_nothing(
    stub_libcuda, untold, monkeypatch
):
    from triton.backends.nvidia import driver as nvidia

    assert launch.tell_triton_loaded_libcuda(soname=STUB_SONAME)
    assert untold.nvidia.libcuda_path == str(stub_libcuda)
    assert "TRITON_LIBCUDA_PATH" not in os.environ  # a child process inherits nothing
    monkeypatch.setattr(nvidia.subprocess, "check_output", lambda *a, **k: pytest.fail("ldconfig"))
    assert nvidia.libcuda_dirs() == [str(stub_libcuda)]


def test_a_libcuda_path_the_user_chose_is_kept(stub_libcuda, untold, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_LIBCUDA_PATH", str(tmp_path))
    assert launch.tell_triton_loaded_libcuda(soname=STUB_SONAME)
    assert untold.nvidia.libcuda_path == str(tmp_path)
    assert "libcuda_path" not in vars(untold.nvidia)


def test_a_libcuda_not_loaded_tells_triton_nothing(untold):
    assert not launch.tell_triton_loaded_libcuda(soname="libcudnn_pygraph_never_loaded.so")
    assert untold.nvidia.libcuda_path is None and not launch._LIBCUDA_TOLD


# ---------------------------------------------------------------- Triton's driver utilities
def _driver_record(root):
    return store(root).env_dir / cc._DRIVER_DIR / cc.RECORD


def test_triton_s_driver_utilities_are_kept_and_handed_back_without_the_compiler(
    tmp_path, toolchain, compiler_runs, monkeypatch
):
    root = tmp_path / "ours"
    triton_driver_setup()  # a first process: Triton's driver set-up compiles them
    assert compiler_runs.runs == ["cuda_utils"]
    compile_16(root)  # its first write keeps them (built in our Triton cache), not as an entry
    built = ["cuda_utils", "__triton_launcher", "cuda_utils"]
    assert compiler_runs.runs == built
    rec = json.loads(_driver_record(root).read_text())
    assert rec["name"] == "cuda_utils" and list(rec["files"]) == ["module"]
    assert [e["entry"] for e in cc.entries(root)] == [entry_16(root).name]

    toolchain("triton-b")  # a new machine: Triton's cache empty
    compiler_runs.forbid()
    monkeypatch.setattr(cc, "_live_store", lambda: store(root))
    monkeypatch.setattr(cc, "_DRIVER_PREPARED", False)
    assert cc.prepare_triton_driver()
    assert not cc.prepare_triton_driver()  # once per process
    triton_driver_setup()
    assert compiler_runs.runs == built


@pytest.mark.parametrize("how", ["one byte flipped", "record of another triton"])
def test_doubtful_driver_utilities_are_never_handed_over_and_are_kept_anew(
    tmp_path, toolchain, compiler_runs, how
):
    root = tmp_path / "ours"
    triton_driver_setup()
    compile_16(root)
    record = _driver_record(root)
    rec = json.loads(record.read_text())
    if how == "one byte flipped":
        _flip_last_byte(record.parent / rec["files"]["module"]["name"])
    else:
        rec["key"]["triton_key"] = "0" * 64
        record.write_text(json.dumps(rec))
    fresh = toolchain("triton-b")
    assert not store(root).offer_driver_module()
    assert not list(fresh.rglob("cuda_utils*"))  # nothing handed to Triton
    triton_driver_setup()  # Triton compiles them, as without this cache
    assert compiler_runs.runs == ["cuda_utils", "__triton_launcher", "cuda_utils", "cuda_utils"]
    # the next process's first write keeps them anew (from our own Triton cache)
    compile_via_another_kernel(root)
    toolchain("triton-c")
    assert store(root).offer_driver_module()


def compile_via_another_kernel(root):
    src, options = source(32)
    store(root).compile(src, TARGET, options)
