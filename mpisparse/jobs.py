"""SLURM job scripts from the bundled templates (the command is ``mpisparse jobs list|render|examples``).

The templates live in ``mpisparse/templates/jobs/`` (shipped in the wheel)
and are Jinja2 (``StrictUndefined``: a name a template uses but is not
given is an error; comments are ``{## ##}`` so bash's ``${#array[@]}`` is
plain text); ``jobs/`` at the top of the repository holds scripts
rendered from them by ``mpisparse jobs examples jobs/`` (a test keeps those
up to date).  :func:`render` is a pure function but for ``bash -n``.

What :func:`render` checks before it returns a script:

* the values (:func:`resolve`): times, counts, names, paths, densities,
  ``--gres`` or ``--gpus-per-node`` (not both), ``--sbatch`` lines;
* ``--args`` against the command the template runs, with click's own parser
  on that command (``mpisparse jobs render`` passes the checker,
  :func:`mpisparse.cli.jobs.args_checker`; this module does not import the
  CLI): an option ``mpisparse train`` (or ``bench step``) does not have, a
  missing value, a value given to a flag, a choice that is not one of the
  choices, or a stray argument is a one-line error naming it;
* the ``#SBATCH`` header (:func:`check_header`): every line is
  ``#SBATCH --option[=value]`` and comes before the first command (sbatch
  reads no ``#SBATCH`` line after it);
* the whole script with ``bash -n`` (when bash is there).

What every script does (the templates' comments say the same):

1. ``#SBATCH`` lines from the options, ``--open-mode=append`` and
   ``--signal=B:USR1@S``: S seconds before the time limit SLURM sends USR1 to
   the batch script only.  ``--requeue`` where the script requeues itself
   (``train`` and ``sweep``, always; ``bench`` when ``--requeue`` is given).
2. The job step runs ``srun --mpi=pmix --kill-on-bad-exit=1`` (one failing rank
   ends the step) or ``mpirun`` in the background; the script's USR1 trap sends
   USR1 (train) or TERM (benchmarks) to the launcher, which hands it to the ranks.
3. ``train`` writes a checkpoint on USR1 and exits 0; the script then runs
   ``scontrol requeue``; the requeued job finds ``CHECKPOINT/LATEST`` and adds
   ``--resume``.  The sweep skips the points whose JSON exists, so it goes on
   after a requeue the same way.
4. One GPU per rank: ``#SBATCH --gpus-per-node=G`` (or ``--gres=gpu:G``) and,
   per rank, the local rank's entry of the node's ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import functools
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable

from .registry import validate_density

#: what is left of a Jinja2 expression or tag in a rendered script (none may be)
PLACEHOLDER = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{##")
#: one ``#SBATCH`` line: a long option, with a value after ``=`` or none
SBATCH_LINE = re.compile(r"^#SBATCH --[A-Za-z][A-Za-z0-9-]*(=\S.*)?$")
LAUNCHERS = ("srun", "mpirun")
# SLURM's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_TIME = re.compile(r"^(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)$")
_SAFE_PATH = re.compile(r'^[^"`\\\n]+$')  # goes between double quotes; $VARIABLES expand at run time
_JOB_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")
_WORD = re.compile(r"^[A-Za-z0-9_.+:-]+$")
# SLURM's GRES: name[:type][:count], comma-separated (gpu:4, gpu:a100:4, gpu:2,nvme:1)
_GRES = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(:[A-Za-z0-9_.-]+)*(,[A-Za-z][A-Za-z0-9_]*(:[A-Za-z0-9_.-]+)*)*$")
# options the header sets itself (not allowed in --sbatch)
_HEADER_OPTIONS = ("job-name", "account", "partition", "time", "nodes", "ntasks-per-node", "gpus-per-node", "gres",
                   "output", "open-mode", "signal", "requeue", "no-requeue")


class RenderError(ValueError):
    """A template cannot be rendered with the given values (the message is one line)."""


@dataclass(frozen=True)
class Param:
    """One template parameter: option name, default (None = optional, unset), help."""

    name: str
    help: str
    default: Any = None
    required: bool = False


@dataclass(frozen=True)
class Template:
    name: str
    description: str
    command: str  # the mpisparse command the job runs
    step_signal: str  # what the USR1 trap sends to the running job step
    params: tuple[Param, ...] = field(default_factory=tuple)
    requeues: bool = False  # requeues itself at the time limit: always #SBATCH --requeue

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


COMMON = (
    Param("nodes", "Number of nodes (#SBATCH --nodes).", required=True),
    Param("time", "Time limit, SLURM format (M, H:M:S, D-H:M:S).", required=True),
    Param("account", "#SBATCH --account (left out when not given: the site's default)."),
    Param("partition", "#SBATCH --partition (left out when not given)."),
    Param("tasks_per_node", "Ranks per node (default: the GPUs per node, else 1)."),
    Param("gpus_per_node", "GPUs per node; one per rank (0: CPU-only job).", default=0),
    Param("gres", "#SBATCH --gres instead of --gpus-per-node (e.g. gpu:4 or gpu:a100:4; its GPU count binds "
                  "one GPU per rank)."),
    Param("sbatch", "An extra '#SBATCH --option[=value]' line (e.g. --sbatch --constraint=a100); repeatable.",
          default=()),
    Param("requeue", "#SBATCH --requeue (train and sweep requeue themselves at the time limit and always have "
                     "it; bench only when asked).", default=False),
    Param("setup", "A line of environment set-up (module load, source venv/bin/activate); repeatable.",
          default=()),
    Param("launcher", "srun (PMI via --srun-mpi) or mpirun.", default="srun"),
    Param("srun_mpi", "srun --mpi=TYPE (pmix, pmi2, ...; 'default' leaves it to the site's MpiDefault).",
          default="pmix"),
    Param("launcher_args", "Extra options for srun/mpirun (e.g. '--cpu-bind=cores').", default=""),
    Param("job_name", "#SBATCH --job-name (default: mpisparse-NAME)."),
    Param("output", "#SBATCH --output (default: %x-%j.out, appended to across requeues).", default="%x-%j.out"),
    Param("signal_before", "Seconds before the time limit at which SLURM sends USR1.", default=120),
)

TEMPLATES: dict[str, Template] = {t.name: t for t in (
    Template(
        "train", "mpisparse train across the allocation; checkpoints, requeues before the time limit, resumes.",
        command="train", step_signal="USR1", requeues=True,
        params=COMMON + (
            Param("args", "The mpisparse train arguments, e.g. '--model resnet18 --data cifar10 "
                          "--data-dir $SCRATCH/cifar10 --scheme deft --density 0.01'.", required=True),
            Param("checkpoint_dir", "Checkpoint directory (the requeued job resumes from it).",
                  default="$SLURM_SUBMIT_DIR/checkpoints/$SLURM_JOB_NAME-$SLURM_JOB_ID"),
        )),
    Template(
        "bench", "mpisparse bench step once across the whole allocation; one JSON result.",
        command="bench step", step_signal="TERM",
        params=COMMON + (
            Param("args", "The mpisparse bench step arguments.",
                  default="--model resnet50 --scheme dense --scheme topk --density 0.001 --iters 20"),
            Param("results", "Directory for the JSON result.",
                  default="$SLURM_SUBMIT_DIR/results/$SLURM_JOB_NAME-$SLURM_JOB_ID"),
        )),
    Template(
        "sweep", "Scaling sweep: bench step on 1, 2, 4, ... nodes and the whole allocation, per density; "
                 "requeues and skips finished points.",
        command="bench step", step_signal="TERM", requeues=True,
        params=COMMON + (
            Param("args", "The mpisparse bench step arguments (without --density).",
                  default="--model resnet50 --scheme dense --scheme topk --scheme cltk --iters 20"),
            Param("densities", "Densities to sweep, space-separated.", default="0.01 0.001"),
            Param("results", "Directory for the JSON results (one per point).",
                  default="$SLURM_SUBMIT_DIR/results/$SLURM_JOB_NAME-$SLURM_JOB_ID"),
        )),
)}

# the mpisparse options each template sets itself (not allowed in --args)
_RESERVED = {
    "train": ("-n", "--np", "--checkpoint", "--resume"),
    "bench": ("-n", "--np", "--json"),
    "sweep": ("-n", "--np", "--json", "--density"),
}
_SUBCOMMANDS = ("train", "bench", "step", "select", "info", "jobs", "reproduce")


# --------------------------------------------------------------------------- pure functions
def template_text(name: str) -> str:
    """The raw text of a bundled template file (``_header`` included)."""
    return resources.files("mpisparse").joinpath("templates", "jobs", f"{name}.sbatch.in").read_text()


@functools.lru_cache(maxsize=1)
def environment():
    """The Jinja2 environment of the templates (loaded from the package, so it works from a wheel)."""
    import jinja2

    def load(name: str):
        if not name.endswith(".sbatch.in"):
            return None
        return template_text(name[: -len(".sbatch.in")])

    return jinja2.Environment(loader=jinja2.FunctionLoader(load), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False,
                              comment_start_string="{##", comment_end_string="##}")


def time_seconds(value: str) -> int:
    """SLURM time limit ``value`` in seconds; ValueError naming the formats."""
    m = _TIME.match(value.strip())
    if not m:
        raise RenderError(f"--time is {value!r}; allowed: minutes, M:S, H:M:S, D-H, D-H:M or D-H:M:S")
    d, dh, dm, ds, mm, ms, hs = m.groups()
    if d is not None:
        return int(d) * 86400 + int(dh) * 3600 + int(dm or 0) * 60 + int(ds or 0)
    if hs is not None:  # H:M:S
        return int(mm) * 3600 + int(ms) * 60 + int(hs)
    return int(mm) * 60 + int(ms or 0)


def _as_int(name: str, value: Any, low: int) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise RenderError(f"--{name.replace('_', '-')} is {value!r}; allowed: an integer >= {low}") from None
    if v < low or str(v) != str(value).strip():
        raise RenderError(f"--{name.replace('_', '-')} is {value!r}; allowed: an integer >= {low}")
    return v


def resolve(name: str, given: dict[str, Any], *,
            check_args: Callable[[str, list[str]], None] | None = None) -> dict[str, Any]:
    """Check ``given`` against template ``name``; returns every parameter's value.

    ``check_args(command, words)``: checks ``--args`` against the mpisparse
    command the template runs (``mpisparse jobs render`` passes
    :func:`mpisparse.cli.jobs.args_checker`'s, built on click's own parser);
    None leaves ``--args`` to the shell-word and reserved-option checks.

    Raises :class:`RenderError` (one line) for an unknown template, missing
    required values (all named at once), options the template does not take,
    and invalid values.
    """
    if name not in TEMPLATES:
        raise RenderError(f"no job template {name!r}; templates: {', '.join(TEMPLATES)}")
    t = TEMPLATES[name]
    given = {k: v for k, v in given.items() if v is not None and v != ()}
    foreign = [k for k in given if t.param(k) is None]
    if foreign:
        raise RenderError(f"template {name} does not take " + ", ".join(f"--{k.replace('_', '-')}" for k in foreign))
    missing = [p.name for p in t.params if p.required and p.name not in given]
    if missing:
        raise RenderError(f"template {name} needs " + ", ".join(f"--{k.replace('_', '-')}" for k in missing))
    v = {p.name: given.get(p.name, p.default) for p in t.params}

    v["nodes"] = _as_int("nodes", v["nodes"], 1)
    v["gpus_per_node"] = _as_int("gpus_per_node", v["gpus_per_node"], 0)
    v["signal_before"] = _as_int("signal_before", v["signal_before"], 1)
    gpu_option = f"--gpus-per-node {v['gpus_per_node']}"
    v["gpus"] = v["gpus_per_node"]
    if v["gres"] is not None:
        if v["gpus_per_node"]:
            raise RenderError(f"--gres {v['gres']} and --gpus-per-node {v['gpus_per_node']}: give one of them")
        v["gpus"] = gres_gpus(str(v["gres"]))
        gpu_option = f"--gres {v['gres']} ({v['gpus']} GPUs)"
    if v["tasks_per_node"] is None:
        v["tasks_per_node"] = v["gpus"] or 1
    v["tasks_per_node"] = _as_int("tasks_per_node", v["tasks_per_node"], 1)
    if v["gpus"] and v["tasks_per_node"] > v["gpus"]:
        raise RenderError(f"--tasks-per-node {v['tasks_per_node']} exceeds {gpu_option}: "
                          "one GPU per rank needs tasks per node <= GPUs per node")
    v["sbatch"] = [sbatch_line(line) for line in v["sbatch"]]
    if not isinstance(v["requeue"], bool):
        raise RenderError(f"--requeue is {v['requeue']!r}; allowed: a flag (True or False)")
    v["requeue"] = v["requeue"] or t.requeues
    limit = time_seconds(str(v["time"]))
    if limit <= v["signal_before"]:
        raise RenderError(f"--time {v['time']} ({limit} s) must be longer than --signal-before "
                          f"({v['signal_before']} s): the checkpoint warning would come at the start")
    if v["launcher"] not in LAUNCHERS:
        raise RenderError(f"--launcher is {v['launcher']!r}; allowed: {', '.join(LAUNCHERS)}")
    if not _WORD.match(str(v["srun_mpi"])):
        raise RenderError(f"--srun-mpi is {v['srun_mpi']!r}; allowed: a PMI type such as pmix, pmi2, or 'default'")
    for k in ("account", "partition"):
        if v[k] is not None and not _WORD.match(str(v[k])):
            raise RenderError(f"--{k} is {v[k]!r}; allowed: letters, digits and _.+:-")
    if v["job_name"] is None:
        v["job_name"] = f"mpisparse-{name}"
    if not _JOB_NAME.match(v["job_name"]):
        raise RenderError(f"--job-name is {v['job_name']!r}; allowed: letters, digits and _.+-")
    if any(c in str(v["output"]) for c in "\n\"'` "):
        raise RenderError(f"--output is {v['output']!r}; allowed: a path without spaces or quotes")
    for k in ("checkpoint_dir", "results"):
        if k in v and not _SAFE_PATH.match(str(v[k])):
            raise RenderError(f"--{k.replace('_', '-')} is {v[k]!r}; allowed: a path without quotes, "
                              "backslashes or newlines ($VARIABLES expand when the job runs)")
    if "densities" in v:
        for d in str(v["densities"]).split() or [""]:
            try:
                validate_density(d)
                ok = True
            except ValueError:
                ok = False
            if not ok:
                raise RenderError(f"--densities has {d!r}; allowed: numbers in (0, 1], space-separated")
    for line in v["setup"]:
        if "\n" in line:
            raise RenderError("--setup takes one line; repeat --setup for several")
    try:
        words = shlex.split(str(v["args"]))
    except ValueError as e:
        raise RenderError(f"--args {v['args']!r} is not valid shell words: {e}") from None
    if words and words[0] in _SUBCOMMANDS:
        raise RenderError(f"--args starts with {words[0]!r}: give only the options; the template runs "
                          f"`mpisparse {t.command}`")
    for w in words:
        flag = w.split("=", 1)[0]
        if flag in _RESERVED[name]:
            raise RenderError(f"--args has {flag}: the {name} template sets it itself "
                              f"(it sets {', '.join(_RESERVED[name])})")
    if check_args is not None:
        check_args(t.command, words)
    return v


def gres_gpus(gres: str) -> int:
    """GPUs per node a ``--gres`` value asks for (``gpu:4``, ``gpu:a100:4`` -> 4; ``gpu`` -> 1; none -> 0)."""
    if not _GRES.match(gres):
        raise RenderError(f"--gres is {gres!r}; allowed: SLURM's name[:type][:count], comma-separated "
                          "(e.g. gpu:4, gpu:a100:4)")
    gpus = 0
    for item in gres.split(","):
        parts = item.split(":")
        if parts[0] != "gpu":
            continue
        count = parts[-1] if len(parts) > 1 and parts[-1].isdigit() else "1"
        gpus += int(count)
    return gpus


def sbatch_line(line: str) -> str:
    """An extra ``--sbatch`` line as ``--option[=value]`` (a leading ``#SBATCH`` is accepted and dropped)."""
    text = str(line).strip()
    if text.startswith("#SBATCH"):
        text = text[len("#SBATCH"):].strip()
    if "\n" in text or not SBATCH_LINE.match(f"#SBATCH {text}"):
        raise RenderError(f"--sbatch {line!r}; allowed: one '--option' or '--option=value' (SLURM's long form)")
    opt = text[2:].split("=", 1)[0]
    if opt in _HEADER_OPTIONS:
        raise RenderError(f"--sbatch {line!r}: the template sets --{opt} itself; use the jobs render option "
                          "for it")
    return text


def check_header(text: str) -> None:
    """Every ``#SBATCH`` line is ``#SBATCH --option[=value]`` and comes before the first command."""
    first_command = None
    for i, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if line.startswith("#SBATCH"):
            if first_command is not None:
                raise RenderError(f"the rendered script has '#SBATCH' on line {i}, after the first command "
                                  f"(line {first_command}); sbatch would ignore it")
            if not SBATCH_LINE.match(line):
                raise RenderError(f"the rendered script's line {i} {line!r} is not '#SBATCH --option[=value]'")
        elif stripped and not stripped.startswith("#") and first_command is None:
            first_command = i


def render(name: str, given: dict[str, Any], *, command_line: str | None = None,
           check_args: Callable[[str, list[str]], None] | None = None) -> str:
    """The job script of template ``name`` with ``given`` values (a pure function but for ``bash -n``).

    ``check_args``: see :func:`resolve`.  The ``#SBATCH`` header and the whole
    script are checked before the text is returned.
    """
    v = resolve(name, given, check_args=check_args)
    t = TEMPLATES[name]
    values = {
        **{k: v[k] for k in ("job_name", "account", "partition", "time", "nodes", "tasks_per_node", "output",
                             "signal_before", "gres", "sbatch", "requeue", "setup", "args", "launcher",
                             "srun_mpi", "launcher_args", "gpus")},
        "gpus_per_node": v["gpus_per_node"] or None,
        "title": f"mpisparse job: {t.description}",
        "render_command": command_line if command_line is not None else render_command_line(name, given),
        "step_signal": t.step_signal,
        "checkpoint_dir": v.get("checkpoint_dir"),
        "results": v.get("results"),
        "densities": v.get("densities"),
    }
    text = environment().get_template(f"{name}.sbatch.in").render(**values)
    check_header(text)
    check_syntax(text)
    return text


def render_command_line(name: str, given: dict[str, Any]) -> str:
    """``NAME --option value ...``: how to render the same script again (written into its header)."""
    parts = [name]
    for p in TEMPLATES[name].params if name in TEMPLATES else ():
        val = given.get(p.name)
        if val is None or val == () or val is False:
            continue
        flag = "--" + p.name.replace("_", "-")
        if val is True:
            parts.append(flag)
            continue
        for item in (val if isinstance(val, (list, tuple)) else [val]):
            parts += [flag, str(item)]
    return shlex.join(parts)


def check_syntax(text: str) -> None:
    """``bash -n`` on the rendered script (skipped where there is no bash)."""
    bash = shutil.which("bash")
    if bash is None:
        return
    p = subprocess.run([bash, "-n"], input=text, capture_output=True, text=True)
    if p.returncode != 0:
        msg = re.sub(r"^\S*bash: ", "", (p.stderr.strip().splitlines() or ["syntax error"])[0])
        raise RenderError(f"the rendered script is not valid bash ({msg}); check --args and --setup")


def format_list() -> str:
    lines = []
    for t in TEMPLATES.values():
        lines.append(f"{t.name:<7}{t.description}")
        lines.append(f"{'':<7}runs: mpisparse {t.command}; on the time-limit warning the step gets SIG{t.step_signal}")
        for p in sorted(t.params, key=lambda p: not p.required):
            note = " (required)" if p.required else ("" if p.default in (None, (), "") or p.default is False else
                                                      f" [default: {p.default}]")
            lines.append(f"{'':<9}--{p.name.replace('_', '-'):<16}{p.help}{note}")
        lines.append("")
    lines.append("mpisparse jobs render NAME --nodes N --time T [options] > job.sbatch; then: sbatch job.sbatch")
    return "\n".join(lines)


# examples written into jobs/ by `mpisparse jobs examples jobs/` (checked by tests/test_jobs.py)
EXAMPLES: dict[str, tuple[str, dict[str, Any]]] = {
    "train.sbatch": ("train", {
        "nodes": 2, "time": "04:00:00", "account": "myproject", "partition": "gpu", "gpus_per_node": 4,
        "setup": ("module load cuda", "source $HOME/venvs/mpisparse/bin/activate"),
        "args": "--model resnet18 --data cifar10 --data-dir $HOME/data/cifar-10-batches-bin "
                "--scheme deft --density 0.01 --epochs 90 --json train-$SLURM_JOB_ID.json"}),
    "train-mpirun.sbatch": ("train", {
        "nodes": 2, "time": "04:00:00", "account": "myproject", "partition": "gpu", "gpus_per_node": 4,
        "launcher": "mpirun", "setup": ("module load openmpi", "source $HOME/venvs/mpisparse/bin/activate"),
        "args": "--model resnet18 --data cifar10 --data-dir $HOME/data/cifar-10-batches-bin "
                "--scheme topk --density 0.01 --epochs 90"}),
    "bench.sbatch": ("bench", {
        "nodes": 4, "time": "00:30:00", "account": "myproject", "partition": "gpu", "gpus_per_node": 4,
        "setup": ("source $HOME/venvs/mpisparse/bin/activate",)}),
    "sweep.sbatch": ("sweep", {
        "nodes": 8, "time": "02:00:00", "account": "myproject", "partition": "cpu", "tasks_per_node": 1,
        "setup": ("source $HOME/venvs/mpisparse/bin/activate",),
        "args": "--model resnet50 --scheme dense --scheme topk --scheme cltk --scheme gtopk --iters 20",
        "densities": "0.01 0.001"}),
}


def render_examples() -> dict[str, str]:
    return {fname: render(name, given) for fname, (name, given) in EXAMPLES.items()}
