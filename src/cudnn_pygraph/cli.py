"""The `cudnn-pygraph` command (also `python -m cudnn_pygraph`).

  demo [--quick] [--only gemm,sdpa,gdn]   the whole idea on this machine (demo.py)
  (demo, doctor, plans and autotune take --opt-in: include the opt-in engines)
  doctor [--json]                         versions, driver, device, engines offered here
  plans GRAPH.json | --example NAME       the ranked plan list of a graph, with reasons
        [--modes A,FALLBACK,OPENSOURCE] [--write-json PATH]
  autotune --show | --clear               the persistent autotune cache
  autotune --example [NAME] [--reps N]    time every plan of an example graph (gemm), cache it
  cache stats | list | clear              the compiled-plan cache (python plans' kernels)

Exit codes: 0 done; 1 the graph has no plan here / a demo check failed or an example ran
on no plan where plans can run; 2 bad input or a
missing optional dependency (one line on stderr saying what to fix); 3 an internal
error. --debug (anywhere on the line) shows the traceback instead of the one line;
--version prints the version.
"""

import argparse
import ctypes
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys

PROG = "cudnn-pygraph"


class UsageError(Exception):
    """Bad input or a missing dependency: printed as one line, exit 2."""


# ---------------------------------------------------------------- environment
def missing_modules(names):
    """The optional modules among `names` that are not installed (probed, not imported)."""
    out = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken or blocked install counts as absent
            found = False
        if not found:
            out.append(name)
    return out


def require(names, what):
    missing = missing_modules(names)
    if missing:
        raise UsageError(
            f"{what} needs {' and '.join(missing)}: pip install {' '.join(missing)} "
            f"(or pip install 'cudnn-pygraph[demo]')"
        )


def dist_version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------- demo
def cmd_demo(args):
    require(["torch", "triton"], "the demo")
    from . import demo

    names = _parse_list(args.only, demo.EXAMPLES, "--only") if args.only else tuple(demo.EXAMPLES)
    from .planning.device import detect_device

    outcomes = demo.run(names, quick=args.quick)
    return demo.exit_status(outcomes, detect_device())


def _parse_list(text, allowed, flag):
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise UsageError(
            f"{flag}: unknown {', '.join(map(repr, bad)) or 'empty list'} "
            f"(choose from {', '.join(allowed)})"
        )
    return tuple(items)


# ---------------------------------------------------------------- doctor
_LIBCUDNN = ("libcudnn.so.9", "libcudnn.so.8", "libcudnn.so")
_LIBCUDART = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")


def _cudnn_version_text(v):
    v = int(v)
    if v >= 90000:
        major, minor, patch = v // 10000, v // 100 % 100, v % 100
    else:
        major, minor, patch = v // 1000, v // 100 % 10, v % 100
    return f"{major}.{minor}.{patch}"


def _cuda_version_text(v):
    """CUDA's integer form (12040 -> 12.4)."""
    return f"{v // 1000}.{v % 1000 // 10}"


def _ask_int(lib, fn):
    out = ctypes.c_int()
    if getattr(lib, fn)(ctypes.byref(out)) != 0:
        return None
    return out.value


def cuda_driver():
    """(CUDA version the driver supports, None) or (None, why not): libcuda by ctypes."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None, "no GPU driver (libcuda.so.1 not found)"
    v = _ask_int(lib, "cuDriverGetVersion")
    return (_cuda_version_text(v), None) if v else (None, "libcuda.so.1 answers no version")


def cuda_runtime():
    """(version, where) of a CUDA runtime the loader finds, else (None, why)."""
    for name in _LIBCUDART:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        v = _ask_int(lib, "cudaRuntimeGetVersion")
        return (_cuda_version_text(v), name) if v else (None, f"{name} answers no version")
    for dist in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12"):
        v = dist_version(dist)
        if v:
            return v, f"pip {dist}, not on the loader's path"
    return None, "not found (libcudart)"


def torch_cuda():
    """torch's own CUDA: (build version or None, available, why not). Imports torch."""
    if missing_modules(["torch"]):
        return None, False, "torch not installed"
    import torch

    built = torch.version.cuda
    if built is None:
        return None, False, "a CPU-only torch build"
    try:
        available = torch.cuda.is_available()
    except Exception as exc:  # noqa: BLE001 - a broken driver stack is a finding, not a crash
        return built, False, f"{type(exc).__name__}: {exc}"
    return built, available, "" if available else "torch sees no GPU"


