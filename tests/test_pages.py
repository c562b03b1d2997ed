"""A rank's compiled loops loaded before its buffers, and LLVM's code pages unmapped (mpisparse.backend.pages)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import SelfComm
from mpisparse.backend import pages
from mpisparse.backend import compiled
from mpisparse.backend.fusion import FusionLayout
from mpisparse.schemes import create

needs_numba = pytest.mark.skipif(not compiled.available(),
                                 reason="numba is not installed (pip install mpisparse[fast])")
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps and madvise: Linux")

ROOT = Path(__file__).resolve().parents[1]
COMPILED_SCHEMES = ["topk", "threshold", "cltk", "deft", "gtopk", "dgc", "dct"]
LAYOUT = [("a", (300, 400)), ("b", (1000,)), ("c", (50, 30)), ("d", (7, 11, 3))]

SMAPS = """\
7f0000000000-7f0000400000 r--p 00000000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                4096 kB
Anonymous:             0 kB
7f0000400000-7f0005000000 r-xp 00400000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Size:              77824 kB
Rss:               52224 kB
Anonymous:             0 kB
7f0005000000-7f0005200000 r--p 05000000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                1024 kB
Anonymous:          1024 kB
7f0005200000-7f0005300000 rw-p 05200000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Anonymous:             0 kB
7f0006000000-7f0006100000 r-xp 00000000 08:01 12 /usr/lib/libc.so.6
Anonymous:             0 kB
7f0007000000-7f0008000000 rw-p 00000000 00:00 0
Anonymous:         16384 kB
"""


def test_llvm_code_ranges_are_the_librarys_read_only_unmodified_mappings():
    # the relocated read-only part (anonymous pages), the writable data and other libraries stay
    assert pages.llvm_code_ranges(SMAPS) == [(0x7F0000000000, 0x7F0000400000), (0x7F0000400000, 0x7F0005000000)]
    assert pages.llvm_code_ranges(SMAPS, library="libc.so") == [(0x7F0006000000, 0x7F0006100000)]
    assert pages.llvm_code_ranges("") == []


def test_release_is_a_no_op_off_linux_or_when_switched_off(monkeypatch):
    monkeypatch.setattr(pages.sys, "platform", "darwin")
    assert not pages.enabled() and pages.release_llvm_pages() == 0
    monkeypatch.setattr(pages.sys, "platform", "linux")
    assert not pages.enabled({"MPISPARSE_RELEASE_PAGES": "0"})
    assert pages.release_llvm_pages({"MPISPARSE_RELEASE_PAGES": "0"}) == 0
    assert pages.enabled({})


def test_settle_calls_the_schemes_warm_up_then_releases(monkeypatch):
    calls = []
    monkeypatch.setattr(pages, "release_llvm_pages", lambda: calls.append("release") or 7)

    class Scheme:
        def warm_up(self):
            calls.append("warm")

    assert pages.settle(Scheme()) == 7 and calls == ["warm", "release"]
    calls.clear()
    assert pages.settle(Scheme(), object(), Scheme()) == 7  # a scheme per bucket: every one, one release
    assert calls == ["warm", "warm", "release"]
    assert pages.settle(object()) == 7  # no warm_up: only the release


def test_warm_up_names_are_checked():
    with pytest.raises(ValueError, match="compiled kernel 'nope' is not one of fused, select"):
        compiled.warm_up(["nope"])


_RSS_SCRIPT = """
import numpy as np
from mpisparse.backend import pages
from mpisparse.backend import compiled
compiled.warm_up(["fused"])
def resident():
    text = open("/proc/self/smaps").read()
    ranges = set(pages.llvm_code_ranges(text))
    kib, cur = 0, None
    for line in text.splitlines():
        p = line.split()
        if p and not p[0].endswith(":") and "-" in p[0]:
            lo, hi = p[0].split("-")
            cur = (int(lo, 16), int(hi, 16)) in ranges
        elif p and p[0] == "Rss:" and cur:
            kib += int(p[1])
    return kib
