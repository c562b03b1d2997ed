"""What the docs name can be checked without running anything: commands parse, modules import, files exist.

* Every ``mpisparse ...`` command line in a fenced code block of README.md and docs/*.md (not docs/results/,
  generated with its commands; of docs/cli.md, the ``--help`` output, only the help's example lines) parses with the real CLI: click's
  ``make_context`` on ``mpisparse.cli.cli`` and then on each subcommand, as ``Group.invoke`` would, without
  invoking a command. Launch prefixes (``mpiexec -n N``, ``srun``, ``python -m``, ``torchrun ... -m``,
  ``bin/emucluster run N --``), environment assignments, redirections and comments are taken off first.
* Every dotted path ``mpisparse.x.y`` in backticks imports (the longest importable module prefix, then
  attributes).
* Every repository path (``mpisparse/...``, ``tests/...``, ``bin/...``, ``docs/...``, ...) in the docs exists.

Fast: one process, no MPI launch.
"""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
#: generated from ``--help``: its ``text`` blocks are help output, of which only example lines are commands
CLI_REFERENCE = "docs/cli.md"
#: fenced blocks whose lines are shell commands (``console`` lines may carry a ``$ `` prompt)
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.S | re.M)
#: a backticked span of a page
CODE = re.compile(r"`([^`\n]+)`")
#: the tokens that end one command of a shell line
SEPARATORS = {"&&", "||", ";", "|", "&"}
#: programs that run ``mpisparse`` as (part of) their command
LAUNCHERS = {"mpiexec", "mpirun", "srun", "torchrun", "python", "python3", "taskset", "timeout", "env", "time",
             "nohup", "bin/emucluster", "emucluster", "uv"}
#: what a ``$VAR`` placeholder stands for when the docs leave it to the reader
PLACEHOLDERS = {"W": "2", "N": "2", "NP": "2", "NODES": "2", "SLURM_NTASKS": "2"}

UNPARSABLE = "!shell: "

#: placeholders the reader fills in with a value that becomes valid only after the page's own steps, each
#: replaced by a value the option takes today: (page, fragment) -> replacement
FILLED_IN: dict[tuple[str, str], str] = {
    # the model shape set the page has the reader add; `--model` takes it once it is registered
    ("docs/extending.md", "--model NAME"): "--model resnet18",
}
#: commands shown on purpose as what fails, each with the reason; the key is (page, a fragment of the line)
SHOWN_FAILING: dict[tuple[str, str], str] = {}


def commands(page: Path, text: str | None = None) -> list[tuple[str, int, str]]:
    """``(page, line number, command line)`` for every mpisparse command in the page's shell code blocks."""
    text = page.read_text(encoding="utf-8") if text is None else text
    rel = str(page.relative_to(ROOT))
    found = []
    for m in FENCE.finditer(text):
        help_text = rel == CLI_REFERENCE and m.group(1) == "text"  # --help output: only its example lines
        if m.group(1) not in SHELL_FENCES and not help_text:
            continue
        first = text.count("\n", 0, m.start(2)) + 1
        lines = m.group(2).split("\n")
        i = 0
        while i < len(lines):
            start, line = i, lines[i]
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
            line = line.strip()
            if help_text and not line.startswith("mpisparse "):
                continue
            if line.startswith("$ "):
                line = line[2:]
            elif m.group(1) == "console" or not line or line.startswith("#"):
                continue  # output shown in a console block, or a comment
            try:
                found += [(rel, first + start, c) for c in mpisparse_commands(line)]
            except ValueError as e:  # a quote left open: not a shell line a reader can paste
                if "mpisparse" in line:
                    found.append((rel, first + start, f"{UNPARSABLE}{e}: {line}"))
    return found


def tokens(line: str) -> list[str]:
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
    lex.whitespace_split = True
    lex.commenters = "#"
    return list(lex)