def libcudnn_version():
    """(version string, where) of libcudnn, else (None, why). Asked through the backend's
    own loader when the frontend is installed (it finds the pip wheel's library); else the
    dynamic loader, by ctypes."""
    from .backend import adapter

    if adapter.backend_installed():
        from .backend import lowering

        try:
            version = lowering.frontend().libcudnn_version
            return _cudnn_version_text(version), "as the backend loads it"
        except Exception as exc:  # noqa: BLE001 - BackendUnavailableError, or a broken frontend
            return None, str(exc)
    for name in _LIBCUDNN:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            return _cudnn_version_text(lib.cudnnGetVersion()), name
        except AttributeError:
            return None, f"{name} has no cudnnGetVersion"
    return None, "not found by the loader (pip install 'cudnn-pygraph[cudnn]')"


def backend_status(device):
    """'usable' when one tiny graph (a 16x16x16 matmul) gets a backend plan here, else
    what stands in the way. Without a GPU the backend is not asked: it plans only on one."""
    from .backend import adapter

    if not adapter.backend_installed():
        return "not installed", adapter.INSTALL_HINT
    if device is None or device.is_interpreter:
        return "installed, not usable here", "no GPU: the backend plans and runs only on a GPU"
    from ._types import cudnnGraphNotSupportedError, data_type, heur_mode
    from .planning import engine_ids
    from .planning.planner import planned
    from .pygraph import pygraph

    g = pygraph(name="doctor_probe", io_data_type=data_type.HALF, compute_data_type=data_type.FLOAT)
    a = g.tensor([1, 16, 16], name="A")
    b = g.tensor([1, 16, 16], name="B")
    g.matmul(a, b).set_output(True)
    try:
        g.create_execution_plans([heur_mode.A])
    except cudnnGraphNotSupportedError:
        pass
    record = planned(g)
    if record is not None and any(engine_ids.is_backend_id(p.engine_id) for p in record.plans):
        return "usable", "a 16x16x16 matmul gets a backend plan"
    outcome = record.backend_outcome.get(heur_mode.A) if record is not None else None
    return "installed, not usable here", str(outcome or "the probe graph got no backend plan")


def variant_pack_status():
    """Which variant pack runs: the C extension, or the pure-Python one (same rules, slower
    per operand) where the extension was not built."""
    from .runtime import variant_pack

    if variant_pack.NATIVE:
        return {"implementation": "native", "note": "C extension"}
    return {
        "implementation": "python",
        "note": "pure Python, slower per operand: the C extension is not built here "
        f"({variant_pack.NATIVE_UNAVAILABLE}); reinstall with a C compiler to build it",
    }


