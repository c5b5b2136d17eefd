"""The `cudnn-pygraph` command (also `python -m cudnn_pygraph`).

  demo [--quick] [--only gemm,sdpa,gdn]   the whole idea on this machine (demo.py)
  (demo, doctor, plans and autotune take --opt-in: include the opt-in engines)
  doctor                                  versions, device, which engines are offered here
  plans GRAPH.json | --example NAME       the ranked plan list of a graph, with reasons
        [--modes A,FALLBACK,OPENSOURCE] [--write-json PATH]
  autotune --show | --clear               the persistent autotune cache
  autotune --example NAME [--reps N]      time every plan of an example graph, cache it

Exit codes: 0 done; 1 the graph has no plan here / a demo check failed; 2 bad input or a
missing optional dependency (one line on stderr saying what to fix); 3 an internal
error. --debug (before the command) shows the traceback instead of the one line.
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
def use_interpreter_without_gpu():
    """Without a GPU, Triton kernels run under the interpreter, which must be chosen
    BEFORE anything imports triton: this runs first in main()."""
    from .planning.device import detect_device

    if detect_device() is None:
        os.environ.setdefault("TRITON_INTERPRET", "1")


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
        raise UsageError(f"{what} needs {' and '.join(missing)}: pip install {' '.join(missing)} "
                         f"(or pip install 'cudnn-pygraph[demo]')")


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
    outcomes = demo.run(names, quick=args.quick)
    return 1 if any(o.passed is False for o in outcomes) else 0


def _parse_list(text, allowed, flag):
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise UsageError(f"{flag}: unknown {', '.join(map(repr, bad)) or 'empty list'} "
                         f"(choose from {', '.join(allowed)})")
    return tuple(items)


# ---------------------------------------------------------------- doctor
_LIBCUDNN = ("libcudnn.so.9", "libcudnn.so.8", "libcudnn.so")


def _cudnn_version_text(v):
    v = int(v)
    major, minor, patch = (v // 10000, v // 100 % 100, v % 100) if v >= 90000 else (v // 1000, v // 100 % 10, v % 100)
    return f"{major}.{minor}.{patch}"


def libcudnn_version():
    """(version string, where) of libcudnn, else (None, why). Asked through the backend's
    own loader when the frontend is installed (it finds the pip wheel's library); else the
    dynamic loader, by ctypes."""
    from .backend import adapter

    if adapter.backend_installed():
        from .backend import lowering

        try:
            return _cudnn_version_text(lowering.frontend().libcudnn_version), "as the backend loads it"
        except Exception as exc:  # BackendUnavailableError, or a frontend that breaks on import
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
    return None, "not found by the loader (pip install nvidia-cudnn-cu13, or -cu12)"


def doctor_report():
    """The paste-able report, as a list of lines."""
    from . import __version__
    from .planning import manifest
    from .planning.device import detect_device

    lines = [f"{PROG} doctor", "", "software:"]
    lines.append(f"  cudnn_pygraph          {__version__}")
    lines.append(f"  python                 {platform.python_version()} ({sys.executable})")
    lines.append(f"  platform               {platform.platform()}")
    for label, dist, hint in (
        ("torch", "torch", "pip install torch"),
        ("triton", "triton", "pip install triton"),
        ("backend (cudnn-fe)", "nvidia-cudnn-frontend", "pip install 'cudnn-pygraph[cudnn]'"),
    ):
        v = dist_version(dist)
        lines.append(f"  {label:<22} {v or 'not installed (' + hint + ')'}")
    cudnn_v, where = libcudnn_version()
    lines.append(f"  {'libcudnn':<22} {cudnn_v + ' (' + where + ')' if cudnn_v else where}")
    lines.append(f"  TRITON_INTERPRET       {os.environ.get('TRITON_INTERPRET', '(unset)')}")
    lines.append(f"  {manifest.OPT_IN_ENV} {os.environ.get(manifest.OPT_IN_ENV, '(unset)')}")
    lines.append(f"  CUDNN_PYGRAPH_LOG      {os.environ.get('CUDNN_PYGRAPH_LOG', '(unset)')}")
    from .planning import autotune

    state = "on" if autotune.cache_enabled() else f"off ({autotune.DISABLE_ENV}=1)"
    lines.append(f"  autotune cache         {autotune.cache_root()} ({state})")

    device = detect_device()
    lines += ["", "device:"]
    if device is None:
        lines.append("  none: no GPU and TRITON_INTERPRET is not 1 (nothing here can run a kernel)")
    elif device.is_interpreter:
        lines.append(f"  {device.name}: no GPU; Triton kernels run on {device.sm_count} CPU cores")
    else:
        lines.append(f"  {device.name}: sm_{device.sm} (compute capability {device.major}.{device.minor}), "
                     f"{device.sm_count} SMs, L2 {device.l2_bytes / 2**20:.0f} MiB")

    lines += ["", "engine families (manifest) and what is offered here:"]
    for family in manifest.FAMILIES:
        lines.append(f"  {family.name} (anchors: {', '.join(family.anchors)})")
        if not family.slots:
            lines.append("    no python engine yet: " + _without_engines(family))
        for slot, verdict in engine_availability(family, device):
            lines.append(f"    [{family.engine_id(slot)}] {slot.name:<28} {verdict}")
    from .backend import adapter

    backend = "installed" if adapter.backend_installed() else adapter.INSTALL_HINT
    lines.append(f"  cudnn backend: {backend}")
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
        except Exception as exc:  # a missing dependency or a broken engine module
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
            where = (f" (under the interpreter; on a GPU: {span})" if device is not None and device.is_interpreter
                     else f" (arch range {span})" if span else "")
            out.append((slot, "offered" + where))
    return out


def cmd_doctor(args):
    print("\n".join(doctor_report()))
    return 0


# ---------------------------------------------------------------- plans
def parse_modes(text):
    from ._types import heur_mode

    modes = []
    for name in (x.strip().upper() for x in text.split(",")):
        if name not in heur_mode.__members__:
            raise UsageError(f"--modes: unknown mode {name!r} (choose from {', '.join(heur_mode.__members__)})")
        modes.append(heur_mode[name])
    return modes


def load_graph(path):
    from .graph.pygraph import pygraph

    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    try:
        return pygraph.from_json(doc)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # any malformed document
        what = str(exc) if isinstance(exc, ValueError) else f"malformed IR document ({type(exc).__name__}: {exc})"
        raise UsageError(f"{path}: {what} (write it with graph.to_json(), or see "
                         f"`{PROG} plans --example gemm --write-json FILE`)") from None


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
            raise UsageError(f"--write-json: cannot write {args.write_json}: {exc.strerror or exc}") from None
    print(f"{source}, modes [{', '.join(m.name for m in modes)}]:")
    try:
        graph.create_execution_plans(modes)
    except cudnnGraphNotSupportedError as exc:
        if graph._planning is None:  # the graph itself is invalid: bad input
            raise UsageError(f"{source}: invalid graph: {exc}") from None
        print(graph.explain())
        print(f"no plan for graph '{graph.name}' here: nothing above accepts it")
        return 1
    print(graph.explain())
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
        print(f"  {path.parent.name}/{path.name[:16]}..  {entry.get('plan_name', '?')}  "
              f"engine_id={entry.get('engine_id')} knobs={{{knobs}}}  device={dev_name}  "
              f"written {entry.get('written', '?')}")
    return 0


def _autotune_example(args):
    """Tune an example graph on this machine's buffers (the demo's small size without a
    GPU): the first run times every plan, a later process replays the cached choice."""
    require(["torch"], "autotune --example")
    import torch

    from ._types import cudnnGraphNotSupportedError
    from .demo import DEMO_MODES, EXAMPLES
    from .planning.device import detect_device

    device = detect_device()
    dev = "cuda" if device is not None and not device.is_interpreter and torch.cuda.is_available() else "cpu"
    ex = EXAMPLES[args.example](dev == "cuda" and not args.quick)
    gen = torch.Generator().manual_seed(0)
    pack = {t: make(torch, dev, gen) for t, make in ex.inputs.items()}
    pack[ex.output] = torch.empty(tuple(ex.output.dim), dtype=torch.float16, device=dev)
    print(f"example '{args.example}': {ex.title}, on {dev}")
    try:
        ex.graph.create_execution_plans(list(DEMO_MODES))
        result = ex.graph.autotune(pack, warmup=args.warmup, reps=args.reps)
    except cudnnGraphNotSupportedError as exc:
        if ex.graph._planning is not None:
            print(ex.graph.explain())
        print(f"nothing to tune here: {exc}")
        return 1
    print(result.table())
    print(f"selected #{result.index} {result.plan_name}; cache entry: {result.cache_path or '(cache off)'}")
    return 0


# ---------------------------------------------------------------- main
def build_parser():
    from .demo import EXAMPLES

    p = argparse.ArgumentParser(prog=PROG, description="Python-native cuDNN graphs: demo, diagnostics, plans.")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    sub = p.add_subparsers(dest="command", required=True)

    # Opt-in engines (manifest.OPT_IN_ENV) for this run: on every command that plans.
    opt_in = argparse.ArgumentParser(add_help=False)
    opt_in.add_argument("--opt-in", action="store_true",
                        help="include the opt-in engines (sets CUDNN_PYGRAPH_ENABLE_OPT_IN_ENGINES=1)")

    d = sub.add_parser("demo", parents=[opt_in], help="run the demo (a small size without a GPU)")
    d.add_argument("--quick", action="store_true", help="the small size everywhere (what CI runs)")
    d.add_argument("--only", help=f"comma-separated subset of {','.join(EXAMPLES)}")
    d.set_defaults(func=cmd_demo)

    sub.add_parser("doctor", parents=[opt_in], help="versions, device, engines offered here (for bug reports)"
                   ).set_defaults(func=cmd_doctor)

    pl = sub.add_parser("plans", parents=[opt_in], help="print a graph's ranked plan list with every reason")
    pl.add_argument("graph", nargs="?", metavar="GRAPH.json", help="the IR's JSON form (graph.to_json())")
    pl.add_argument("--example", choices=sorted(EXAMPLES), help="plan an example graph instead")
    pl.add_argument("--modes", default="A,FALLBACK", help="heuristic modes, in order (default A,FALLBACK)")
    pl.add_argument("--write-json", metavar="PATH", help="also write the graph's JSON form to PATH")
    pl.set_defaults(func=cmd_plans)

    a = sub.add_parser("autotune", parents=[opt_in],
                       help="show or clear the persistent autotune cache, or tune an example")
    g = a.add_mutually_exclusive_group(required=True)
    g.add_argument("--show", action="store_true", help="list the cache's entries")
    g.add_argument("--clear", action="store_true", help="remove every entry")
    g.add_argument("--example", choices=sorted(EXAMPLES), help="time every plan of an example graph here")
    a.add_argument("--warmup", type=int, default=3)
    a.add_argument("--reps", type=int, default=10)
    a.add_argument("--quick", action="store_true", help="the small size on a GPU too")
    a.set_defaults(func=cmd_autotune)
    return p


def main(argv=None):
    use_interpreter_without_gpu()
    args = build_parser().parse_args(argv)
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
        print(f"{PROG}: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
