"""Generated documentation: the results tables in ``docs/results/``, ``docs/cli.md`` and the README headline.

Every measured number in the documentation comes from here. A *table*
names the ``mpisparse`` commands that measure it (:class:`Run`, each run
with ``--json``) and a renderer, a pure function of the result objects
those commands wrote. :func:`generate` runs the commands, renders, and
writes ``docs/results/NAME.md`` with a provenance header: the exact
commands, the git commit, the UTC date and the machine. ``bin/docs-results``
is the command-line front end (:func:`main`).

Two sizes: the default (what the committed files are generated with; about a
quarter of an hour on two cores) and ``quick`` (small models and few steps,
for the tests).

``docs/cli.md`` is generated from the ``--help`` text of every command and
subcommand, and the README's headline table (between
``<!-- results:headline begin -->`` and ``<!-- results:headline end -->``)
from the generated files, so neither can go stale.

The package, by concern:

* ``framework``: :class:`Run`, :class:`Table`, the registry and the Markdown helpers;
* one module per family of tables, each declaring its own: ``bench_tables`` (one
  machine's benchmarks), ``train_tables`` (training, parameter server, model
  parallelism), ``cluster_tables`` (the emulated cluster and the cost model),
  ``reproduce_tables`` (``mpisparse reproduce`` targets);
* ``provenance`` (the header of a results file, and parsing generated files),
  ``running`` (:func:`generate`), ``cli_reference`` (``docs/cli.md``) and
  ``readme`` (the README's headline and claims summary);
* this module: the public names and :func:`main`.

This package imports only the standard library at module level; the
commands run as subprocesses (``python -m mpisparse ...``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

# the family modules declare their tables as they are imported
from . import bench_tables, cluster_tables, reproduce_tables, train_tables  # noqa: F401
from . import advisor_table  # noqa: F401
from . import tta_table  # noqa: F401
from . import tta_gpt_table  # noqa: F401
from . import tta_recsys_table  # noqa: F401
from . import advisor_hosts_table  # noqa: F401
from . import advisor_gpu_table  # noqa: F401
from .bench_tables import STEP_OUTPUTS
from .cli_reference import generate_cli, subcommands
from .cluster_tables import _cost_model_render  # noqa: F401  (tests/test_costmodel.py)
from .framework import (CLAIMS_BEGIN, CLAIMS_END, GENERATED_MARK, HEADER_FIELDS, HEADLINE_BEGIN, HEADLINE_END, REPO,
                        TABLES, Run, Table, table_names)
from .provenance import display, git_commit, machine_info, markdown_tables, parse_header, table_columns
from .readme import _find_table, claim_counts, claims_summary, headline, update_readme  # noqa: F401
from .reproduce_tables import REPRODUCE_TARGETS
from .running import RunError, generate

__all__ = ["Run", "Table", "TABLES", "table_names", "generate", "generate_cli", "headline", "update_readme",
           "parse_header", "table_columns", "markdown_tables", "machine_info", "git_commit", "main",
           "HEADER_FIELDS", "HEADLINE_BEGIN", "HEADLINE_END", "CLAIMS_BEGIN", "CLAIMS_END", "claims_summary",
           "claim_counts", "GENERATED_MARK", "REPRODUCE_TARGETS", "STEP_OUTPUTS", "subcommands", "RunError",
           "ORDER"]

#: the order of ``--list`` and of a full run; the tables not named here (the reproduce ones) follow in the
#: order their modules declare them
ORDER = ("select-kernels", "deft-select", "train-digits", "step-memory", "fused-step", "cost-model",
         "gradient-sources", "exchange", "scaling", "ps-train", "ps-step", "mp-train", "emucluster", "hierarchical",
         "overlap", "advisor")
for _name in [*ORDER, *(n for n in list(TABLES) if n not in ORDER)]:
    TABLES[_name] = TABLES.pop(_name)


# --------------------------------------------------------------------------- command line
def main(argv: Sequence[str] | None = None) -> int:
    repo = REPO
    names = ["cli", *TABLES]
    p = argparse.ArgumentParser(
        prog="bin/docs-results",
        description="Regenerate docs/results/*.md (running the commands that measure them), docs/cli.md and the "
                    "README's headline table.")
    p.add_argument("--quick", action="store_true", help="small sizes and few steps (what the tests run)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="only these tables (see --list); 'cli' is docs/cli.md")
    p.add_argument("--skip", nargs="+", metavar="NAME", default=[], help="all tables but these")
    p.add_argument("--list", action="store_true", help="list the tables and their commands, run nothing")
    p.add_argument("--out", default=None, help="directory of the results files [docs/results]")
    p.add_argument("--timeout", type=float, default=None, help="seconds per command [1800; quick: 300]")
    p.add_argument("--keep-going", action="store_true", help="go on with the next table when one fails")
    p.add_argument("--keep-json", default=None, metavar="DIR",
                   help="also write each run's JSON result to DIR/TABLE--LABEL.json (the tables keep only the text)")
    args = p.parse_args(argv)
    for n in [*(args.only or []), *args.skip]:
        if n not in names:
            p.error(f"unknown table {n!r}; tables: {', '.join(names)}")
    if args.list:
        print(f"{'cli':<28} docs/cli.md from every command's --help")
        for n, t in TABLES.items():
            env = {"OMP_NUM_THREADS": "1", **t.env(args.quick)}
            print(f"{n:<28} {t.title}")
            for r in t.runs(args.quick):
                print(f"{'':<28}   $ {display(r, env)}")
        return 0
    chosen = [n for n in (args.only or names) if n not in args.skip]
    default_out = repo / "docs" / "results"
    out_dir = Path(args.out) if args.out else default_out
    in_repo = out_dir.resolve() == default_out.resolve()
    machine = machine_info()
    failed = []
    t_all = time.perf_counter()
    for n in chosen:
        t0 = time.perf_counter()
        print(f"== {n}", flush=True)
        try:
            if n == "cli":
                path = generate_cli(repo / "docs" / "cli.md" if in_repo else out_dir / "cli.md", repo=repo)
            else:
                path = generate(n, quick=args.quick, out_dir=out_dir, repo=repo, timeout=args.timeout,
                                machine=machine, echo=lambda s: print(s, flush=True), keep_json=args.keep_json)
        except RunError as e:
            print(f"docs-results: {n}: {e}", file=sys.stderr, flush=True)
            failed.append(n)
            if not args.keep_going:
                break
            continue
        print(f"wrote {path} ({time.perf_counter() - t0:.0f} s)", flush=True)
    if in_repo and not args.quick:
        block = headline(default_out)
        if block is not None and update_readme(repo / "README.md", block):
            print("updated the headline table in README.md")
        block = claims_summary(default_out)
        if block is not None and update_readme(repo / "README.md", block, CLAIMS_BEGIN, CLAIMS_END):
            print("updated the claims summary in README.md")
    print(f"docs-results: {len(chosen) - len(failed)} of {len(chosen)} done in "
          f"{time.perf_counter() - t_all:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0

