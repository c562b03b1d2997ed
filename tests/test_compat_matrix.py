"""docs/choosing.md's compatibility matrix is what the code declares, and the crossover plot has its provenance.

The matrix is generated (``tools/docs_results/compat_matrix.py``); these tests fail when the committed block
differs from a fresh rendering, and check its cells against the checks that really refuse a combination
(the configuration's ``--overlap``, ``--hierarchical`` and ``--wire-dtype`` checks, the runtime's
``--device cuda`` refusal), so that a cell cannot say "yes" where the command says no.  Fast: no MPI.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from docs_results import compat_matrix as cmx

ROOT = Path(__file__).resolve().parent.parent
CHOOSING = ROOT / "docs" / "choosing.md"


@pytest.fixture(scope="module")
def table() -> dict[str, dict[str, str]]:
    out = {}
    for line in cmx.render().splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        out[cells[0].strip("`")] = dict(zip(cmx.COLUMNS, cells))
    return out


def test_the_committed_matrix_is_the_generated_one():
    committed = cmx.block(CHOOSING.read_text(encoding="utf-8"))
    assert committed == cmx.render(), (
        "docs/choosing.md's compatibility matrix is stale: run "
        "`PYTHONPATH=tools python -m docs_results.compat_matrix --write`")


def test_every_registered_scheme_has_a_row_and_no_cell_is_unknown(table):
    from mpisparse.registry import SCHEMES

    assert set(table) == set(SCHEMES)
    for name, row in table.items():
        assert "?" not in row.values(), f"{name}: a cell the generator cannot fill ({row})"


def test_overlap_cells_follow_the_overlap_check(table):
    from mpisparse.config import _overlap
    from mpisparse.registry import SCHEMES

    for name, row in table.items():
        cls = SCHEMES[name]
        defaults = {o.name: o.default for o in cls.options}
        cell = row["overlap with backward"]
        if cell == "yes":
            _overlap(cls, True, defaults)
        else:
            with pytest.raises(ValueError):
                _overlap(cls, True, defaults)
        if cell.startswith("with "):
            flag = re.search(r"`--([\w-]+)`", cell).group(1).replace("-", "_")
            opt = next(o for o in cls.options if o.name == flag)
            _overlap(cls, True, {**defaults, flag: cmx._probe(opt)})


def test_hierarchical_device_and_wire_cells_follow_the_refusals(table):
    from mpisparse.config import _hierarchical
    from mpisparse.registry import SCHEMES
    from mpisparse.runtimes import RUNTIMES

    for name, row in table.items():
        cls = SCHEMES[name]
        if row["`--hierarchical`"] == "yes":
            _hierarchical(cls, True)
        else:
            with pytest.raises(ValueError):
                _hierarchical(cls, True)
        check = RUNTIMES[cls.runtime].check_device
        cfg = SimpleNamespace(device="cuda", scheme=name)
        if row["`--device cuda`"] == "yes":
            check(cfg)
        else:
            with pytest.raises(ValueError, match="--device cuda"):
                check(cfg)
        if row["16-bit wire"] == "float16, bfloat16":
            for wire in ("float16", "bfloat16"):
                assert cls.validate_options({"wire_dtype": wire})["wire_dtype"] == wire
        else:
            with pytest.raises(ValueError):
                cls.validate_options({"wire_dtype": "float16"})


def test_the_declared_collective_needs_are_what_the_modules_call():
    """A scheme module that calls ``alltoallv`` is in NEEDS (torch.distributed's communicator lacks it)."""
    from mpisparse.registry import SCHEMES

    for name, cls in SCHEMES.items():
        if cls.runtime != "collective":
            continue
        calls = "alltoallv(" in inspect.getsource(inspect.getmodule(cls))
        assert calls == ("alltoallv" in cmx.NEEDS.get(name, ())), name


def test_every_warm_up_option_is_listed():
    from mpisparse.registry import SCHEMES

    for name, cls in SCHEMES.items():
        for o in cls.options:
            if "warmup" in o.name or o.name.startswith("start_"):
                assert o.name in cmx.WARMUP_OPTIONS, f"{name}: --{o.name} is a warm-up the matrix does not list"


def test_the_crossover_plot_is_committed_with_its_provenance():
    png = ROOT / "docs" / "results" / "plots" / "crossover.png"
    info = json.loads(png.with_suffix(".json").read_text())
    assert png.stat().st_size > 1000
    for key in ("command", "commit", "date_utc", "machine", "inputs"):
        assert info[key], key
    assert "docs_results.crossover_plot" in info["command"]
    text = CHOOSING.read_text(encoding="utf-8")
    assert "results/plots/crossover.png" in text and info["commit"].split("+")[0] in text


def test_the_quoted_time_to_accuracy_rows_are_tta_mds():
    """choosing.md quotes a subset of docs/results/tta.md's columns; every quoted cell is the generated one."""
    from docs_results.provenance import markdown_tables

    tta = next(t for t in markdown_tables((ROOT / "docs" / "results" / "tta.md").read_text()) if t[1][0] == "scheme")
    _, tcols, trows = tta
    source = {r[0]: dict(zip(tcols, r)) for r in trows}
    text = CHOOSING.read_text(encoding="utf-8")
    quoted = text.split("<!-- tta-quote", 1)[1]
    quote = next(t for t in markdown_tables(quoted) if t[1][0] == "scheme")
    _, qcols, qrows = quote
    assert qrows and len(qrows) == len(trows)
    for r in qrows:
        for col, cell in zip(qcols, r):
            assert source[r[0]][col] == cell, f"{r[0]}, {col}: choosing.md says {cell!r}, tta.md {source[r[0]][col]!r}"
