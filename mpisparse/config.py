"""The typed configuration of a run, shared by every rank.

A front end (the CLI, or a library caller) builds one of these per scheme
it runs; the runtimes read them and nothing else.  ``TrainConfig`` is what
``mpisparse train`` runs, ``BenchConfig`` what ``mpisparse bench step``
runs, ``MPConfig`` the pipeline part of a model-parallel training run.

Each has one ``validate(world)`` that checks every field once (ranges,
finite numbers, the scheme and its options, model and data) and then the
runtime's own checks (:mod:`mpisparse.runtimes`: parameter-server options,
pipeline options); it raises ValueError with one line naming the value and
the allowed range.  :func:`check_agreement` compares whole configurations
across ranks at start-up.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from .registry import SchemeBase, scheme_class, validate_density

__all__ = ["AMP_MODES", "BenchConfig", "CLICK_DATASETS", "CLI_ONLY_OPTIONS", "ConfigMismatch", "DATASETS",
           "DIR_DATASETS", "RATING_DATASETS", "LM_DATASETS", "LM_MODELS", "MPConfig",
           "OPTION_FIELDS", "PER_RANK_FIELDS", "RESUME_FREE_FIELDS", "TRAIN_MODELS", "TrainConfig", "check_agreement",
           "config_differences", "default_data", "flat_fields"]

#: the networks ``train`` builds (:data:`mpisparse.models.nets.NETS`) and the datasets it reads
#: (:data:`mpisparse.data.DATASETS`), named here so that checking a configuration needs no torch
TRAIN_MODELS = ("mlp", "cnn", "resnet18", "lstm", "gpt", "dlrm", "ncf")
DATASETS = ("digits", "synthetic", "cifar10", "text", "pydoc", "clicks", "ratings", "criteo", "movielens")
#: the language models and the token-stream datasets they train on (the others: classifiers and their data)
LM_MODELS = ("lstm", "gpt")
LM_DATASETS = ("text", "pydoc")
#: the recommendation data (:mod:`mpisparse.data.recsys`): click logs (``dlrm`` with embedding tables) and implicit
#: feedback (``ncf``); the datasets read from ``--data-dir``
CLICK_DATASETS = ("clicks", "criteo")
RATING_DATASETS = ("ratings", "movielens")
DIR_DATASETS = ("cifar10", "text", "criteo", "movielens")
#: ``--emb-dim``'s default (the DCT paper's DLRM), and the largest ``--emb-rows`` (ids travel as float32)
EMB_DIM = 16
MAX_EMB_ROWS = 2 ** 24
#: ``--gpt-*``: the size of the ``gpt`` model, and its defaults (a tiny model that trains in seconds on a CPU)
GPT_SIZE_DEFAULTS = {"gpt_layers": 2, "gpt_width": 64, "gpt_heads": 4, "gpt_context": 64}
#: where a data-parallel step runs (``--device``): host memory, or each rank's GPU
DEVICES = ("cpu", "cuda")
#: ``--amp``: mixed precision of the forward and backward passes (autocast; ``fp16`` with a loss scaler)
AMP_MODES = ("none", "bf16", "fp16")


# --------------------------------------------------------------------------- field checks
def _int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} is {value!r}; allowed range is an integer >= {low}")


def _number(name: str, value: Any, low: float, high: float = math.inf, *, low_open: bool = False,
            high_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        rng = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open or high == math.inf else ']'}"
        raise ValueError(f"{name} is {value!r}; allowed range is {rng}")


def default_data(model: str) -> str:
    """The dataset ``--model`` trains on when ``--data`` is not given: the bundled CPython prose (``pydoc``)
    for a language model, generated click logs for ``dlrm`` and ratings for ``ncf``, the bundled digits for
    a classifier; none needs a download."""
    return {"dlrm": "clicks", "ncf": "ratings"}.get(model, "pydoc" if model in LM_MODELS else "digits")


def _choice(name: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} is {value!r}; allowed values are {', '.join(allowed)}")


def _bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} is {value!r}; allowed values are True, False")


def _optional_bool(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} is {value!r}; allowed values are True, False, None (decided at start-up)")


def _scheme(name: str, flag: str = "--scheme") -> type[SchemeBase]:
    try:
        return scheme_class(name)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None


def _hierarchical(cls: type[SchemeBase], on: bool) -> None:
    _bool("--hierarchical", on)
    if on and not cls.hierarchical:
        from .registry import SCHEMES

        ok = ", ".join(sorted(n for n, c in SCHEMES.items() if c.hierarchical))
        raise ValueError(f"--hierarchical does not apply to scheme {cls.name!r} (its exchange is not only "
                         f"Allreduce/Bcast/Allgatherv); allowed: {ok}")


def _path_or_none(flag: str, path: str | None) -> None:
    if path is not None and (not isinstance(path, str) or not path):
        raise ValueError(f"{flag} is {path!r}; allowed: a file path")


def _overlap(cls: type[SchemeBase], on: bool, options: dict[str, Any]) -> None:
    """``--overlap`` only for a data-parallel scheme that runs bucket by bucket (its ``bucket_reason``)."""
    _bool("--overlap", on)
    if not on:
        return
    reason = getattr(cls, "bucket_reason", None)
    why = reason(options) if reason is not None else "it is not a data-parallel scheme"
    if why is not None:
        raise ValueError(f"--overlap does not apply to scheme {cls.name!r} ({why}); allowed: dense, topk with "
                         "--layerwise, threshold with --threshold")


def _world(cls: type[SchemeBase], world: int | None) -> None:
    if world is not None and world < cls.min_world_size:
        raise ValueError(f"scheme {cls.name!r} needs at least {cls.min_world_size} ranks; -n is {world}")


def _gpt_size(cfg: Any) -> None:
    """``--gpt-*``: every size >= 1, the width a multiple of the heads, and only with ``--model gpt``."""
    for name in GPT_SIZE_DEFAULTS:
        _int("--" + name.replace("_", "-"), getattr(cfg, name), 1)
    if cfg.gpt_width % cfg.gpt_heads:
        raise ValueError(f"--gpt-width {cfg.gpt_width} is not divisible by --gpt-heads {cfg.gpt_heads}; allowed: a "
                         "width that is a multiple of the number of heads")
    changed = [n for n, v in GPT_SIZE_DEFAULTS.items() if getattr(cfg, n) != v]
    if changed and cfg.model != "gpt":
        raise ValueError(f"--{changed[0].replace('_', '-')} sets the size of --model gpt; --model is {cfg.model!r}")


def _tables(cfg: Any) -> None:
    """``--emb-tables``/``--emb-rows``/``--emb-dim``/``--row-sparse``: positive sizes, and only where a model has
    tables (``dlrm`` on click data, ``ncf`` on ratings); the recommendation data only for those models."""
    for name in ("emb_tables", "emb_rows"):
        if getattr(cfg, name) is not None:
            _int("--" + name.replace("_", "-"), getattr(cfg, name), 1)
    if cfg.emb_rows is not None and cfg.emb_rows > MAX_EMB_ROWS:
        raise ValueError(f"--emb-rows is {cfg.emb_rows}; allowed range is 1..{MAX_EMB_ROWS} (ids travel as float32)")
    _int("--emb-dim", cfg.emb_dim, 1)
    _bool("--row-sparse", cfg.row_sparse)
    if cfg.model == "ncf" and cfg.data not in RATING_DATASETS:
        raise ValueError(f"--model ncf does not fit --data {cfg.data}: it trains on --data "
                         f"{' or '.join(RATING_DATASETS)}")
    if cfg.data in RATING_DATASETS + CLICK_DATASETS and cfg.model != ("ncf" if cfg.data in RATING_DATASETS
                                                                      else "dlrm"):
        need = "ncf" if cfg.data in RATING_DATASETS else "dlrm"
        raise ValueError(f"--data {cfg.data} is recommendation data for --model {need}; --model is {cfg.model!r}")
    given = [n for n in ("emb_tables", "emb_rows") if getattr(cfg, n) is not None]
    given += [n for n, v in (("emb_dim", EMB_DIM), ("row_sparse", True)) if getattr(cfg, n) != v]
    if given and cfg.data not in RATING_DATASETS + CLICK_DATASETS:
        flag = "--no-row-sparse" if given[0] == "row_sparse" else "--" + given[0].replace("_", "-")
        raise ValueError(f"{flag} sets the embedding tables of --model dlrm or ncf on recommendation data "
                         f"({', '.join(CLICK_DATASETS + RATING_DATASETS)}); --model {cfg.model} on --data {cfg.data} "
                         "has none")
    if cfg.data in RATING_DATASETS and cfg.emb_tables not in (None, 2):
        raise ValueError(f"--emb-tables is {cfg.emb_tables}; --data {cfg.data} has 2 tables (users and items)")
    if cfg.data == "movielens" and cfg.emb_rows is not None:
        raise ValueError(f"--emb-rows is {cfg.emb_rows}; --data movielens decides its tables' rows (its users and "
                         "items): drop --emb-rows")


@dataclass
class MPConfig:
    """``--mp-stages``, ``--split-after``, ``--micro-batches`` and the data-parallel scheme inside stages.

    ``dp_density`` None means ``--density``.  ``dp_options`` are the
    data-parallel scheme's own options (e.g. ``lifespan`` for ``dct``).
    """

    stages: int = 2
    split_after: list[str] = field(default_factory=list)
    micro_batches: int = 1
    dp_scheme: str = "dense"
    dp_density: float | None = None
    dp_options: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> MPConfig:
        """Check every field; fills the ``--dp-scheme``'s option defaults into ``dp_options``; returns ``self``."""
        _int("--mp-stages", self.stages, 1)
        _int("--micro-batches", self.micro_batches, 1)
        if not isinstance(self.split_after, (list, tuple)) or not all(
                isinstance(n, str) and n for n in self.split_after):
            raise ValueError(f"--split-after is {self.split_after!r}; allowed: a list of layer names")
        dp = _scheme(self.dp_scheme, "--dp-scheme")
        if self.dp_density is not None:
            validate_density(self.dp_density, "--dp-density")
        self.dp_options = dp.validate_options(dict(self.dp_options))
        return self


