"""The one runner of the bench tables: which cases a run takes (--only) and how its rows
come out (printed as each completes, the file rewritten after each, a budget that turns
the rest into "skipped" lines), so every script's table behaves the same way.
"""

from __future__ import annotations

from cases import cases
from timing import Stopwatch


def select(table: str, only: str | None = None) -> list:
    """The cases of `table` whose name holds one of the comma-separated substrings of
    `only` (every case when `only` is empty)."""
    wanted = [w for w in (only or "").split(",") if w]
    return [c for c in cases(table) if not wanted or any(w in c.name for w in wanted)]


def first(table: str, only: str | None = None):
    """The first case `select` takes: the one row a profile or a host run looks at."""
    picked = select(table, only)
    if not picked:
        names = ", ".join(c.name for c in cases(table))
        raise SystemExit(f"--only {only!r} matches no case of {table!r} ({names})")
    return picked[0]


def emit(lines, out: list | None = None) -> None:
    """Print table lines as they complete (flushed: a run cut by its cap keeps them)."""
    lines = [lines] if isinstance(lines, str) else list(lines)
    if lines:
        print("\n".join(lines), flush=True)
    if out is not None:
        out += lines


def run(items, row, header=(), *, budget_s=None, skipped=None, out_path=None, lines=None):
    """The table of `items` (cases, or whatever a script crosses them with): `header` first,
    then `row(item)` (a line or a list of lines) for each, printed as it completes. With
    `budget_s`, an item reached after that many seconds gets `skipped(item)` instead; with
    `out_path`, the file is rewritten after every row. `lines` (the list returned) may
    already hold a preamble. Returns every line of the table."""
    lines = [] if lines is None else lines
    clock = Stopwatch()
    emit(header, lines)
    for item in items:
        if budget_s is not None and clock.over(budget_s):
            emit(skipped(item), lines)
        else:
            emit(row(item), lines)
        if out_path:
            with open(out_path, "w") as f:
                f.write("\n".join(lines) + "\n")
    return lines