def doctor_data():
    """Everything doctor reports, as JSON-ready data."""
    from . import __version__
    from .planning import autotune, manifest
    from .planning.device import INTERPRET_ENV, USER_INTERPRET, detect_device
    from .runtime import compiled_cache

    driver, driver_why = cuda_driver()
    runtime, runtime_where = cuda_runtime()
    t_cuda, t_available, t_why = torch_cuda()
    cudnn_v, cudnn_where = libcudnn_version()
    device = detect_device()
    backend, backend_why = backend_status(device)
    software = {
        "cudnn_pygraph": __version__,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
    }
    for dist in ("torch", "triton", "numpy", "nvidia-cudnn-frontend"):
        software[dist] = dist_version(dist)
    data = {
        "software": software,
        "variant_pack": variant_pack_status(),
        "cuda": {
            "driver": driver,
            "driver_note": driver_why,
            "runtime": runtime,
            "runtime_note": runtime_where,
            "torch_cuda": t_cuda,
            "torch_cuda_available": t_available,
            "torch_cuda_note": t_why,
            "libcudnn": cudnn_v,
            "libcudnn_note": cudnn_where,
        },
        "backend": {"status": backend, "note": backend_why},
        # the caller's own environment, as it was before this package set anything
        "environment": {
            INTERPRET_ENV: USER_INTERPRET,
            manifest.OPT_IN_ENV: os.environ.get(manifest.OPT_IN_ENV),
            "CUDNN_PYGRAPH_LOG": os.environ.get("CUDNN_PYGRAPH_LOG"),
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        },
        "autotune_cache": {"path": str(autotune.cache_root()), "enabled": autotune.cache_enabled()},
        "compiled_cache": {
            "path": str(compiled_cache.cache_root()),
            "enabled": compiled_cache.enabled(),
            "refused": compiled_cache.check_root(compiled_cache.cache_root()),
        },
        "device": None if device is None else device.to_json(),
        "families": [],
    }
    for family in manifest.FAMILIES:
        data["families"].append(
            {
                "name": family.name,
                "anchors": list(family.anchors),
                "without_engines": None if family.slots else _without_engines(family),
                "engines": [
                    {"engine_id": family.engine_id(slot), "name": slot.name, "verdict": verdict}
                    for slot, verdict in engine_availability(family, device)
                ],
            }
        )
    return data


def _or(value, note):
    if value is None:
        return note or "unknown"
    return f"{value} ({note})" if note else str(value)


def doctor_report(data=None):
    """The paste-able report, as a list of lines."""
    from .planning.device import INTERPRET_ENV

    data = doctor_data() if data is None else data
    sw, cuda, env = data["software"], data["cuda"], data["environment"]
    lines = [f"{PROG} doctor", "", "software:"]
    lines.append(f"  {'cudnn_pygraph':<22} {sw['cudnn_pygraph']}")
    lines.append(f"  {'python':<22} {sw['python']} ({sw['python_executable']})")
    lines.append(f"  {'platform':<22} {sw['platform']}")
    pack = data["variant_pack"]
    lines.append(f"  {'variant pack':<22} {pack['implementation']} ({pack['note']})")
    for label, dist, hint in (
        ("torch", "torch", "pip install 'cudnn-pygraph[demo]'"),
        ("triton", "triton", "pip install 'cudnn-pygraph[demo]'"),
        ("numpy", "numpy", "pip install numpy"),
        ("backend (cudnn-fe)", "nvidia-cudnn-frontend", "pip install 'cudnn-pygraph[cudnn]'"),
    ):
        lines.append(f"  {label:<22} {sw[dist] or 'not installed (' + hint + ')'}")
    lines += ["", "CUDA:"]
    lines.append(f"  {'driver':<22} {_or(cuda['driver'], cuda['driver_note'])}")
    lines.append(f"  {'CUDA runtime':<22} {_or(cuda['runtime'], cuda['runtime_note'])}")
    t_note = "available" if cuda["torch_cuda_available"] else cuda["torch_cuda_note"]
    lines.append(f"  {'torch CUDA':<22} {_or(cuda['torch_cuda'], t_note)}")
    lines.append(f"  {'libcudnn':<22} {_or(cuda['libcudnn'], cuda['libcudnn_note'])}")
    lines.append(f"  {'cudnn backend':<22} {data['backend']['status']}: {data['backend']['note']}")
    lines += ["", "your environment:"]
    for name, value in env.items():
        lines.append(f"  {name:<37} {'(unset)' if value is None else value}")
    cache = data["autotune_cache"]
    from .planning import autotune

    state = "on" if cache["enabled"] else f"off ({autotune.DISABLE_ENV}=1)"
    lines.append(f"  {'autotune cache':<37} {cache['path']} ({state})")
    lines.append(f"  {'compiled-plan cache':<37} {_compiled_cache_line(data['compiled_cache'])}")

    device = data["device"]
    lines += ["", "device:"]
    if device is None:
        lines.append(
            f"  none: no GPU and {INTERPRET_ENV} turns the interpreter off "
            "(nothing here can run a kernel)"
        )
    elif device["is_interpreter"]:
        lines.append(
            f"  {device['name']}: no GPU; Triton kernels run on {device['sm_count']} CPU cores"
            " (fp32, fp16 and bf16: bf16 stored as bf16, computed in fp32, as on a GPU)"
        )
    else:
        lines.append(
            f"  {device['name']}: sm_{device['major']}{device['minor']} (compute capability "
            f"{device['major']}.{device['minor']}), {device['sm_count']} SMs, "
            f"L2 {device['l2_bytes'] / 2**20:.0f} MiB"
        )

    lines += ["", "engine families (manifest) and what is offered here:"]
    for family in data["families"]:
        lines.append(f"  {family['name']} (anchors: {', '.join(family['anchors'])})")
        if family["without_engines"]:
            lines.append("    no python engine yet: " + family["without_engines"])
        for e in family["engines"]:
            lines.append(f"    [{e['engine_id']}] {e['name']:<28} {e['verdict']}")
    return lines


