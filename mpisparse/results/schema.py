"""The typed result of one run: :class:`RunResult` and its JSON schema version."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["EXCHANGE_KEYS", "PS_KEYS", "RUNTIME_NAMES", "RunResult", "SCHEMA_VERSION"]

#: the version of the JSON layout :meth:`RunResult.to_dict` writes.  1: the first layout;
#: 2: adds ``provenance`` (files of version 1 are read back with ``provenance`` None)
SCHEMA_VERSION = 2

#: the runtimes a result can come from (see :mod:`mpisparse.runtimes`)
RUNTIME_NAMES = ("collective", "ps", "mp")

#: top-level JSON keys of a parameter-server run (held in :attr:`RunResult.ps`)
PS_KEYS = ("servers", "workers", "ps_mode", "shards", "communications", "bytes_up_per_communication",
           "bytes_down_per_communication", "staleness_histogram", "staleness_mean", "phases_worker",
           "phases_server", "setup_bytes", "get_bytes", "final_bytes", "worker_extra")

#: top-level JSON keys ``bench exchange`` adds (held in :attr:`RunResult.exchange`)
EXCHANGE_KEYS = ("exchange_seconds", "exchange_seconds_mean_over_ranks", "exchange_phases", "bytes_per_selected")

_OPTIONAL = ("skipped_steps", "metrics", "diagnostics", "k", "layers", "gradient_buffer_bytes",
             "peak_rss_bytes_per_rank", "provenance", "staging_copies_per_step", "rss_bytes_at_step",
             "hierarchy", "floor", "wire_dtype", "overlap")


@dataclass
class RunResult:
    """One run of one scheme (``mpisparse train`` or ``bench step``), the same on every rank.

    This is the schema of the JSON result (``--json``): :meth:`to_dict`
    writes these fields under the same names, leaving out optional fields
    that are None; the runtime-specific blocks :attr:`ps` and
    :attr:`exchange` are written as top-level keys, :attr:`mp` as the
    ``mp`` key.  Times are seconds, bytes are payload bytes (what MPI
    moves; headers of the library's own protocol included).

    Always present
    --------------
    ``schema_version``
        :data:`SCHEMA_VERSION` of the writer (an int).
    ``scheme``
        the scheme's registered name (``--scheme``).
    ``runtime``
        ``collective`` (data parallel), ``ps`` (parameter server) or
        ``mp`` (pipeline model parallel).
    ``world_size``
        ranks in the job (servers and workers; all stages and replicas).
    ``density_target``
        ``--density``: fraction of elements a rank means to send, in (0, 1].
    ``density_actual``
        what was sent, mean over timed steps.  Collective: globally
        selected distinct indices / ``n``.  Parameter server: mean over
        workers and pushes of the fraction of ``n`` pushed.  Pipeline: kept
        activation entries / entries over all splits and steps.
    ``bytes_sent_per_rank``
        mean bytes a rank sends per step, max over ranks (parameter server:
        per communication, a worker's push or a server's answer).
    ``phases``
        phase name -> mean seconds per step, max over ranks of each rank's
        mean; only the phases the run has, from the vocabulary of
        :data:`mpisparse.results.timing.PHASES`.
    ``phases_mean_over_ranks``
        the same phases, mean over ranks (a stacked bar of these adds up to
        the mean rank's step).
    ``step_seconds``, ``step_seconds_mean_over_ranks``
        mean seconds of a whole step, max (the slowest rank: the step
        waits for it) and mean over ranks.
    ``n``
        elements of the gradient (parameters of the model).
    ``config``
        every option of the run (the typed configuration as a dict, the
        scheme's resolved options as ``scheme.NAME`` in ``train``, by name
        in ``bench step``).

    Present when known
    ------------------
    ``skipped_steps``
        ``train``: steps skipped because a gradient, the exchanged update
        or the updated parameters were not finite (the parameters are left
        as they were; collective: the ranks agree; parameter server: summed
        over workers; pipeline: max over ranks).  ``--max-skipped-steps``
        consecutive ones stop the run with an error.
    ``metrics``
        ``train``: ``{"final": record, "per_epoch": [record, ...]}``; a
        record has ``epoch``, ``iteration`` (steps so far),
        ``wall_seconds``, ``train_loss`` (mean over ranks or workers) and
        ``test_loss`` with ``test_accuracy`` (classifiers) or
        ``test_perplexity`` (language models).
    ``diagnostics``
        ``--diagnostics``: ``density_per_step`` (list), ``mean`` (name ->
        mean over steps) and ``per_step`` (the scheme's diagnostics per
        step; ``train`` adds each step's ``iteration``).
    ``k``
        elements a rank selects per step (``bench step``).
    ``layers``
        layers of the gradient (``bench step``).
    ``gradient_buffer_bytes``
        bytes of one float32 gradient buffer, ``4 n`` (``bench step``).
    ``peak_rss_bytes_per_rank``
        peak resident memory of a rank, max over ranks (``bench step``).
    ``staging_copies_per_step``
        ``--device cuda`` (collective runtime): what went through host
        memory because the MPI is not CUDA-aware, per step of a rank, max
        over ranks: ``{"d2h", "h2d", "d2h_bytes", "h2d_bytes"}`` (copies of
        exchange buffers into and out of the communicator's pinned staging
        buffers).  All 0 with a CUDA-aware MPI.  Scalar reads a scheme makes
        on purpose (a threshold, a count) are not staging and not counted.

    ``rss_bytes_at_step``
        ``{"step": bytes}``, a rank's resident memory right after that
        step, max over ranks; compare two steps to see whether memory
        grows with steps.  ``bench step --rss-at``: the steps asked for
        (warm-up steps counted); data-parallel ``train``: the last step of
        each epoch of this run.
    ``phases_slowest_step``
        data-parallel runs: phase name (and ``step``) -> mean over timed
        steps of that step's max over ranks: the slowest worker of each
        iteration, the DEFT paper's Fig. 7 measure (``phases`` is the max
        over ranks of each rank's mean, which spreads a phase that only
        one rank per step runs, CLT-k's leader selection, over the steps).
    ``phases_median_step``
        the same with the median over timed steps instead of the mean:
        a typical step's slowest worker; one step in which the operating
        system took a rank's core away (a shared machine) does not move it.
    ``floor``
        ``bench step --floor``: one ``e += g`` pass over the gradient's
        length, every rank at once after each step, timed in the same job
        as the step's phases: ``seconds`` (each rank's mean, max over
        ranks) and ``seconds_median`` (each step's max over ranks, median
        over steps).  A step's compute (``compensate + select + update``)
        divided by it is the step's distance from its floor.
    ``wire_dtype``, ``overlap``
        data-parallel runs: the values' type on the wire (``float32``,
        ``float16``, ``bfloat16``; absent for a scheme that sends float32
        only) and whether the exchange ran bucket by bucket during backward
        (``train --overlap``): what names a dense baseline ("dense
        (float16, overlapped)", :attr:`RunResult.label`).
    ``hierarchy``
        ``--hierarchical`` runs (``bench step``): ``hosts``, ``ranks_per_host``
        (a list, one entry per host) and ``cross_host_bytes_per_step`` (the
        bytes leaving their host per timed step, all hosts together, by the
        byte model of :mod:`mpisparse.mpi.comm`).

    Provenance (schema version 2 on)
    --------------------------------
    ``provenance``
        what produced the result, where, when and how; every builder adds
        it (one ``allgather``, see :mod:`mpisparse.results.provenance`):
        ``schema_version``; ``toolkit`` (``name``, ``version``,
        ``git_commit`` or None); ``mpi`` (``library``, ``version``,
        ``library_version``, ``standard``); ``versions`` (``python``,
        ``mpi4py``, ``numpy``, ``torch``, ``cupy``: None when not
        installed); ``world_size``; ``hosts`` (host name -> its ranks);
        ``gpus`` (``[{"rank", "host", "device", "name"}]``, empty without
        GPUs); ``cuda_aware`` and ``cuda_aware_how``; ``timestamp_utc``
        (ISO 8601); ``argv`` and ``command_line`` (rank 0's).  Absent in
        files of schema version 1.

    Runtime-specific blocks
    -----------------------
    ``ps`` (parameter server; written as top-level keys)
        ``servers``, ``workers``, ``ps_mode`` (``sync`` / ``async``),
        ``shards`` (``[lo, hi)`` per server), ``communications`` (pushes of
        all workers), ``bytes_up_per_communication`` and
        ``bytes_down_per_communication`` (mean over workers),
        ``staleness_histogram`` (``{"staleness": pushes}`` summed over
        servers) and ``staleness_mean``, ``phases_worker`` and
        ``phases_server`` (``{phase: {"mean", "max"}}`` over workers / over
        servers; a server's phases are per push served), ``setup_bytes``,
        ``get_bytes``, ``final_bytes`` (not part of any communication) and,
        in ``train``, ``worker_extra`` (per worker, e.g. DGS's
        ``final_gap``).  Built by :func:`mpisparse.ps.results.gather_ps_result`.
    ``mp`` (pipeline; the ``mp`` key)
        ``stages``, ``replicas``, ``micro_batches``, ``threshold``, the
        split (``split_after``, ``cuts``, ``stage_parameters``, ...),
        ``splits`` (per split: bytes forward / backward per step and what a
        dense pipeline sends, compression, occupancy, mask encodings,
        ``tau_last``), ``bytes_forward``, ``bytes_backward``,
        ``dense_bytes``, ``compression_factor``, ``phases_per_stage``,
        ``dp_scheme``, ``dp_density``, ``dp_density_actual``,
        ``dp_bytes_sent_per_rank``.  Built by
        :meth:`mpisparse.mp.runtime.MPTrainer.result`.
    ``exchange`` (``bench exchange``; written as top-level keys)
        ``exchange_seconds`` and ``exchange_seconds_mean_over_ranks`` (sum
        of the exchange phases), ``exchange_phases``, ``bytes_per_selected``
        (see :mod:`mpisparse.bench.exchange`).
    ``extra``
        any other top-level key a reader added (e.g. ``baseline`` and
        ``speedup_over_baseline`` of ``bench scaling``); written as is.
    """

    scheme: str
    runtime: str
    world_size: int
    density_target: float
    density_actual: float
    bytes_sent_per_rank: float
    phases: dict[str, float]
    phases_mean_over_ranks: dict[str, float]
    step_seconds: float
    step_seconds_mean_over_ranks: float
    n: int
    config: dict[str, Any]
    skipped_steps: int | None = None
    metrics: dict[str, Any] | None = None
    diagnostics: dict[str, Any] | None = None
    k: int | None = None
    layers: int | None = None
    gradient_buffer_bytes: int | None = None
    peak_rss_bytes_per_rank: int | None = None
    staging_copies_per_step: dict[str, float] | None = None
    rss_bytes_at_step: dict[str, int] | None = None
    hierarchy: dict[str, Any] | None = None
    phases_slowest_step: dict[str, float] | None = None
    phases_median_step: dict[str, float] | None = None
    floor: dict[str, float] | None = None
    wire_dtype: str | None = None
    overlap: bool | None = None
    # -- provenance (schema version 2)
    provenance: dict[str, Any] | None = None
    # -- runtime-specific blocks
    ps: dict[str, Any] | None = None
    mp: dict[str, Any] | None = None
    exchange: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIME_NAMES:
            raise ValueError(f"runtime {self.runtime!r} is not one of {', '.join(RUNTIME_NAMES)}")

    # ------------------------------------------------------------ views of the fields
    @property
    def label(self) -> str:
        """The scheme with what sets its baseline apart: ``dense (float16, overlapped)``; the bare name for
        float32 values exchanged after backward."""
        marks = [self.wire_dtype] if self.wire_dtype not in (None, "float32") else []
        marks += ["overlapped"] if self.overlap else []
        return f"{self.scheme} ({', '.join(marks)})" if marks else self.scheme

    @property
    def final_metrics(self) -> dict[str, Any]:
        """``metrics["final"]`` (empty for a run without metrics)."""
        return (self.metrics or {}).get("final", {})

    def phase_table(self, names=None) -> dict[str, dict[str, float]]:
        """``{phase: {"mean", "max"}}`` plus ``step``: what :func:`mpisparse.results.format_table` prints."""
        names = self.phases if names is None else names
        return {**{k: {"mean": self.phases_mean_over_ranks.get(k, 0.0), "max": self.phases.get(k, 0.0)}
                   for k in names},
                "step": {"mean": self.step_seconds_mean_over_ranks, "max": self.step_seconds}}

    # ------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The JSON object (see the class docstring): plain dicts, lists and numbers."""
        out: dict[str, Any] = {"schema_version": self.schema_version}
        for f in fields(self):
            if f.name in ("schema_version", "ps", "exchange", "extra"):
                continue
            v = getattr(self, f.name)
            if v is None and (f.name in _OPTIONAL or f.name == "mp"):
                continue
            out[f.name] = v
        out.update(self.ps or {})
        out.update(self.exchange or {})
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> "RunResult":
        """A result read back from its JSON object (files without ``schema_version`` or ``runtime``,
        written before these keys existed, have the same layout)."""
        version = int(obj.get("schema_version", SCHEMA_VERSION))
        if not 1 <= version <= SCHEMA_VERSION:
            raise ValueError(f"result schema_version {version} is not in the range this reader knows "
                             f"(1 to {SCHEMA_VERSION})")
        d = dict(obj)
        d.pop("schema_version", None)
        runtime = d.pop("runtime", None) or ("ps" if "ps_mode" in d else "mp" if "mp" in d else "collective")
        names = {f.name for f in fields(cls)} - {"schema_version", "runtime", "ps", "exchange", "extra"}
        kw = {k: d.pop(k) for k in list(d) if k in names}
        ps = {k: d.pop(k) for k in PS_KEYS if k in d}
        exchange = {k: d.pop(k) for k in EXCHANGE_KEYS if k in d}
        return cls(runtime=runtime, ps=ps or None, exchange=exchange or None, extra=d, schema_version=version,
                   **kw)
