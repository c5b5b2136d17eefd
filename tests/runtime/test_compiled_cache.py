"""The compiled-plan cache (runtime/compiled_cache.py) on real artifacts, without a GPU.

Triton compiles a package kernel for an sm_90 target here (cache_artifacts.py), so every
test below writes and reads the bytes a GPU build would. What a user relies on: a later
process gets the kernel back without compiling it; whatever is on disk (a half-written
entry, a garbled record, an artifact of another device or version, a planted symlink, a
directory others can write) gives a miss or a clear refusal, never an error in the call and
never another kernel's binary. Loading the binary onto a device is the GPU suite's part
(tests/gpu/test_compiled_cache_gpu.py)."""

import json
import logging
import os
import pathlib
import re
import stat
import subprocess
import sys
import threading
import time

import pytest
from cache_artifacts import H200, TARGET, restore_triton_language, sha, source, store

from cudnn_pygraph import cli
from cudnn_pygraph.runtime import compiled_cache as cc

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _real_compiles():
    """The tests compile for a real target: undo what interpreted kernels (earlier tests,
    or a plan run by a test here) left patched in triton.language."""
    restore_triton_language()


@pytest.fixture(scope="module")
def fresh(_own_triton_cache):
    """Triton's own compile of the two kernels (the reference bytes), by D."""
    import triton

    restore_triton_language()  # a module fixture is set up before the autouse one

    out = {}
    for dim in (16, 32):
        src, options = source(dim)
        out[dim] = triton.compile(src, target=TARGET, options=options)
    return out


@pytest.fixture(scope="module", autouse=True)
def _own_triton_cache(tmp_path_factory):
    """Triton's compiles outside our cache (the reference, a bypass) go to an empty Triton
    cache: the user's may hold the same kernel compiled from another checkout, whose line
    info names another path, so other bytes."""
    from triton import knobs

    with knobs.cache.scope():
        knobs.cache.dir = str(tmp_path_factory.mktemp("triton"))
        yield


def entry_of(root, dim, device=H200):
    src, options = source(dim)
    s = store(root, device)
    return s.entry_dir(cc.kernel_key(src, TARGET, options))


def compile_via(root, dim, device=H200):
    src, options = source(dim)
    return store(root, device).compile(src, TARGET, options)


def same_kernel(got, ref):
    """A kernel Triton compiled anew, outside the cache, is the kernel asked for: its name
    and launch shape. Not its bytes: after other suites ran in the process, Triton's state
    can change a fresh compile's code (seen in CI's full run), which the cache's own tests
    (hits, misses, digests) never compare against."""
    keys = ("name", "num_warps", "num_stages", "shared")
    return all(getattr(got.metadata, k) == getattr(ref.metadata, k) for k in keys)


def counted(fn, *args):
    """fn(*args) and what it changed in this process's cache counters."""
    before = cc.stats()
    result = fn(*args)
    after = cc.stats()
    return result, {k: after[k] - before[k] for k in after if after[k] != before[k]}


def forbid_compiling(monkeypatch):
    """Any compile from here on fails: what a hit must not need."""
    import triton

    def refuse(*a, **k):
        raise AssertionError("compiled although the cache holds the kernel")

    monkeypatch.setattr(triton, "compile", refuse)


# ---------------------------------------------------------------- the round trip
def test_a_later_process_gets_the_same_kernel_back_without_compiling(tmp_path, fresh, monkeypatch):
    root = tmp_path / "cache"
    first, delta = counted(compile_via, root, 16)
    assert delta == {"misses": 1, "written": 1}
    assert sha(first) == sha(fresh[16])
    entry = entry_of(root, 16)
    rec = json.loads((entry / cc.RECORD).read_text())
    assert sorted(p.name for p in entry.iterdir()) == sorted(
        [cc.RECORD, f"{sha(first)}.cubin", rec["files"]["json"]["name"]]
    )
    # a new Store is what a new process builds; compiling is now an error
    forbid_compiling(monkeypatch)
    again, delta = counted(compile_via, root, 16)
    assert delta == {"hits": 1}
    assert again.kernel == fresh[16].kernel
    assert again.packed_metadata == fresh[16].packed_metadata
    assert again.metadata._asdict() == first.metadata._asdict()
    assert again.metadata.name == "_dense_copy_kernel"


