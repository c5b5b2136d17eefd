"""Charts of the benchmark results: every Markdown table in bench/results/*.md that has
ratio columns (ours vs the backend, ours vs the peer: headers like `ours/torch`,
`ours/backend`, `fwd speedup vs fla`, cells like `1.23x`) becomes one PNG of grouped
bars under docs/img/, and the results section of docs/benchmarks.md is rewritten to
list every results file with its charts.

Only the latest run of each kind of table is charted (a results file keeps its history,
newest first or not: the date above each table decides); each chart names the GPU, the
date and the versions found above its table, and says which way is better for every
ratio (BETTER below: a ratio column no rule covers is an error, so a new one must say).

    python bench/plot.py [--results bench/results] [--img docs/img] [--no-index]

Installs nothing; needs matplotlib (`pip install matplotlib`). A results file that does
not exist yet, or has no ratio table, is listed without a chart — never an error.
The bars are the ratios exactly as the table prints them: the header says which way
round (gemm's `ours/torch` is torch time over ours, > 1 = ours faster).
"""

import argparse
import dataclasses
import pathlib
import re
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent
INDEX_BEGIN = "<!-- results:begin (bench/plot.py rewrites this section) -->"
INDEX_END = "<!-- results:end -->"
_RATIO_CELL = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*[x×]?\s*$")
_X_CELL = re.compile(r"^\s*[0-9]*\.?[0-9]+\s*[x×]\s*$")
# Leading columns up to the first measurement are the row's label (shape, M/N/K, state,
# burst): a measurement's header names a unit or a contender.
_MEASURE_WORDS = (
    "ms",
    "us",
    "config",
    "tflop",
    "tok",
    "err",
    "check",
    "gb/s",
    "ours",
    "theirs",
    "torch",
    "backend",
    "fla",
    "peer",
    "floor",
)


# Which way is better, per ratio column header (first match wins). The headers read
# differently: sdpa's `ours/torch` is a ratio of TFLOP/s and gemm's `torch/first` one of
# times (both: above 1 = ours faster), the host tables' `ours/theirs` and `op / raw` are
# ratios of microseconds per call (below 1 = ours faster), as is every `host ...` ratio.
BETTER = (
    (r"^host\b", "lower"),
    (r"speedup|\bvs\b", "higher"),
    (r"^ours/(torch|backend|fla)\b", "higher"),
    (r"^(torch|backend|fla|theirs)/(ours|first)\b", "higher"),
    (r"^(fla|nvidia)\s*/\s*ours\b", "higher"),
    (r"^fla\s*/\s*accelerated\b", "higher"),  # fla's own call over it after accelerate_fla
    (r"^gdn-2\s*/\s*gdn\b", "lower"),
    (r"^ours/(theirs|floor)\b", "lower"),
    (r"^op\s*/", "lower"),
    (r"^after\s*/\s*before\b", "lower"),  # a time after a change over the time before it
)
_DATE = re.compile(r"\b(20\d\d-\d\d-\d\d)(?:[ T]~?(\d\d:\d\d))?")
_GPU = re.compile(r"\bNVIDIA [A-Z][A-Za-z0-9]*\d[A-Za-z0-9]*\b")
_VERSIONS = re.compile(
    r"\b(torch|triton|nvidia-cudnn-frontend|libcudnn|cuDNN|fla-core|flashinfer)\s+v?(\d[\w.+]*)"
)


def better(header):
    """'higher' or 'lower': which way of 1 means ours is better, for a ratio column."""
    h = header.strip().lower()
    for pattern, way in BETTER:
        if re.search(pattern, h):
            return way
    raise ValueError(
        f"ratio column {header!r}: no rule in bench/plot.py BETTER says which way is better"
    )