def _without_engines(family):
    from .graph.ops import OPS

    if all(a in OPS and OPS[a].backend_method is None for a in family.anchors):
        return "its ops are python-only, so its graphs have no plan here"
    return "its graphs go to the backend"


def engine_availability(family, device):
    """[(slot, verdict)]: 'offered' or why not (opt-in gate, cannot load, arch range,
    missing dependency). No graph is involved: what a graph needs is check_support's."""
    from .planning import manifest

    offered = family.offered_slots()
    out = []
    for slot in family.slots:
        if slot not in offered:
            out.append((slot, f"not offered: opt-in engine, set {manifest.OPT_IN_ENV}=1"))
            continue
        try:
            engine = manifest.instantiate(family, slot)
        except Exception as exc:  # noqa: BLE001 - a missing dependency or a broken engine module
            out.append((slot, f"not offered: cannot load ({type(exc).__name__}: {exc})"))
            continue
        missing = missing_modules(getattr(engine, "requires", ()))
        caps = getattr(engine, "capabilities", None)
        arch = caps.arch_mismatch(device) if caps is not None else None
        if missing:
            out.append((slot, f"not offered: missing optional dependency {', '.join(missing)}"))
        elif arch:
            out.append((slot, f"not offered: {arch}"))
        else:
            span = "" if caps is None else f"sm_{caps.sm_lo}..{caps.sm_hi or 'inf'}"
            where = (
                f" (under the interpreter; on a GPU: {span})"
                if device is not None and device.is_interpreter
                else f" (arch range {span})"
                if span
                else ""
            )
            out.append((slot, "offered" + where))
    return out


def cmd_doctor(args):
    data = doctor_data()
    print(json.dumps(data, indent=1) if args.json else "\n".join(doctor_report(data)))
    return 0


# ---------------------------------------------------------------- plans
def parse_modes(text):
    from ._types import heur_mode

    modes = []
    for name in (x.strip().upper() for x in text.split(",")):
        if name not in heur_mode.__members__:
            raise UsageError(
                f"--modes: unknown mode {name!r} (choose from {', '.join(heur_mode.__members__)})"
            )
        modes.append(heur_mode[name])
    return modes


def load_graph(path):
    from .pygraph import pygraph

    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{path} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    try:
        return pygraph.from_json(doc)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # any malformed document
        what = (
            str(exc)
            if isinstance(exc, ValueError)
            else f"malformed IR document ({type(exc).__name__}: {exc})"
        )
        raise UsageError(
            f"{path}: {what} (write it with graph.to_json(), or see "
            f"`{PROG} plans --example gemm --write-json FILE`)"
        ) from None