def mpisparse_commands(line: str) -> list[str]:
    """The mpisparse commands of one shell line, each as ``mpisparse ARGS`` (shell-quoted)."""
    out, segment = [], []
    for tok in tokens(line) + [";"]:
        if tok not in SEPARATORS:
            segment.append(tok)
            continue
        words, skip = [], False
        for t in segment:  # redirections and their targets are not arguments
            if skip:
                skip = False
            elif re.fullmatch(r"\d?[<>]+", t):
                skip = True
            else:
                words.append(t)
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            words.pop(0)
        segment = []
        if not words:
            continue
        if words[0] == "mpisparse":
            args = words[1:]
        elif Path(words[0]).name in LAUNCHERS or words[0] in LAUNCHERS:
            if "mpisparse" not in words:
                continue
            args = words[words.index("mpisparse") + 1:]
        else:
            continue
        out.append(shlex.join(["mpisparse"] + args))
    return out


def substitute(arg: str) -> str:
    """``$VAR``/``${VAR}`` placeholders replaced by a value the option takes (a path stays a path)."""
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: PLACEHOLDERS.get(m.group(1), "x"), arg)


def every_command(cmd: click.Command):
    yield cmd
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(None):  # every command, a lazily loaded one too (LazyGroup)
            yield from every_command(cmd.get_command(None, name))


@pytest.fixture
def cli(monkeypatch):
    """The CLI with input files not required to exist (they are the reader's: ``--exchange ex.json``)."""
    from mpisparse.cli import cli

    for cmd in every_command(cli):
        for param in cmd.params:
            if isinstance(param.type, click.Path) and param.type.exists:
                monkeypatch.setattr(param.type, "exists", False)
    return cli


def parse(cli: click.Group, argv: list[str]) -> list[str]:
    """Parse ``argv`` as the ``mpisparse`` command line down to its last subcommand; the command path."""

    path, cmd, parent = ["mpisparse"], cli, None
    while True:
        try:
            ctx = cmd.make_context(path[-1], list(argv), parent=parent, resilient_parsing=False)
        except click.exceptions.Exit as e:  # --help, --version: parsed, then exits 0
            assert e.exit_code == 0
            return path
        if not isinstance(cmd, click.Group):
            return path
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            assert cmd.invoke_without_command, f"{' '.join(path)}: no subcommand"
            return path
        name, sub, argv = cmd.resolve_command(ctx, rest)
        path.append(name)
        cmd, parent = sub, ctx


DOC_COMMANDS = [c for page in PAGES for c in commands(page)]


@pytest.mark.parametrize("page,line,command", DOC_COMMANDS, ids=[f"{p}:{n}" for p, n, _ in DOC_COMMANDS])
def test_every_documented_command_parses(cli, page, line, command, tmp_path, monkeypatch):
    for (p, frag), reason in SHOWN_FAILING.items():
        if p == page and frag in command:
            pytest.skip(reason)
    for (p, frag), value in FILLED_IN.items():
        if p == page:
            command = command.replace(frag, value)
    assert not command.startswith(UNPARSABLE), f"{page}:{line}: {command[len(UNPARSABLE):]}"
    argv = [substitute(a) for a in shlex.split(command)[1:]]
    monkeypatch.chdir(tmp_path)  # the reader's directories (`--json OUT/model.json`) exist, nothing is written
    for a in argv:
        a = a.split("=", 1)[-1]
        if "/" in a and not a.startswith(("-", "/", "~")):
            (tmp_path / a).parent.mkdir(parents=True, exist_ok=True)
    try:
        parse(cli, argv)
    except click.ClickException as e:
        pytest.fail(f"{page}:{line}: `{command}` does not parse: {e.format_message()}")


def inline_commands(page: Path) -> list[tuple[str, int, str]]:
    """The commands in backticks in the page's prose that a reader can paste: with an option, no placeholder.

    A bare name (`mpisparse jobs render`) names a command and is not checked; nor is a span with ``...`` or a
    word in capitals (`-n W`, `ARGS`, `DIR/x.json`), which the reader fills in.
    """
    text = page.read_text(encoding="utf-8")
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    found = []
    for m in CODE.finditer(prose):
        try:
            cmds = mpisparse_commands(m.group(1))
        except ValueError:
            continue
        for c in cmds:
            args = shlex.split(c)[1:]
            if not any(a.startswith("-") for a in args) or any(
                    "..." in a or "\u2026" in a or "<" in a or re.search(r"\b[A-Z]{2,}\b|^[A-Z]$", a) for a in args):
                continue
            found.append((str(page.relative_to(ROOT)), prose.count("\n", 0, m.start()) + 1, c))
    return found