@dataclass
class TrainConfig:
    """One training run of one scheme (``mpisparse train``)."""

    model: str = "mlp"
    #: None: the model's default (:func:`default_data`), filled in at construction
    data: str | None = None
    data_dir: str | None = None
    scheme: str = "dense"
    density: float = 0.01
    epochs: int = 20
    batch_size: int = 32
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    bptt: int = 35
    clip: float = 0.0
    seed: int = 0
    memory: bool = True
    checkpoint: str | None = None
    resume: bool = False
    scheme_options: dict[str, Any] = field(default_factory=dict)
    #: per-step ``Scheme.diagnostics()`` into the result (``--diagnostics``; extra communication, untimed)
    diagnostics: bool = False
    #: parameter-server schemes: the last ``servers`` ranks serve
    servers: int = 1
    #: a pipeline (model-parallel) run; None for data-parallel and parameter-server runs
    mp: MPConfig | None = None
    #: ``cpu`` or ``cuda`` (each rank's GPU: the whole step stays on the device)
    device: str = "cpu"
    #: ``--check-collectives``: every collective first checks its counts and dtypes across ranks (debug)
    check_collectives: bool = False
    #: ``--hierarchical``: two-level collectives (within each host, then one rank per host across hosts)
    hierarchical: bool = False
    #: ``--cuda-aware/--no-cuda-aware``: hand device buffers to MPI or stage them; None: decided at start-up
    cuda_aware: bool | None = None
    #: ``--max-skipped-steps``: stop with an error after this many consecutive skipped steps (0: never)
    max_skipped_steps: int = 100
    #: ``--trace``: write the per-rank, per-phase spans of the timed steps here (Chrome trace-event JSON)
    trace: str | None = None
    #: ``--overlap``: exchange bucket by bucket from gradient hooks while backward runs
    #: (``DistributedOptimizer(overlap=True)``; schemes whose math is per element or per layer)
    overlap: bool = False
    #: ``--gpt-layers``, ``--gpt-width``, ``--gpt-heads``, ``--gpt-context``: the ``gpt`` model's size (blocks,
    #: embedding width, attention heads, tokens per window); :data:`GPT_SIZE_DEFAULTS`
    gpt_layers: int = GPT_SIZE_DEFAULTS["gpt_layers"]
    gpt_width: int = GPT_SIZE_DEFAULTS["gpt_width"]
    gpt_heads: int = GPT_SIZE_DEFAULTS["gpt_heads"]
    gpt_context: int = GPT_SIZE_DEFAULTS["gpt_context"]
    #: ``--steps-per-epoch``: each epoch takes at most this many of a rank's batches (0: all of its shard)
    steps_per_epoch: int = 0
    #: ``--emb-tables``, ``--emb-rows``: the recommendation data's tables (categorical features; rows, or hash
    #: buckets, of each); None: the data's own (generated: 8 tables of 1,000 rows; a file: its columns)
    emb_tables: int | None = None
    emb_rows: int | None = None
    #: ``--emb-dim``: the embedding dimension of ``dlrm`` (and its bottom MLP's last width) and of ``ncf``'s GMF
    emb_dim: int = EMB_DIM
    #: ``--row-sparse/--no-row-sparse``: the tables as ``nn.Embedding(sparse=True)``, their gradients exchanged
    #: row-sparse beside the scheme (:mod:`mpisparse.torch.rows`), or dense tables through the scheme
    row_sparse: bool = True
    #: ``--amp``: ``none``, or autocast to ``bf16`` / ``fp16`` (fp16 with a GradScaler, its state checkpointed);
    #: data-parallel schemes; the parameters, the scheme and its error feedback stay float32
    amp: str = "none"

    def __post_init__(self) -> None:
        if self.data is None:
            self.data = default_data(self.model)

    @property
    def seq_len(self) -> int:
        """Tokens per training window of a language model: ``--gpt-context`` for gpt, ``--bptt`` for lstm."""
        return self.gpt_context if self.model == "gpt" else self.bptt

    def validate(self, world: int | None = None) -> TrainConfig:
        """Check every field, then the runtime's own checks; ``world`` is the world size if known.

        Raises ValueError (one line naming the value and the allowed range).
        Fills the scheme's option defaults into ``scheme_options``; returns ``self``.
        """
        _choice("--model", self.model, TRAIN_MODELS)
        _choice("--data", self.data, DATASETS)
        _choice("--device", self.device, DEVICES)
        _choice("--amp", self.amp, AMP_MODES)
        if (self.model in LM_MODELS) != (self.data in LM_DATASETS):
            raise ValueError(f"--model {self.model} does not fit --data {self.data}: the language models "
                             f"({', '.join(LM_MODELS)}) train on --data {' or '.join(LM_DATASETS)}, the classifiers "
                             "on digits/synthetic/cifar10")
        _gpt_size(self)
        _tables(self)
        if self.data in DIR_DATASETS and not self.data_dir:
            raise ValueError(f"--data {self.data} needs --data-dir DIR")
        cls = _scheme(self.scheme)
        validate_density(self.density)
        _int("--epochs", self.epochs, 1)
        _int("--batch-size", self.batch_size, 1)
        _number("--lr", self.lr, 0.0, low_open=True)
        _number("--momentum", self.momentum, 0.0, 1.0, high_open=True)
        _number("--weight-decay", self.weight_decay, 0.0)
        _int("--bptt", self.bptt, 1)
        _int("--steps-per-epoch", self.steps_per_epoch, 0)
        _number("--clip", self.clip, 0.0)
        _int("--seed", self.seed, -2**63)
        _bool("memory", self.memory)
        _bool("--resume", self.resume)
        _bool("--diagnostics", self.diagnostics)
        _bool("--check-collectives", self.check_collectives)
        _hierarchical(cls, self.hierarchical)
        _path_or_none("--trace", self.trace)
        _optional_bool("--cuda-aware", self.cuda_aware)
        _int("--max-skipped-steps", self.max_skipped_steps, 0)
        if self.resume and not self.checkpoint:
            raise ValueError("--resume needs --checkpoint DIR")
        _int("--servers", self.servers, 1)
        self.scheme_options = cls.validate_options(dict(self.scheme_options))
        _overlap(cls, self.overlap, self.scheme_options)
        if self.overlap and self.hierarchical:
            raise ValueError("--overlap exchanges over a plain communicator; --hierarchical is not allowed with it")
        if self.amp != "none" and (getattr(cls, "runtime", None) != "collective" or self.mp is not None):
            raise ValueError(f"--amp {self.amp} applies to data-parallel schemes; scheme {cls.name!r}"
                             f"{' in a pipeline' if self.mp is not None else ''} trains in float32: drop --amp")
        if self.mp is not None:
            self.mp.validate()
            if self.trace is not None:
                raise ValueError("--trace applies to data-parallel training; a pipeline (--mp-stages, "
                                 "--split-after, --micro-batches, --dp-scheme) has no trace")
            if self.steps_per_epoch:
                raise ValueError("--steps-per-epoch applies to data-parallel and parameter-server training; a "
                                 "pipeline (--mp-stages, --split-after, --micro-batches, --dp-scheme) takes every "
                                 "batch")
        _world(cls, world)
        return self


