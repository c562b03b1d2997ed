"""The MPI runtime: the communicator (the only mpi4py caller), its two-level form, the launcher,
signals, device binding and `mpisparse info`."""
