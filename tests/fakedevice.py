"""A host array that presents itself as a device array.

It exposes ``__cuda_array_interface__`` (pointing at host memory) and CuPy's
``get(out=)``/``set()`` copy API, so the communicator's device-buffer path
(stream sync, CUDA-aware hand-off or host staging) runs on a CPU-only
machine.  It counts the copies so tests can see which path ran.
"""

import numpy as np


class FakeDeviceArray:
    def __init__(self, host: np.ndarray):
        self._host = np.ascontiguousarray(host)
        self.gets = 0
        self.sets = 0

    @property
    def __cuda_array_interface__(self):
        return {"shape": self._host.shape, "typestr": self._host.dtype.str,
                "data": (self._host.ctypes.data, False), "version": 3, "strides": None,
                "stream": None}

    shape = property(lambda self: self._host.shape)
    dtype = property(lambda self: self._host.dtype)
    size = property(lambda self: self._host.size)

    def get(self, out=None):
        self.gets += 1
        if out is None:
            return self._host.copy()
        out[...] = self._host
        return out

    def set(self, arr):
        self.sets += 1
        self._host[...] = arr

    def copy(self):
        return FakeDeviceArray(self._host.copy())

    def host(self):
        return self._host
