"""mpisparse: sparsified gradient communication over MPI.

The package imports on any machine: mpi4py, torch and CuPy are imported
lazily, by the modules that need them, when they need them.
"""

__version__ = "0.1.0"
