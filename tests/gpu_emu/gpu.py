"""GPU test gating: skip without a GPU, fail instead when ``MPISPARSE_TEST_GPU=1``.

A CI job on a GPU machine sets ``MPISPARSE_TEST_GPU=1`` so that a broken
CuPy install or an invisible device fails the run instead of silently
skipping every GPU test.
"""

from __future__ import annotations

import os

import pytest

ENV = "MPISPARSE_TEST_GPU"


def gpu_required() -> bool:
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def why_no_gpu() -> str | None:
    """None when CuPy imports and sees a CUDA device; otherwise the reason."""
    try:
        import cupy
    except ImportError as e:
        return f"CuPy is not installed ({e})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver
        return f"CuPy sees no CUDA driver ({type(e).__name__}: {e})"
    if n < 1:
        return "CuPy sees no CUDA device"
    return None


def require_gpu():
    """The real ``cupy`` module, or skip (fail with ``MPISPARSE_TEST_GPU=1``)."""
    why = why_no_gpu()
    if why is not None:
        if gpu_required():
            pytest.fail(f"{ENV}=1 but no GPU is usable: {why}")
        pytest.skip(f"needs a CUDA GPU and CuPy: {why} (set {ENV}=1 to make this a failure)")
    import cupy

    return cupy