@dataclasses.dataclass
class RatioTable:
    title: str  # the heading above the table
    labels: list  # one per row
    series: dict  # column header -> [ratio or None per row]
    date: str = ""  # the nearest date above the table ("" if none)
    context: str = ""  # the text above the table: GPU and versions are read from it

    @property
    def kind(self):
        """Tables of one kind are runs of the same measurement: keyed by the first ratio
        column, each side of its '/' to its first word."""
        h = re.sub(r"\(.*?\)", "", next(iter(self.series))).lower()
        return "/".join(side.split()[0] if side.split() else "" for side in h.split("/"))

    def caption(self):
        gpu = _last(_GPU, self.context)
        versions = {}
        for name, v in _VERSIONS.findall(self.context):
            versions[name] = v.rstrip(".")  # the nearest above the table wins; no full stop
        parts = [gpu or "GPU not stated", self.date or "date not stated"]
        parts.append(", ".join(f"{k} {v}" for k, v in versions.items()) or "versions not stated")
        return " · ".join(parts)


def _last(pattern, text):
    found = pattern.findall(text)
    return found[-1] if found else ""


def latest_per_kind(tables):
    """The latest table of each kind, in file order (a date ties: the first one)."""
    best = {}
    for i, t in enumerate(tables):
        key = t.kind
        if key not in best or t.date > tables[best[key]].date:
            best[key] = i
    return [tables[i] for i in sorted(best.values())]


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _is_ratio_column(h, cells):
    """A ratio against someone else: `ours/theirs`, `x/ours`, `speedup`, `vs ...`, or any
    `a/b` header whose cells read `1.23x`. Not a unit (`ns/call`), not a ratio against
    our own other number (`fwd+bwd / own fwd`) and not an error (`max rel diff vs base`)."""
    h = h.lower()
    if "own" in h or re.search(r"\b(diff|err|error)\b", h):
        return False
    named = (
        re.search(r"\bours\s*/|/\s*ours\b", h)
        or "speedup" in h
        or h.startswith("vs ")
        or " vs " in h
    )
    return bool(named or ("/" in h and any(_X_CELL.match(c) for c in cells)))


def _is_measure(h):
    words = re.findall(r"[a-z/]+", h.lower())
    return any(w in _MEASURE_WORDS or w.split("/")[0] in _MEASURE_WORDS for w in words)


def parse_tables(text):
    """Every Markdown table with at least one ratio column, as RatioTables."""
    out, heading, lines = [], "", text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if (
            line.lstrip().startswith("|")
            and i + 1 < len(lines)
            and set(lines[i + 1].replace("|", "").strip()) <= set("-: ")
        ):
            header = _cells(line)
            rows = []
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            table = _ratio_table(heading, header, rows)
            if table is not None:
                table.context = "\n".join(lines[:i])
                dates = _DATE.findall(table.context)
                table.date = " ".join(x for x in dates[-1] if x) if dates else ""
                if any(t.title == table.title for t in out):  # the same heading again: a rerun
                    table.title = f"(table {len(out) + 1} of the file) {table.title}"
                out.append(table)
            continue
        i += 1
    return out


def _ratio_table(title, header, rows):
    column = lambda j: [r[j] for r in rows if j < len(r)]
    ratio_cols = [
        j
        for j, h in enumerate(header)
        if _is_ratio_column(h, column(j)) and any(_RATIO_CELL.match(c) for c in column(j))
    ]
    if not ratio_cols:
        return None
    n_label = next((j for j, h in enumerate(header) if j in ratio_cols or _is_measure(h)), 1) or 1
    # A plan's full name (engine[KNOB=..., ...]) is no label: it is the same down a burst
    # column and too long to read beside a bar; its table names it.
    keep = [j for j in range(n_label) if header[j].strip().lower() != "plan"]
    labels, series = [], {header[j]: [] for j in ratio_cols}
    for r in rows:
        if not any(j < len(r) and _RATIO_CELL.match(r[j]) for j in ratio_cols):
            continue  # a note row (rel err, ...) with no ratio in it
        parts = [r[j] for j in keep if j < len(r)]
        labels.append(" x ".join(parts) if all(c.isdigit() for c in parts) else ", ".join(parts))
        for j in ratio_cols:
            m = _RATIO_CELL.match(r[j]) if j < len(r) else None
            series[header[j]].append(float(m.group(1)) if m else None)
    return RatioTable(title, labels, series)


