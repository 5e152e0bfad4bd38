"""Query results as text for the terminal: aligned table, CSV or JSON (`splavu sql`, `splavu neighbors`)."""
from __future__ import annotations

import csv
import io
import json
import math
from datetime import date, datetime

import pyarrow as pa


def _cell(v, width: int) -> str:
    if v is None:
        s = ""
    elif isinstance(v, float):
        s = f"{v:.6g}"
    elif isinstance(v, (datetime, date)):
        s = v.isoformat()
    elif isinstance(v, (list, tuple)):
        s = "[" + ", ".join(_cell(x, width) for x in v[:4]) + (", ..." if len(v) > 4 else "") + "]"
    else:
        s = str(v)
    s = s.replace("\n", " ")
    return s if len(s) <= width else s[:width - 1] + "…"


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, bytes):
        return v.hex()
    return v


def format_table(table: pa.Table, fmt: str = "table", max_width: int = 40) -> str:
    """'table': aligned text (numbers right-aligned, long cells cut); 'csv'; 'json': a list of objects."""
    rows = table.to_pylist()
    names = table.column_names
    if fmt == "json":
        return json.dumps([_jsonable(r) for r in rows], ensure_ascii=False)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(names)
        for r in rows:
            w.writerow(["" if r[c] is None else json.dumps(_jsonable(r[c])) if isinstance(r[c], (list, dict))
                        else _jsonable(r[c]) for c in names])
        return buf.getvalue()
    if fmt != "table":
        raise ValueError(f"fmt must be 'table', 'csv' or 'json', got {fmt!r}")
    cells = [[_cell(r[c], max_width) for c in names] for r in rows]
    numeric = [pa.types.is_integer(f.type) or pa.types.is_floating(f.type) for f in table.schema]
    widths = [max([len(n)] + [len(row[i]) for row in cells]) for i, n in enumerate(names)]

    def line(vals):
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(vals, widths, numeric)).rstrip()

    out = [line(names), line(["-" * w for w in widths])] + [line(row) for row in cells]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)