def test_two_kernels_get_two_entries_and_each_its_own_binary(tmp_path, fresh):
    root = tmp_path / "cache"
    a, b = compile_via(root, 16), compile_via(root, 32)
    assert entry_of(root, 16) != entry_of(root, 32)
    assert (sha(a), sha(b)) == (sha(fresh[16]), sha(fresh[32])) and sha(a) != sha(b)


# ---------------------------------------------------------------- doubtful entries
def _record(root, dim):
    return entry_of(root, dim) / cc.RECORD


GARBLE = {
    "truncated": lambda text: text[: len(text) // 2],
    "empty": lambda text: "",
    "not json": lambda text: "\x00\xffgarbage{" + text,
    "a list": lambda text: "[1, 2, 3]",
    "another schema": lambda text: text.replace(f'"schema": {cc.SCHEMA}', '"schema": 99'),
    "another key": lambda text: text.replace('"D"', '"E"').replace("_dense_copy", "_other"),
    "no files": lambda text: json.dumps(
        {k: v for k, v in json.loads(text).items() if k != "files"}
    ),
    "path in a name": lambda text: re.sub(
        r'"name": "([0-9a-f]{64}[.]cubin)"', r'"name": "../\1"', text
    ),
    "another environment": lambda text: text.replace("NVIDIA H200", "NVIDIA H100"),
}


@pytest.mark.parametrize("how", sorted(GARBLE), ids=lambda h: h.replace(" ", "-"))
def test_a_garbled_record_is_a_miss_and_the_kernel_is_still_right(tmp_path, fresh, how):
    root = tmp_path / "cache"
    compile_via(root, 16)
    record = _record(root, 16)
    record.write_text(GARBLE[how](record.read_text()))
    got, delta = counted(compile_via, root, 16)
    assert delta == {"invalid": 1, "written": 1}
    assert sha(got) == sha(fresh[16])
    # the entry was rewritten whole: the next process hits again
    got, delta = counted(compile_via, root, 16)
    assert delta == {"hits": 1} and sha(got) == sha(fresh[16])


def _artifact(root, dim, kind):
    rec = json.loads(_record(root, dim).read_text())
    return entry_of(root, dim) / rec["files"][kind]["name"]


def _flip_last_byte(p):
    data = bytearray(p.read_bytes())
    data[-1] ^= 0xFF
    p.write_bytes(bytes(data))


CORRUPT = {
    "binary truncated": ("cubin", lambda p: p.write_bytes(p.read_bytes()[:100])),
    "binary one byte flipped": ("cubin", _flip_last_byte),
    "binary missing": ("cubin", lambda p: p.unlink()),
    "metadata edited": ("json", lambda p: p.write_text(p.read_text().replace('"shared"', '"x"'))),
}


@pytest.mark.parametrize("how", sorted(CORRUPT), ids=lambda h: h.replace(" ", "-"))
def test_a_corrupted_artifact_is_never_loaded(tmp_path, fresh, how):
    root = tmp_path / "cache"
    compile_via(root, 16)
    kind, corrupt = CORRUPT[how]
    corrupt(_artifact(root, 16, kind))
    got, delta = counted(compile_via, root, 16)
    assert delta == {"invalid": 1, "written": 1}
    assert got.kernel == fresh[16].kernel


def test_another_kernels_entry_under_this_key_is_never_loaded(tmp_path, fresh):
    """An entry moved under another key's name (a collision, a stray copy) carries its own
    key inside: a miss, never the other kernel's binary."""
    root = tmp_path / "cache"
    compile_via(root, 16)
    compile_via(root, 32)
    mine, theirs = entry_of(root, 16), entry_of(root, 32)
    for p in mine.iterdir():
        p.unlink()
    for p in theirs.iterdir():
        (mine / p.name).write_bytes(p.read_bytes())
    got, delta = counted(compile_via, root, 16)
    assert delta == {"invalid": 1, "written": 1}
    assert got.kernel == fresh[16].kernel != fresh[32].kernel


H100 = {"name": "NVIDIA H100 80GB HBM3", "cc": [9, 0], "sm_count": 132, "l2_bytes": 52428800}


def test_an_artifact_of_another_device_or_version_is_a_miss(tmp_path, fresh, monkeypatch):
    root = tmp_path / "cache"
    compile_via(root, 16, device=H100)
    # another device: another environment directory, a plain miss
    _, delta = counted(compile_via, root, 16)
    assert delta == {"misses": 1, "written": 1}
    # the H100's entry copied into the H200's directory: its record names the H100
    h100, h200 = entry_of(root, 16, H100), entry_of(root, 16)
    for p in h200.iterdir():
        p.unlink()
    for p in h100.iterdir():
        (h200 / p.name).write_bytes(p.read_bytes())
    _, delta = counted(compile_via, root, 16)
    assert delta == {"invalid": 1, "written": 1}
    # another triton version (any field: the next test): another directory, a plain miss
    import triton

    with monkeypatch.context() as m:
        m.setattr(triton, "__version__", "9.9.9")
        upgraded = cc.Store(root, cc.environment(H200))
    assert upgraded.env_hash != store(root).env_hash
    src, options = source(16)
    got, delta = counted(upgraded.compile, src, TARGET, options)
    assert delta == {"misses": 1, "written": 1} and got.kernel == fresh[16].kernel


def test_every_part_of_the_environment_moves_the_directory():
    # Each changed value is one no machine running this suite has (the base is this one).
    base = cc.environment(H200)
    changes = {
        "package": "0.0.0",
        "sources": "0" * 64,
        "triton": "0.0.1",
        "torch": "0.0.1",
        "cuda": "0.1",
        "driver": 12080,
        "triton_env": {"TRITON_F32_DEFAULT": "ieee"},
        "python": ".cpython-399-x86_64-linux-gnu.so",
        "device": H100,
    }
    assert set(changes) == set(base), "a new environment field needs a row here"
    hashes = {cc.environment_hash(base)}
    for field, value in changes.items():
        hashes.add(cc.environment_hash({**base, field: value}))
    assert len(hashes) == len(changes) + 1


def test_the_source_digest_moves_with_every_edit_and_only_with_sources(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    (pkg / "sub" / "__pycache__").mkdir(parents=True)
    (pkg / "a.py").write_text("A = 1\n")
    (pkg / "sub" / "b.py").write_text("B = 2\n")

    def digest():
        monkeypatch.setattr(cc, "_PKG_ROOT", pkg)
        cc.source_digest.cache_clear()
        try:
            return cc.source_digest()
        finally:
            cc.source_digest.cache_clear()

    seen = {digest()}
    (pkg / "sub" / "__pycache__" / "b.cpython-311.pyc").write_bytes(b"bytecode")
    (pkg / "notes.txt").write_text("not a source")
    assert digest() in seen  # what is not a source does not count
    b = pkg / "sub" / "b.py"
    st = b.stat()
    b.write_text("B = 3\n")  # the same size, the mtime put back: still another digest
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns))
    seen.add(digest())
    (pkg / "sub" / "c.py").write_text("")  # a new empty module
    seen.add(digest())
    (pkg / "sub" / "c.py").rename(pkg / "c.py")  # the same bytes, moved
    seen.add(digest())
    assert len(seen) == 4