def plot_table(table, path):
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    n_rows, n_series = len(table.labels), len(table.series)
    fig, ax = plt.subplots(figsize=(10, 0.45 * n_rows * max(1, n_series) * 0.7 + 1.8))
    height = 0.8 / n_series
    for s, (name, values) in enumerate(table.series.items()):
        ys = [r + s * height for r in range(n_rows)]
        way = "higher" if better(name) == "higher" else "lower"
        label = f"{name} ({way} is better: ours {'faster' if way == 'higher' else 'cheaper'} {'above' if way == 'higher' else 'below'} 1)"
        ax.barh(ys, [v if v is not None else 0 for v in values], height=height, label=label)
        for y, v in zip(ys, values):
            ax.text(
                (v or 0) + 0.02, y, f"{v:.2f}x" if v is not None else "n/a", va="center", fontsize=7
            )
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    top = max([v for vs in table.series.values() for v in vs if v is not None] + [1.0])
    ax.set_xlim(0, top * 1.15)  # room for the value labels
    labels = [textwrap.fill(label, 36) for label in table.labels]  # long shapes wrap, not clip
    ax.set_yticks([r + 0.4 - height / 2 for r in range(n_rows)], labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(
        "ratio, as the table's column header states it (dashed: parity; the legend says which way is better)"
    )
    ax.set_title(
        textwrap.fill(table.title, 100) + "\n" + textwrap.fill(table.caption(), 110), fontsize=8
    )
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_name(results_file, k):
    return f"{results_file.stem}.png" if k == 0 else f"{results_file.stem}-{k + 1}.png"


def index_section(results_dir, img_dir, charts, doc_dir):
    """The generated list: every results file, each followed by its charts."""
    lines = [INDEX_BEGIN, ""]
    files = sorted(results_dir.glob("*.md")) if results_dir.is_dir() else []
    if not files:
        lines.append("No results are committed yet: run a benchmark under `bench/` on a GPU.")
    for f in files:
        rel = _rel(f, doc_dir)
        lines.append(f"### [{f.stem}]({rel})")
        lines.append("")
        for png in charts.get(f, []):
            lines.append(f"![{f.stem}]({_rel(png, doc_dir)})")
            lines.append("")
        if not charts.get(f):
            lines.append("(no ratio table to chart)")
            lines.append("")
    lines.append(INDEX_END)
    return "\n".join(lines)


def _rel(path, start):
    import os

    return os.path.relpath(path, start).replace(os.sep, "/")


def rewrite_index(doc, section):
    text = doc.read_text() if doc.exists() else "# Benchmarks\n\n"
    if INDEX_BEGIN in text and INDEX_END in text:
        head, rest = text.split(INDEX_BEGIN, 1)
        tail = rest.split(INDEX_END, 1)[1]
        text = head + section + tail
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    doc.write_text(text)


def main(argv=None):
    p = argparse.ArgumentParser(description="bench/results tables -> PNG charts under docs/img/")
    p.add_argument("--results", default=str(ROOT / "bench" / "results"))
    p.add_argument("--img", default=str(ROOT / "docs" / "img"))
    p.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    p.add_argument(
        "--no-index", action="store_true", help="do not rewrite the docs page's results section"
    )
    args = p.parse_args(argv)
    results, img, doc = pathlib.Path(args.results), pathlib.Path(args.img), pathlib.Path(args.doc)
    tables = {}
    if results.is_dir():
        tables = {
            f: latest_per_kind(parse_tables(f.read_text())) for f in sorted(results.glob("*.md"))
        }
    if any(tables.values()):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("bench/plot.py: error: needs matplotlib: pip install matplotlib", file=sys.stderr)
            return 2
    charts = {}
    for f in tables:  # charts of superseded runs go: the history is the results file
        for stale in [*img.glob(f"{f.stem}.png"), *img.glob(f"{f.stem}-[0-9]*.png")]:
            stale.unlink()
    for f, found in tables.items():
        for k, table in enumerate(found):
            path = img / chart_name(f, k)
            plot_table(table, path)
            charts.setdefault(f, []).append(path)
            print(
                f"{path}: {table.title or f.name} ({len(table.labels)} rows, {', '.join(table.series)})"
            )
        if not found:
            print(f"{f}: no ratio table, no chart")
    if not tables:
        print(f"{results}: no results yet, nothing to chart")
    if not args.no_index:
        rewrite_index(doc, index_section(results, img, charts, doc.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