before = resident()
released = pages.release_llvm_pages()
after = resident()
compiled.warm_up(["fused"])  # a loaded loop runs without LLVM
print(before, released, after, resident())
"""


@needs_numba
@linux
def test_release_unmaps_llvms_pages_and_the_loops_still_run():
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "MPISPARSE_RELEASE_PAGES": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    before, released, after, again = map(int, out.stdout.split())
    assert before > 8 * 1024 and released > 0  # KiB: LLVM's code was mapped in, then released ...
    assert after < 1024 and again < 1024  # ... and the loaded loop did not fault it back


_SIGNATURES_SCRIPT = """
import sys
sys.path.insert(0, "tests")
import numba, numpy as np
from conftest import SelfComm
from mpisparse.backend import compiled, compiled_compensate, compiled_segments
from mpisparse.backend.fusion import FusionLayout
from mpisparse.schemes import create
def signatures():
    return {(m.__name__, k, str(s)) for m in (compiled, compiled_segments, compiled_compensate)
            for k, v in vars(m).items() if isinstance(v, numba.core.registry.CPUDispatcher) for s in v.signatures}
layout = FusionLayout(%r)
sch = create(%r, SelfComm(), layout, 0.01, seed=0)
warm = sch.warm_up()
loaded = signatures()
rng = np.random.default_rng(1)
for _ in range(3):
    sch.step((rng.standard_normal(layout.n) * 0.1).astype(np.float32))
print(len(warm), len(loaded), sorted(signatures() - loaded))
"""


@needs_numba
@pytest.mark.parametrize("scheme", COMPILED_SCHEMES)
def test_warm_up_loads_every_loop_the_steps_call(scheme):
    """In a fresh process: after the scheme's warm-up its steps load no further compiled loop (a loop
    missing from its ``compiled_kernels`` would be loaded inside the first step, on top of the buffers)."""
    out = subprocess.run([sys.executable, "-c", _SIGNATURES_SCRIPT % (LAYOUT, scheme)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "MPISPARSE_FUSED": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    warm, loaded, missing = out.stdout.strip().split(" ", 2)
    assert int(warm) > 0 and int(loaded) > 0
    assert missing == "[]", f"{scheme}'s steps loaded loops its warm-up did not: {missing}"


@needs_numba
@pytest.mark.parametrize("scheme", COMPILED_SCHEMES)
def test_warm_up_changes_no_result(scheme, monkeypatch):
    monkeypatch.setenv("MPISPARSE_FUSED", "1")
    layout = FusionLayout(LAYOUT)
    rng = np.random.default_rng(3)
    grads = [(rng.standard_normal(layout.n) * 0.1).astype(np.float32) for _ in range(3)]

    def run(warm):
        sch = create(scheme, SelfComm(), layout, 0.01, seed=0)
        if warm:
            assert sch.warm_up()
        return [sch.step(g.copy()).copy() for g in grads]

    for a, b in zip(run(False), run(True)):
        assert np.array_equal(a, b)


def test_schemes_without_compiled_loops_warm_nothing():
    layout = FusionLayout(LAYOUT)
    for scheme in ("dense", "randomk"):
        assert create(scheme, SelfComm(), layout, 0.01, seed=0).warm_up() == ()


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
def test_unique_count_of_host_indices_is_numpys(dtype):
    """The sort-and-count of host integer arrays (no np.unique: it left 18 MiB resident) counts as np.unique."""
    from mpisparse import backend

    rng = np.random.default_rng(5)
    for x in (np.empty(0, dtype), rng.integers(0, 50, 1000).astype(dtype), rng.integers(0, 9, (4, 6)).astype(dtype),
              np.arange(10, dtype=dtype)[:1]):
        assert backend.unique_count(x) == np.unique(x).size
    assert backend.unique_count(np.array([1.0, np.nan, np.nan, 1.0])) == np.unique(np.array([1.0, np.nan, np.nan])).size