#: ``bench step --gradients``
GRADIENT_SOURCES = ("synthetic", "model")
#: the ``--model`` choices with a trainable net for ``--gradients model`` (:mod:`mpisparse.bench.model_grads`)
MODEL_GRADIENT_MODELS = ("resnet18",)
#: ``bench step --output``: where a data-parallel step writes its update (``CollectiveScheme.step``'s ``out``)
STEP_OUTPUTS = ("own", "gradient")


@dataclass
class BenchConfig:
    """One ``mpisparse bench step`` run of one scheme on model-shaped synthetic gradients."""

    model: str = "resnet18"
    scheme: str = "dense"
    density: float = 0.01
    iters: int = 10
    warmup: int = 2
    seed: int = 0
    memory: bool = True
    scheme_options: dict[str, Any] = field(default_factory=dict)
    diagnostics: bool = False
    #: parameter-server schemes: the last ``servers`` ranks serve
    servers: int = 1
    #: ``cpu`` or ``cuda`` (gradients drawn into each rank's GPU memory, the whole step on the device)
    device: str = "cpu"
    #: ``--check-collectives``: every collective first checks its counts and dtypes across ranks (debug)
    check_collectives: bool = False
    #: ``--hierarchical``: two-level collectives (within each host, then one rank per host across hosts)
    hierarchical: bool = False
    #: ``--cuda-aware/--no-cuda-aware``: hand device buffers to MPI or stage them; None: decided at start-up
    cuda_aware: bool | None = None
    #: ``--rss-at``: steps (counted from the first, warm-up included) after which each rank's resident
    #: memory is recorded (the result's ``rss_bytes_at_step``); empty: none
    rss_at: list[int] = field(default_factory=list)
    #: ``--gradients``: ``synthetic`` (drawn, :mod:`mpisparse.bench.gradgen`) or ``model`` (backward passes of the
    #: trainable net of that name on each rank's own batches, :mod:`mpisparse.bench.model_grads`)
    gradients: str = "synthetic"
    #: ``--trace``: write the per-rank, per-phase spans of the timed steps here (Chrome trace-event JSON)
    trace: str | None = None
    #: ``--separate-wait``: a barrier before every collective, its time in phase ``wait``: the exchange
    #: phases hold the transfer alone (:attr:`mpisparse.mpi.comm.Communicator.wait_timer`)
    separate_wait: bool = False
    #: ``--output``: ``own`` (the scheme's reused output vector) or ``gradient`` (the update written into the
    #: gradient buffer, ``step(grad, out=grad)``, as :class:`mpisparse.torch.DistributedOptimizer` does)
    output: str = "own"
    #: ``--floor``: after each step every rank times one ``e += g`` pass into a buffer of its own (the
    #: result's ``floor``; :class:`mpisparse.bench.step.FloorPass`)
    floor: bool = False
    #: ``--torch-peer``: after the schemes, the same top-k exchange written in plain PyTorch
    #: (:mod:`mpisparse.bench.torch_peer`); every rank must run it, or the others wait in its collectives
    torch_peer: bool = False

    def validate(self, world: int | None = None) -> BenchConfig:
        """Check every field, then the runtime's own checks (a pipeline scheme has no ``bench``).

        Raises ValueError (one line naming the value and the allowed range).
        Fills the scheme's option defaults into ``scheme_options``; returns ``self``.
        """
        from .models.shapes import model_names

        _choice("--model", self.model, model_names())
        _choice("--device", self.device, DEVICES)
        cls = _scheme(self.scheme)
        validate_density(self.density)
        _int("--iters", self.iters, 1)
        _int("--warmup", self.warmup, 0)
        _int("--seed", self.seed, -2**63)
        _bool("memory", self.memory)
        _bool("--diagnostics", self.diagnostics)
        _bool("--check-collectives", self.check_collectives)
        _hierarchical(cls, self.hierarchical)
        _path_or_none("--trace", self.trace)
        _optional_bool("--cuda-aware", self.cuda_aware)
        if not isinstance(self.rss_at, (list, tuple)) or not all(
                isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= self.warmup + self.iters
                for s in self.rss_at):
            raise ValueError(f"--rss-at is {self.rss_at!r}; allowed: steps in [1, {self.warmup + self.iters}] "
                             "(--warmup + --iters)")
        self.rss_at = sorted(set(self.rss_at))
        _choice("--gradients", self.gradients, GRADIENT_SOURCES)
        if self.gradients == "model":
            if self.model not in MODEL_GRADIENT_MODELS:
                raise ValueError(f"--gradients model needs a --model with a trainable net; --model is "
                                 f"{self.model!r}, allowed: {', '.join(MODEL_GRADIENT_MODELS)}")
            if self.device != "cpu":
                raise ValueError(f"--gradients model runs on --device cpu; --device is {self.device!r}")
        _int("--servers", self.servers, 1)
        _bool("--separate-wait", self.separate_wait)
        _choice("--output", self.output, STEP_OUTPUTS)
        _bool("--floor", self.floor)
        _bool("--torch-peer", self.torch_peer)
        if self.output == "gradient" and self.diagnostics:
            raise ValueError("--output gradient overwrites the gradient that --diagnostics re-reads after the "
                             "step; use one or the other")
        self.scheme_options = cls.validate_options(dict(self.scheme_options))
        _world(cls, world)
        return self