def cmd_plans(args):
    from ._types import cudnnGraphNotSupportedError

    modes = parse_modes(args.modes)
    if (args.graph is None) == (args.example is None):
        raise UsageError("plans: give either GRAPH.json or --example NAME")
    if args.example:
        from .demo import example_graph

        graph = example_graph(args.example)
        source = f"example '{args.example}'"
    else:
        graph = load_graph(args.graph)
        source = args.graph
    if args.write_json:
        try:
            with open(args.write_json, "w") as f:
                json.dump(graph.to_json(), f, indent=1)
        except OSError as exc:
            raise UsageError(
                f"--write-json: cannot write {args.write_json}: {exc.strerror or exc}"
            ) from None
    print(f"{source}, modes [{', '.join(m.name for m in modes)}]:")
    try:
        graph.create_execution_plans(modes)
    except cudnnGraphNotSupportedError as exc:
        from .planning.planner import planned

        if planned(graph) is None:  # the graph itself is invalid: bad input
            raise UsageError(f"{source}: invalid graph: {exc}") from None
        print(graph.explain())
        print(f"no plan for graph '{graph.name}' here: nothing above accepts it")
        return 1
    print(graph.explain())
    return 0


def _compiled_cache_line(cache):
    from .runtime import compiled_cache

    if not cache["enabled"]:
        return f"{cache['path']} (off: {compiled_cache.DISABLE_ENV}=1)"
    if cache["refused"]:
        return f"{cache['path']} (refused: {cache['refused']})"
    return f"{cache['path']} (on)"


# ---------------------------------------------------------------- compiled-plan cache
def _size(n):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _live_environment():
    """The environment hash this machine's device 0 would write under; None without one."""
    from .runtime import compiled_cache

    try:
        import torch

        if not torch.cuda.is_available():
            return None
    except ImportError:
        return None
    env = compiled_cache.environment(compiled_cache.device_facts(0))
    return compiled_cache.environment_hash(env)


def cmd_cache(args):
    from .runtime import compiled_cache

    root = compiled_cache.cache_root()
    if args.action == "clear":
        try:
            count, size = compiled_cache.clear(root)
        except compiled_cache.Unsafe as exc:
            raise UsageError(str(exc)) from None
        print(f"removed {count} entries ({_size(size)}) from {root}")
        return 0
    if args.action == "list":
        rows = compiled_cache.entries(root)
        print(f"compiled-plan cache: {root}, {len(rows)} entries")
        for e in rows:
            shown = e["shown"]
            if shown is None:
                print(f"  {e['env']}/{e['entry']}  no readable record (a miss): {e['problem']}")
                continue
            print(
                f"  {e['env']}/{e['entry']}  {shown['kernel']}  sm_{shown['arch']}  "
                f"{e['bytes']} B  written {shown['written']}"
            )
        return 0
    u = compiled_cache.usage(root)
    limit = _size(u["max_bytes"]) if u["max_bytes"] else "none"
    state = "on" if u["enabled"] else f"off ({compiled_cache.DISABLE_ENV}=1)"
    if u["refused"]:
        state = f"refused: {u['refused']}"
    print(f"compiled-plan cache: {root} ({state})")
    print(f"  schema v{u['schema']}, {_size(u['bytes'])} on disk, limit {limit} "
          f"({compiled_cache.MAX_BYTES_ENV})")  # fmt: skip
    print(f"  {len(u['environments'])} environments, "
          f"{sum(r['entries'] for r in u['environments'].values())} entries")  # fmt: skip
    live = _live_environment()
    print(f"  live environment (device 0): {live or 'none (no CUDA device here)'}")
    for env, r in sorted(u["environments"].items(), key=lambda kv: kv[1]["written"]):
        mark = "*" if env == live else " "
        bad = f" ({r['unreadable']} unreadable: a miss)" if r["unreadable"] else ""
        print(f" {mark}{env}  {r['entries']:>4} entries{bad}  {_size(r['bytes']):>10}  "
              f"{r['device']}  last written {r['written'] or '?'}")  # fmt: skip
    return 0