INLINE_COMMANDS = [c for page in PAGES if page.name != "cli.md" for c in inline_commands(page)]


@pytest.mark.parametrize("page,line,command", INLINE_COMMANDS, ids=[f"{p}:{n}" for p, n, _ in INLINE_COMMANDS])
def test_every_inline_command_parses(cli, page, line, command, tmp_path, monkeypatch):
    test_every_documented_command_parses(cli, page, line, command, tmp_path, monkeypatch)


def test_a_command_that_does_not_parse_is_found(cli):
    found = commands_of("```bash\nmpiexec -n 2 python -m mpisparse bench step --scheme topk \\\n  --iters 3 # x\n"
                        "pip install . && OMP_NUM_THREADS=1 mpisparse info > out.txt; cd mpisparse\n```\n"
                        "```console\n$ torchrun --nproc-per-node 2 -m mpisparse train --epochs 1\nmpisparse no\n```\n")
    assert found == ["mpisparse bench step --scheme topk --iters 3", "mpisparse info", "mpisparse train --epochs 1"]
    assert parse(cli, ["bench", "step", "--scheme", "topk"]) == ["mpisparse", "bench", "step"]
    for bad in (["bench", "step", "--no-such-option"], ["bench", "nosuch"], ["train", "--scheme", "nosuch"]):
        with pytest.raises(click.ClickException):
            parse(cli, bad)


def commands_of(markdown: str) -> list[str]:
    page = ROOT / "docs" / "_sample.md"
    return [c for _, _, c in commands(page, markdown)]


DOTTED = re.compile(r"(?<![\w.])mpisparse(?:\.[A-Za-z_]\w*)+")
#: a path in the repository: a file, a folder (trailing slash) or a glob
FILE = re.compile(r"(?<![\w./~$-])(?:mpisparse|tests|bin|examples|tools|jobs|docs)/[\w./*-]*[\w*/]")
#: paths that are not the repository's, with the reason
NOT_IN_THE_REPO = {
    "bin/mpiexec": "the virtual environment's bin/, where the MPI wheels put mpiexec",
}


def dotted_paths() -> list[tuple[str, str]]:
    found = set()
    for page in PAGES:
        for span in CODE.findall(page.read_text(encoding="utf-8")):
            found |= {(str(page.relative_to(ROOT)), d) for d in DOTTED.findall(span)}
    return sorted(found)


def file_paths() -> list[tuple[str, str]]:
    found = set()
    for page in PAGES:
        found |= {(str(page.relative_to(ROOT)), f) for f in FILE.findall(page.read_text(encoding="utf-8"))
                  if f not in NOT_IN_THE_REPO}
    return sorted(found)


DOTTED_PATHS = dotted_paths()
FILE_PATHS = file_paths()


def resolve(dotted: str):
    """The object a dotted path names: the longest prefix that imports as a module, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and not name.startswith(e.name) and e.name != name:
                raise  # the module exists but a dependency of it is missing: a real failure
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("page,dotted", DOTTED_PATHS, ids=[f"{p}:{d}" for p, d in DOTTED_PATHS])
def test_every_dotted_path_in_the_docs_imports(page, dotted):
    try:
        resolve(dotted)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"{page}: `{dotted}` does not resolve: {e!r}")


@pytest.mark.parametrize("page,path", FILE_PATHS, ids=[f"{p}:{f}" for p, f in FILE_PATHS])
def test_every_repository_path_in_the_docs_exists(page, path):
    if re.search(r"\b[A-Z]{2,}\b", path):  # a file the page has the reader create (`schemes/NAME.py`): its folder
        path = path.rsplit("/", 1)[0]
    if "*" in path:
        assert list(ROOT.glob(path)), f"{page}: `{path}` matches no file"
    else:
        assert (ROOT / path).exists(), f"{page}: `{path}` does not exist"


def test_there_are_commands_modules_and_paths_to_check():
    assert len(DOC_COMMANDS) > 30 and len(INLINE_COMMANDS) > 5 and len(DOTTED_PATHS) > 5 and len(FILE_PATHS) > 30
    assert {p for p, _, _ in DOC_COMMANDS} >= {"README.md", "docs/usage.md", "docs/cluster.md"}