# --------------------------------------------------------------------------- agreement across ranks
#: fields that may differ between ranks (a dataset at a node-local path)
PER_RANK_FIELDS = ("data_dir",)

#: options of ``train`` and ``bench step`` that are not configuration fields, and why each may differ
#: between ranks without changing what a rank computes or communicates.  Every other option of these
#: commands must be a field (under its own name or :data:`OPTION_FIELDS`'s), so it is compared by
#: :func:`check_agreement`; a test fails when an option is in neither place.
CLI_ONLY_OPTIONS: dict[str, str] = {
    "nprocs": "-n: each rank checks it against the MPI job's size at start-up",
    "timeout": "--timeout: a bound the launcher enforces; the launching process reads it, ranks do not",
    "json_path": "output only: rank 0 writes the result file",
    "csv_path": "output only: rank 0 writes the per-step log",
    "plot_path": "output only: rank 0 draws the plot",
    "overwrite_checkpoint": "start-up only: checked before MPI starts, on every rank",
    "max_restarts": "launch only: the -n launching process restarts the job; ranks do not read it",
    "min_ranks": "launch only: the -n launching process picks a restart's ranks; ranks do not read it",
    "progress_interval": "output only: how often rank 0 prints a status line off a terminal",
    "no_progress": "output only: rank 0 prints no progress",
    "launcher": "start-up only: it picks the transport (MPI or torch.distributed) before there is one to compare "
                "over; every process of one launcher's job sees the same environment",
}