# ---------------------------------------------------------------- autotune cache
def cmd_autotune(args):
    from .planning import autotune

    root = autotune.cache_root()
    state = "enabled" if autotune.cache_enabled() else f"disabled ({autotune.DISABLE_ENV}=1)"
    if args.clear:
        print(f"removed {autotune.clear()} entries from {root}")
        return 0
    if args.example:
        return _autotune_example(args)
    entries = autotune.list_entries()
    print(f"autotune cache: {root} ({state}), {len(entries)} entries")
    for path, entry in entries:
        if entry is None:
            print(f"  {path.name}: unreadable (ignored: a miss)")
            continue
        key = entry.get("key", {})
        env = key.get("environment", {}) if isinstance(key, dict) else {}
        dev = env.get("device", {}) if isinstance(env, dict) else {}
        dev_name = dev.get("name", "?") if isinstance(dev, dict) else str(dev)
        knobs = ", ".join(f"{k}={v}" for k, v in sorted(entry.get("knobs", {}).items()))
        print(
            f"  {path.parent.name}/{path.name[:16]}..  {entry.get('plan_name', '?')}  "
            f"engine_id={entry.get('engine_id')} knobs={{{knobs}}}  device={dev_name}  "
            f"written {entry.get('written', '?')}"
        )
    return 0


# What `autotune --example` tunes when no name is given: the example whose plans build and
# run fastest under the CPU interpreter (seconds for all six; gdn takes ~40 s).
AUTOTUNE_EXAMPLE = "gemm"


def _autotune_example(args):
    """Tune an example graph on this machine's buffers (the demo's small size without a
    GPU): the first run times every plan, a later process replays the cached choice."""
    require(["torch"], "autotune --example")
    import torch

    from ._types import cudnnGraphNotSupportedError
    from .demo import DEMO_MODES, EXAMPLES
    from .planning.device import detect_device

    device = detect_device()
    dev = (
        "cuda"
        if device is not None and not device.is_interpreter and torch.cuda.is_available()
        else "cpu"
    )
    # Under the CPU interpreter a timing measures Python, not a GPU: one burst ranks the
    # plans as well as thirteen, in a twelfth of the wait, unless the caller asks for more.
    on_gpu = dev == "cuda"
    warmup = args.warmup if args.warmup is not None else (3 if on_gpu else 0)
    reps = args.reps if args.reps is not None else (10 if on_gpu else 1)
    ex = EXAMPLES[args.example](on_gpu and not args.quick)
    gen = torch.Generator().manual_seed(0)
    pack = {t: make(torch, dev, gen) for t, make in ex.inputs.items()}
    pack[ex.output] = torch.empty(tuple(ex.output.dim), dtype=torch.float16, device=dev)
    print(f"example '{args.example}': {ex.title}, on {dev}")
    try:
        ex.graph.create_execution_plans(list(DEMO_MODES))
        result = ex.graph.autotune(pack, warmup=warmup, reps=reps)
    except cudnnGraphNotSupportedError as exc:
        from .planning.planner import planned

        if planned(ex.graph) is not None:
            print(ex.graph.explain())
        print(f"nothing to tune here: {exc}")
        return 1
    print(result.table())
    print(
        f"selected #{result.index} {result.plan_name}; cache entry: {result.cache_path or '(cache off)'}"
    )
    return 0