# ---------------------------------------------------------------- the directory's safety
def test_a_planted_symlink_is_never_followed(tmp_path, fresh):
    root = tmp_path / "cache"
    compile_via(root, 16)
    cubin = _artifact(root, 16, "cubin")
    elsewhere = tmp_path / "elsewhere.cubin"
    elsewhere.write_bytes(cubin.read_bytes())  # even the right bytes: not through a link
    cubin.unlink()
    cubin.symlink_to(elsewhere)
    got, delta = counted(compile_via, root, 16)
    assert delta == {"invalid": 1, "written": 1} and got.kernel == fresh[16].kernel


def test_a_symlinked_environment_directory_is_neither_read_nor_written(tmp_path, fresh):
    root = tmp_path / "cache"
    compile_via(root, 16)
    env_dir = store(root).env_dir
    target = tmp_path / "planted"
    env_dir.rename(target)
    env_dir.symlink_to(target, target_is_directory=True)
    before = sorted(str(p) for p in target.rglob("*"))
    got, delta = counted(compile_via, root, 16)
    assert delta.get("hits", 0) == 0 and delta.get("written", 0) == 0
    assert got.kernel == fresh[16].kernel
    assert sorted(str(p) for p in target.rglob("*")) == before  # nothing written through it


def test_a_world_writable_root_is_refused_with_a_warning_and_the_call_still_works(tmp_path, fresh):
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o777)
    with pytest.warns(RuntimeWarning, match="writable by group or others") as caught:
        got, delta = counted(compile_via, root, 16)
    assert str(root) in str(caught[0].message)
    assert delta == {"refused": 1, "bypassed": 1}
    assert got.kernel == fresh[16].kernel
    assert list(root.iterdir()) == []  # nothing written there


