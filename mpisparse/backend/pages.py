"""A rank's resident memory around its compiled loops: load them first, then unmap LLVM's code.

numba's first call of a cached loop loads it through LLVM (llvmlite's
``libllvmlite.so``, about 150 MiB of code and read-only data): with the
import, LLVM's pages mapped into a rank reach about 67 MiB of its resident
memory (``VmRSS``), and they stay mapped although a step never runs LLVM
again.  They are clean pages of a file (the page cache holds them, shared by
every rank on the host), so dropping them from the rank's page tables loses
nothing: a later compilation faults back the pages it reads.

:func:`settle` is what a rank calls once its scheme exists and before its
first step: the scheme loads its loops on tiny arrays
(:meth:`mpisparse.schemes.base.CollectiveScheme.warm_up`), so their loading
happens before the full-size buffers exist instead of on top of them, and
then :func:`release_llvm_pages` drops LLVM's pages.  Measured in
``docs/performance.md`` (Memory).

Linux only (``/proc/self/smaps`` and ``madvise``); elsewhere, and with
``MPISPARSE_RELEASE_PAGES=0``, it does nothing.  What is dropped is limited to
mappings of llvmlite's library that cannot hold private data: no write
permission and no anonymous (copied-on-write) pages, so ``MADV_DONTNEED``
only unmaps pages that the file still holds unchanged.
"""

from __future__ import annotations

import os
import sys

__all__ = ["enabled", "llvm_code_ranges", "release_llvm_pages", "settle"]

#: madvise(2) advice: drop the pages from this process (they are read again from the file on access)
MADV_DONTNEED = 4
#: the part of a mapping's path that names llvmlite's LLVM library
LLVM_LIBRARY = "libllvmlite"


def enabled(env=os.environ) -> bool:
    """Whether :func:`release_llvm_pages` may act: Linux, and ``MPISPARSE_RELEASE_PAGES`` not 0."""
    return sys.platform.startswith("linux") and env.get("MPISPARSE_RELEASE_PAGES", "1").strip() != "0"


def llvm_code_ranges(smaps: str, library: str = LLVM_LIBRARY) -> list[tuple[int, int]]:
    """``(start, end)`` addresses of the mappings in ``smaps`` (the text of ``/proc/<pid>/smaps``) whose path
    contains ``library``, without write permission and with no anonymous pages: the ones whose pages are
    all the file's own."""
    ranges: list[tuple[int, int]] = []
    cur: tuple[int, int] | None = None
    for line in smaps.splitlines():
        parts = line.split()
        if not parts:
            continue
        if not parts[0].endswith(":") and "-" in parts[0]:  # a mapping's header: range perms offset dev inode [path]
            path = parts[5] if len(parts) > 5 else ""
            lo, hi = parts[0].split("-")
            cur = (int(lo, 16), int(hi, 16)) if library in path and "w" not in parts[1] else None
        elif parts[0] == "Anonymous:" and cur is not None:
            if int(parts[1]) == 0:
                ranges.append(cur)
            cur = None
    return ranges


def release_llvm_pages(env=os.environ) -> int:
    """Drop the resident pages of llvmlite's library from this process (``madvise(MADV_DONTNEED)`` on
    :func:`llvm_code_ranges`); returns the bytes of address range advised (0 where not :func:`enabled`,
    where llvmlite is not loaded, or where the system refuses)."""
    if not enabled(env):
        return 0
    try:
        with open("/proc/self/smaps") as f:
            ranges = llvm_code_ranges(f.read())
    except OSError:
        return 0
    if not ranges:
        return 0
    import ctypes

    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    done = 0
    for lo, hi in ranges:
        if madvise(lo, hi - lo, MADV_DONTNEED) == 0:
            done += hi - lo
    return done


def settle(*schemes) -> int:
    """Before a rank's first step: load every one of ``schemes``' compiled loops (its ``warm_up``, where it
    has one; ``DistributedOptimizer(overlap=True)`` has one scheme per bucket), then
    :func:`release_llvm_pages` once; returns the bytes released.  Results do not change."""
    for scheme in schemes:
        warm = getattr(scheme, "warm_up", None)
        if warm is not None:
            warm()
    return release_llvm_pages()