# ---------------------------------------------------------------- main
def build_parser():
    from . import __version__
    from .demo import EXAMPLES

    p = argparse.ArgumentParser(
        prog=PROG, description="Python-native cuDNN graphs: demo, diagnostics, plans."
    )
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    p.add_argument(
        "--debug", action="store_true", help="show tracebacks instead of one-line errors"
    )
    sub = p.add_subparsers(dest="command", required=True)

    # Opt-in engines (manifest.OPT_IN_ENV) for this run: on every command that plans; and
    # --debug after the command too (SUPPRESS: an absent flag keeps the top level's value).
    opt_in = argparse.ArgumentParser(add_help=False)
    opt_in.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show tracebacks instead of one-line errors",
    )
    opt_in.add_argument(
        "--opt-in",
        action="store_true",
        help="include the opt-in engines (sets CUDNN_PYGRAPH_ENABLE_OPT_IN_ENGINES=1)",
    )

    d = sub.add_parser("demo", parents=[opt_in], help="run the demo (a small size without a GPU)")
    d.add_argument("--quick", action="store_true", help="the small size everywhere (what CI runs)")
    d.add_argument("--only", help=f"comma-separated subset of {','.join(EXAMPLES)}")
    d.set_defaults(func=cmd_demo)

    doc = sub.add_parser(
        "doctor",
        parents=[opt_in],
        help="versions, driver, device, engines offered here (for bug reports)",
    )
    doc.add_argument("--json", action="store_true", help="the same report as JSON")
    doc.set_defaults(func=cmd_doctor)

    pl = sub.add_parser(
        "plans", parents=[opt_in], help="print a graph's ranked plan list with every reason"
    )
    pl.add_argument(
        "graph", nargs="?", metavar="GRAPH.json", help="the IR's JSON form (graph.to_json())"
    )
    pl.add_argument("--example", choices=sorted(EXAMPLES), help="plan an example graph instead")
    pl.add_argument(
        "--modes", default="A,FALLBACK", help="heuristic modes, in order (default A,FALLBACK)"
    )
    pl.add_argument("--write-json", metavar="PATH", help="also write the graph's JSON form to PATH")
    pl.set_defaults(func=cmd_plans)

    a = sub.add_parser(
        "autotune",
        parents=[opt_in],
        help="show or clear the persistent autotune cache, or tune an example",
    )
    g = a.add_mutually_exclusive_group(required=True)
    g.add_argument("--show", action="store_true", help="list the cache's entries")
    g.add_argument("--clear", action="store_true", help="remove every entry")
    g.add_argument(
        "--example",
        nargs="?",
        const=AUTOTUNE_EXAMPLE,
        choices=sorted(EXAMPLES),
        help=f"time every plan of an example graph here (default: {AUTOTUNE_EXAMPLE})",
    )
    a.add_argument("--warmup", type=int, default=None, help="default 3 on a GPU, 0 on the CPU")
    a.add_argument("--reps", type=int, default=None, help="default 10 on a GPU, 1 on the CPU")
    a.add_argument("--quick", action="store_true", help="the small size on a GPU too")
    a.set_defaults(func=cmd_autotune)

    c = sub.add_parser(
        "cache", help="inspect or clear the compiled-plan cache (python plans' kernels)"
    )
    c.add_argument(
        "action",
        choices=("stats", "list", "clear"),
        help="stats: size and environments; list: every entry; clear: remove them all",
    )
    c.set_defaults(func=cmd_cache)
    return p


def show_progress():
    """The command line is an application: it shows the library's progress records (work
    of a second or more) on stderr unless CUDNN_PYGRAPH_LOG already routes them."""
    import logging

    from . import _log

    if _log.level_from_env(os.environ.get(_log.LOG_ENV)) is None and not _log.progress_log.handlers:
        handler = _log.StderrHandler()
        handler.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))
        _log.progress_log.addHandler(handler)
        _log.progress_log.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    from .planning.device import detect_device

    detect_device()  # chooses the interpreter without a GPU before any kernel module loads
    args = build_parser().parse_args(argv)
    show_progress()
    if getattr(args, "opt_in", False):
        from .planning.manifest import OPT_IN_ENV

        os.environ[OPT_IN_ENV] = "1"  # read live by the manifest, for this process
    try:
        return args.func(args)
    except UsageError as exc:
        if args.debug:
            raise
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # not the caller's fault: say so, keep the traceback for --debug
        if args.debug:
            raise
        print(
            f"{PROG}: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