def test_a_root_of_another_user_is_refused_and_not_cleared(tmp_path, fresh, monkeypatch):
    root = tmp_path / "theirs"
    compile_via(root, 16)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(root).st_uid + 1)
    with pytest.warns(RuntimeWarning, match="not this user"):
        got, delta = counted(compile_via, root, 16)
    assert delta == {"refused": 1, "bypassed": 1} and got.kernel == fresh[16].kernel
    with pytest.raises(cc.Unsafe, match="not this user"):
        cc.clear(root)
    assert (root / f"v{cc.SCHEMA}").is_dir()


def test_the_warning_cannot_fail_a_call_that_turns_warnings_into_errors(tmp_path, fresh):
    import warnings

    root = tmp_path / "shared2"
    root.mkdir()
    root.chmod(0o777)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = compile_via(root, 16)
    assert got.kernel == fresh[16].kernel


# ---------------------------------------------------------------- processes
def _worker(root, dim, stage=None):
    """A fresh process on the package this one imported (same sources: same environment)."""
    import cudnn_pygraph

    env = dict(os.environ)
    env["PYTHONPATH"] = str(pathlib.Path(cudnn_pygraph.__file__).parent.parent)
    cmd = [sys.executable, str(HERE / "cache_artifacts.py"), str(root), str(dim)]
    return subprocess.Popen(cmd + ([stage] if stage else []), env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def test_concurrent_writers_in_several_processes_leave_one_good_entry(tmp_path, fresh):
    root = tmp_path / "cache"
    procs = [_worker(root, 16) for _ in range(3)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert {r["sha256"] for r in results} == {sha(fresh[16])}
    entry = entry_of(root, 16)
    assert not [p.name for p in entry.iterdir() if p.name.startswith(".tmp")]
    got, delta = counted(compile_via, root, 16)
    assert delta == {"hits": 1} and got.kernel == fresh[16].kernel


def test_a_process_killed_mid_write_leaves_a_miss_not_an_entry(tmp_path, fresh):
    """Killed (SIGKILL) halfway through the binary's temp file, after the binary and before
    the metadata, and with the record written but not yet moved into place: one process
    each, at once."""
    stages = ("midfile", "artifact", "record")
    procs = {stage: _worker(tmp_path / stage, 16, stage) for stage in stages}
    for stage, p in procs.items():
        _, err = p.communicate(timeout=300)
        assert p.returncode == -9, (stage, err)  # it died where it was told to
    for stage in stages:
        root = tmp_path / stage
        assert not _record(root, 16).exists(), stage
        got, delta = counted(compile_via, root, 16)
        assert delta == {"misses": 1, "written": 1} and got.kernel == fresh[16].kernel, stage
        got, delta = counted(compile_via, root, 16)
        assert delta == {"hits": 1}, stage


# ---------------------------------------------------------------- what is persisted
def _outside(x, N):
    pass


def test_a_kernel_outside_the_package_or_with_an_unnamed_value_is_not_persisted():
    """The source digest covers only the package's kernels, and a value whose text does not
    pin it could name two kernels: neither gets a key (it compiles as if the cache were
    off)."""
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    src, options = source(16)
    assert cc.kernel_key(src, TARGET, options) is not None
    foreign = ASTSource(JITFunction(_outside), {"x": "*fp16", "N": "constexpr"}, {"N": 4})
    assert cc.kernel_key(foreign, TARGET, options) is None
    unnamed = ASTSource(src.fn, dict(src.signature), {"D": object(), "ROWS": 32}, src.attrs)
    assert cc.kernel_key(unnamed, TARGET, options) is None


def test_a_compile_default_moved_by_a_triton_variable_is_another_key(monkeypatch):
    """A compile site that passes only some options (the GEMM's) gets Triton's defaults for
    the rest, and some defaults follow Triton's variables: the key holds them completed."""
    src, _ = source(16)
    given = {"num_warps": 4}
    default = cc.kernel_key(src, TARGET, given)
    assert default == cc.kernel_key(src, TARGET, {**given, "enable_fp_fusion": True})
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    assert cc.kernel_key(src, TARGET, given) != default


@pytest.mark.parametrize("variable", ["TRITON_ALWAYS_COMPILE", "TRITON_KERNEL_OVERRIDE"])
def test_triton_asked_to_compile_every_time_the_cache_stands_aside(tmp_path, fresh, monkeypatch,
                                                                   variable):  # fmt: skip
    root = tmp_path / "cache"
    compile_via(root, 16)
    monkeypatch.setenv(variable, "1")
    monkeypatch.setenv("TRITON_OVERRIDE_DIR", str(tmp_path / "override"))  # holds nothing
    got, delta = counted(compile_via, root, 16)
    assert delta == {"bypassed": 1} and same_kernel(got, fresh[16])


def test_the_disable_variable_bypasses_the_cache(tmp_path, fresh, monkeypatch):
    monkeypatch.setenv(cc.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(cc.DISABLE_ENV, "1")
    src, options = source(16)
    got, delta = counted(cc.compile, src, TARGET, options)
    assert delta == {"bypassed": 1} and same_kernel(got, fresh[16])
    assert not (tmp_path / "cache").exists()


def test_without_a_cuda_device_the_live_cache_compiles_as_if_off(tmp_path, fresh, monkeypatch):
    """The module-level compile keys on the current CUDA device: with none (a CPU-only
    torch, a deviceless ahead-of-time compile) it compiles, writes nothing, raises nothing."""
    import torch

    monkeypatch.setattr(torch.cuda, "current_device", lambda: (_ for _ in ()).throw(
        RuntimeError("no CUDA device")))  # fmt: skip
    monkeypatch.setenv(cc.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(cc.DISABLE_ENV, raising=False)
    src, options = source(16)
    got, delta = counted(cc.compile, src, TARGET, options)
    assert delta == {"bypassed": 1} and same_kernel(got, fresh[16])
    assert not (tmp_path / "cache").exists()


def test_the_location_variable_and_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv(cc.CACHE_ENV, str(tmp_path / "mine"))
    assert cc.cache_root() == tmp_path / "mine"
    monkeypatch.delenv(cc.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cc.cache_root() == tmp_path / "xdg" / "cudnn_pygraph" / "compiled_plans"


# ---------------------------------------------------------------- the size limit
def _fake_env(root, name, nbytes, age_s, schema=cc.SCHEMA):
    assert cc.check_root(root, create=True) is None
    cc._schema_dir(root / f"v{schema}", create=True)  # marked as the cache marks its own
    d = root / f"v{schema}" / name
    (d / ("e" * 32)).mkdir(parents=True)
    (d / ("e" * 32) / cc.RECORD).write_bytes(b"x" * nbytes)
    t = time.time() - age_s
    os.utime(d, (t, t))
    return d


def test_the_size_limit_retires_dead_environments_oldest_first_never_the_live_one(tmp_path):
    root = tmp_path / "cache"
    old_schema = _fake_env(root, "a" * 24, 1000, 10, schema=0)
    oldest = _fake_env(root, "b" * 24, 1000, 300)
    live = _fake_env(root, "c" * 24, 1000, 400)  # the oldest of all, but live
    newer = _fake_env(root, "d" * 24, 1000, 100)
    mine = root / "notes"  # not the cache's: never touched
    mine.mkdir()
    (mine / "keep.txt").write_text("x")
    gone = cc.prune(root, keep=live.name, limit=2500)
    assert gone == 2
    assert not old_schema.exists() and not oldest.exists()
    assert live.exists() and newer.exists() and (mine / "keep.txt").exists()
    assert cc.prune(root, keep=live.name, limit=0) == 0  # 0: no limit
    assert cc.prune(root, keep=live.name, limit=10) == 1 and live.exists()


def test_the_first_write_of_a_process_prunes(tmp_path, fresh, monkeypatch):
    root = tmp_path / "cache"
    dead = _fake_env(root, "b" * 24, 50_000, 300)
    monkeypatch.setenv(cc.MAX_BYTES_ENV, "40000")
    compile_via(root, 16)
    assert not dead.exists() and _record(root, 16).exists()


# ---------------------------------------------------------------- the command line
def test_cli_cache_stats_list_clear(tmp_path, fresh, monkeypatch, capsys):
    root = tmp_path / "cache"
    monkeypatch.setenv(cc.CACHE_ENV, str(root))
    compile_via(root, 16)
    compile_via(root, 32)
    broken = entry_of(root, 32) / cc.RECORD
    broken.write_text("{")
    (root / "notes.txt").write_text("the user's")

    assert cli.main(["cache", "stats"]) == 0
    out = capsys.readouterr().out
    assert str(root) in out and "1 environments, 2 entries" in out and "NVIDIA H200" in out

    assert cli.main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "2 entries" in out and "dense_copy:_dense_copy_kernel  sm_90" in out
    assert "no readable record (a miss)" in out

    assert cli.main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("removed 2 entries") and str(root) in out
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt"]


def test_doctor_names_the_compiled_cache_and_its_state(tmp_path, monkeypatch):
    root = tmp_path / "open"
    root.mkdir()
    root.chmod(0o777)
    monkeypatch.setenv(cc.CACHE_ENV, str(root))
    data = cli.doctor_data()
    assert data["compiled_cache"]["path"] == str(root)
    assert "writable by group or others" in data["compiled_cache"]["refused"]
    line = next(x for x in cli.doctor_report(data) if "compiled-plan cache" in x)
    assert str(root) in line and "refused" in line


# ---------------------------------------------------------------- trust: owners and modes
def _chmod(mode, where):
    def apply(root):
        path = where(root)
        path.chmod(mode)
        return path

    return apply


UNTRUSTED = {
    "binary writable by others": _chmod(0o666, lambda root: _artifact(root, 16, "cubin")),
    "metadata writable by group": _chmod(0o660, lambda root: _artifact(root, 16, "json")),
    "record writable by others": _chmod(0o646, lambda root: _record(root, 16)),
}


@pytest.mark.parametrize("how", sorted(UNTRUSTED), ids=lambda h: h.replace(" ", "-"))
def test_a_file_others_could_have_rewritten_is_a_miss_never_loaded(tmp_path, fresh, how):
    """The victim's own file, mode 0666: another user may have rewritten it and its record
    alike, so the digests prove nothing. A miss; the entry is rewritten private."""
    root = tmp_path / "cache"
    compile_via(root, 16)
    path = UNTRUSTED[how](root)
    got, delta = counted(compile_via, root, 16)
    assert delta == {"invalid": 1, "written": 1} and got.kernel == fresh[16].kernel
    assert stat.S_IMODE(path.stat().st_mode) & 0o022 == 0


def test_an_entry_directory_others_can_write_is_never_read_and_logged_once(tmp_path, fresh,
                                                                           caplog):  # fmt: skip
    root = tmp_path / "cache"
    compile_via(root, 16)
    entry_of(root, 16).chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="cudnn_pygraph"):
        for _ in range(2):
            got, delta = counted(compile_via, root, 16)
            assert delta.get("hits", 0) == 0 and got.kernel == fresh[16].kernel
    said = [r for r in caplog.records if "not trusted" in r.getMessage()]
    assert len(said) == 1 and "writable by group or others" in said[0].getMessage()


def test_a_root_under_a_directory_others_can_write_is_refused_unless_sticky(tmp_path, fresh):
    """Another user could move the root aside and put their own in its place; a sticky
    directory (/tmp) lets no one move what is not theirs."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    root = shared / "cache"
    with pytest.warns(RuntimeWarning, match="above the cache, is writable by group or others"):
        got, delta = counted(compile_via, root, 16)
    assert delta == {"refused": 1, "bypassed": 1} and got.kernel == fresh[16].kernel
    assert not root.exists()  # nothing made there
    shared.chmod(0o1777)
    got, delta = counted(compile_via, root, 16)
    assert delta == {"misses": 1, "written": 1}


def test_every_directory_the_cache_makes_is_private_whatever_the_umask(tmp_path, fresh):
    root = tmp_path / "a" / "b" / "cache"
    old = os.umask(0)
    try:
        compile_via(root, 16)
    finally:
        os.umask(old)
    entry = entry_of(root, 16)
    made = [tmp_path / "a", tmp_path / "a" / "b", root, entry.parent.parent, entry.parent, entry,
            store(root).triton_dir]  # fmt: skip
    assert {str(d): stat.S_IMODE(d.stat().st_mode) for d in made} == {str(d): 0o700 for d in made}
    _, delta = counted(compile_via, root, 16)
    assert delta == {"hits": 1}


# ---------------------------------------------------------------- Triton's own cache
def test_a_kernel_planted_in_a_shared_triton_cache_is_never_kept(tmp_path, fresh, monkeypatch):
    """Triton hands back what its cache directory holds; a miss here compiles in a Triton
    cache of our own, so a binary another user rewrote in a shared one is never kept."""
    import triton
    from triton import knobs

    shared = tmp_path / "shared-triton"
    with knobs.cache.scope():
        knobs.cache.dir = str(shared)
        src, options = source(16)
        triton.compile(src, target=TARGET, options=options)
        (cubin,) = shared.rglob("*.cubin")
        planted = bytearray(cubin.read_bytes())
        planted[-1] ^= 0xFF
        cubin.write_bytes(bytes(planted))
        assert triton.compile(src, target=TARGET, options=options).kernel == planted  # live
        root = tmp_path / "cache"
        got, delta = counted(compile_via, root, 16)
    assert delta == {"misses": 1, "written": 1}
    assert got.kernel == fresh[16].kernel != bytes(planted)
    assert _artifact(root, 16, "cubin").read_bytes() == fresh[16].kernel


# ---------------------------------------------------------------- never a hang
def _unblock(path, thread):
    """A reader blocked opening FIFO `path`: open and close its other end until it ends."""
    while thread.is_alive():
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        thread.join(0.2)


@pytest.mark.parametrize("what", ["record", "binary"])
def test_a_fifo_in_place_of_a_file_is_a_miss_never_a_hang(tmp_path, fresh, what):
    root = tmp_path / "cache"
    compile_via(root, 16)
    path = _record(root, 16) if what == "record" else _artifact(root, 16, "cubin")
    path.unlink()
    os.mkfifo(path, 0o600)
    done = {}

    def run():
        done["listed"] = cc.entries(root)
        done["compiled"] = counted(compile_via, root, 16)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(120)  # a guard against a hang, not a timing: the run takes seconds
    blocked = thread.is_alive()
    _unblock(path, thread)
    assert not blocked, f"blocked opening a FIFO in place of the {what}"
    (row,) = done["listed"]
    assert (row["shown"] is None) == (what == "record")
    got, delta = done["compiled"]
    assert delta == {"invalid": 1, "written": 1} and got.kernel == fresh[16].kernel


# ---------------------------------------------------------------- only what is ours
def test_prune_and_clear_touch_only_what_the_cache_marked(tmp_path, fresh, monkeypatch, capsys):
    """A root pointed at a project folder: its own v1/ and v7/ are neither counted against
    the limit nor removed."""
    root = tmp_path / "project"
    for name in ("v1", "v7"):
        (root / name).mkdir(parents=True)
        (root / name / "data.bin").write_bytes(b"x" * 100_000)
    compile_via(root, 16)
    ours = cc.usage(root)["bytes"]
    assert 0 < ours < 100_000
    assert cc.prune(root, keep=store(root).env_hash, limit=ours + 1000) == 0
    monkeypatch.setenv(cc.CACHE_ENV, str(root))
    assert cli.main(["cache", "clear"]) == 0
    assert capsys.readouterr().out.startswith("removed 1 entries")
    assert sorted(p.name for p in root.iterdir()) == ["v1", "v7"]
    assert all((root / n / "data.bin").stat().st_size == 100_000 for n in ("v1", "v7"))


def test_a_folder_of_the_users_named_like_the_schema_is_not_adopted(tmp_path, fresh):
    root = tmp_path / "project"
    mine = root / f"v{cc.SCHEMA}"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("the user's")
    with pytest.warns(RuntimeWarning, match="not made by this cache"):
        got, delta = counted(compile_via, root, 16)
    assert delta == {"refused": 1, "bypassed": 1} and got.kernel == fresh[16].kernel
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert cc.clear(root) == (0, 0) and (mine / "notes.txt").exists()


# ---------------------------------------------------------------- garbled records, listed
def _edit(change):
    def apply(blob):
        rec = json.loads(blob)
        change(rec)
        return json.dumps(rec).encode()

    return apply


GARBLED = {
    "truncated": lambda blob: blob[: len(blob) // 2],
    "not UTF-8": lambda blob: b"\xff\xfe" + blob,
    "nested garbage": lambda blob: b"[" * 200_000 + b"]" * 200_000,
    "a number": lambda blob: b"1e999",
    "key a list": _edit(lambda rec: rec.update(key=[1, 2])),
    "target a number": _edit(lambda rec: rec["key"].update(target=7)),
    "arch huge": _edit(lambda rec: rec["key"].update(target=["cuda", 10**400, 32])),
    "written an object": _edit(lambda rec: rec.update(written={"at": [None]})),
    "environment a string": _edit(lambda rec: rec.update(environment="x")),
    "device cc a string": _edit(lambda rec: rec["environment"]["device"].update(cc="90")),
    "kernel with escapes": _edit(lambda rec: rec["key"].update(kernel="\x1b[2Jgone")),
}


@pytest.mark.parametrize("how", sorted(GARBLED), ids=lambda h: h.replace(" ", "-"))
def test_cache_list_and_stats_show_a_garbled_record_as_such(tmp_path, fresh, monkeypatch,
                                                            capsys, how):  # fmt: skip
    root = tmp_path / "cache"
    monkeypatch.setenv(cc.CACHE_ENV, str(root))
    compile_via(root, 16)
    compile_via(root, 32)
    record = _record(root, 32)
    record.write_bytes(GARBLED[how](record.read_bytes()))
    assert cli.main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "2 entries" in out and "dense_copy:_dense_copy_kernel  sm_90" in out
    assert out.count("no readable record (a miss): ") == 1 and "\x1b" not in out
    assert cli.main(["cache", "stats"]) == 0
    out = capsys.readouterr().out
    assert "2 entries (1 unreadable: a miss)" in out and "NVIDIA H200 sm_90" in out