#: command-line parameter names that fill a configuration field of another name (``a.b``: a nested field)
OPTION_FIELDS: dict[str, str] = {
    "schemes": "scheme", "no_memory": "memory", "checkpoint_dir": "checkpoint",
    "mp_stages": "mp.stages", "split_after": "mp.split_after", "micro_batches": "mp.micro_batches",
    "dp_scheme": "mp.dp_scheme", "dp_density": "mp.dp_density", "step_output": "output",
}

#: ``train`` fields a run resumed from a checkpoint may change: how long it runs, where it writes,
#: and options that only observe or check (everything else must equal the checkpoint's configuration)
RESUME_FREE_FIELDS = ("epochs", "checkpoint", "resume", "data_dir", "diagnostics", "check_collectives",
                      "cuda_aware", "max_skipped_steps", "hierarchical", "trace")


class ConfigMismatch(RuntimeError):
    """Ranks were started with different configurations."""


def _comparable(cfg: Any) -> dict[str, Any]:
    return {k: v for k, v in asdict(cfg).items() if k not in PER_RANK_FIELDS}


def flat_fields(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A configuration dict with nested dicts' keys joined by dots (``mp.stages``)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat_fields(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(a: dict[str, Any], b: dict[str, Any], *, ignore: Sequence[str] = ()) -> list[str]:
    """Names of the (nested: ``mp.stages``, ``scheme_options.lifespan``) fields whose values differ."""
    fa = {k: v for k, v in flat_fields(a).items() if k.split(".")[0] not in ignore}
    fb = {k: v for k, v in flat_fields(b).items() if k.split(".")[0] not in ignore}
    return [k for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


def check_agreement(comm, configs: Sequence[Any]) -> None:
    """Fail on every rank, naming the differences, if ranks disagree on ``configs``.

    Every field of every configuration is compared (all of
    :func:`dataclasses.asdict` but :data:`PER_RANK_FIELDS`), so a new
    option is compared without anyone remembering to add it here.
    """
    mine = [_comparable(c) for c in configs]
    everyone = comm.allgather_obj(mine)
    diffs: list[str] = []
    for r, other in enumerate(everyone[1:], start=1):
        if len(other) != len(everyone[0]):
            diffs.append(f"schemes: rank 0 has {[c.get('scheme') for c in everyone[0]]!r}, "
                         f"rank {r} has {[c.get('scheme') for c in other]!r}")
            continue
        for c0, cr in zip(everyone[0], other):
            f0, fr = flat_fields(c0), flat_fields(cr)
            for k in config_differences(c0, cr):
                line = f"{k}: rank 0 has {f0.get(k)!r}, rank {r} has {fr.get(k)!r}"
                if line not in diffs:
                    diffs.append(line)
    if diffs:
        raise ConfigMismatch("ranks disagree on the configuration: " + "; ".join(diffs[:5]))
