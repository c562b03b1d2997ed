"""Run on every rank of one job: many rank scripts (cases), one after another.

``python -m mpi4py run_cases.py SPEC``: SPEC is a JSON file written by
``conftest.rank_cases``: ``{"out": DIR, "cases": [{"id", "script", "args",
"timeout"}, ...]}``.  Each rank runs the cases in order, each as its script
would run alone (``runpy`` with ``__main__`` and its own ``sys.argv``), and
appends one line per event to ``DIR/rank<R>.jsonl``, flushed at once:

* ``start`` before a case;
* ``ok`` with the case's standard output and seconds, once every rank is past it;
* ``fail`` with the traceback, then ``MPI_Abort``: the job ends, and the
  harness launches the cases not yet run in a new job;
* a case past its ``timeout`` leaves every thread's stack in
  ``DIR/rank<R>.hang`` and ends this rank (``faulthandler``), which ends the job.

So a failing or hung case is named by the rank that saw it, and the job is
bounded by the cases' own time limits besides ``MPIEXEC_TIMEOUT``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

from mpi4py import MPI

HERE = Path(__file__).resolve().parent


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    world = MPI.COMM_WORLD
    out_dir = Path(spec["out"])
    log = open(out_dir / f"rank{world.rank}.jsonl", "a", buffering=1)
    hang = open(out_dir / f"rank{world.rank}.hang", "w")
    sys.path.insert(0, str(HERE))  # the scripts' own helpers (_common, fakedevice via _common)

    def record(case: dict, event: str, **kw) -> None:
        log.write(json.dumps({"case": case["id"], "event": event, **kw}) + "\n")
        log.flush()

    saved_argv = sys.argv
    for case in spec["cases"]:
        record(case, "start")
        hang.write(f"--- case {case['id']} passed its time limit of {case['timeout']} s on rank {world.rank}\n")
        hang.flush()
        faulthandler.dump_traceback_later(case["timeout"], exit=True, file=hang)
        buf = io.StringIO()
        t0 = time.perf_counter()
        sys.argv = [case["script"], *case["args"]]
        try:
            with contextlib.redirect_stdout(buf):
                try:
                    runpy.run_path(case["script"], run_name="__main__")
                except SystemExit as exc:  # a script that ends itself early, successfully or not
                    if exc.code not in (0, None):
                        raise
            world.Barrier()
        except BaseException:  # noqa: BLE001 - every failure is reported, then the job ends
            faulthandler.cancel_dump_traceback_later()
            record(case, "fail", error=traceback.format_exc(), stdout=buf.getvalue()[-4000:])
            sys.stdout.flush()
            world.Abort(1)
            os._exit(1)  # MPI_Abort need not end the caller at once: nothing more runs here
        finally:
            sys.argv = saved_argv
        faulthandler.cancel_dump_traceback_later()
        hang.seek(0)
        hang.truncate()
        record(case, "ok", stdout=buf.getvalue(), seconds=round(time.perf_counter() - t0, 3))


if __name__ == "__main__":
    main(sys.argv[1])
