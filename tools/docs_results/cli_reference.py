"""``docs/cli.md``: generated from the ``--help`` text of every command and subcommand."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from .framework import GENERATED_MARK, REPO
from .running import RunError


def _help(python: str, repo: Path, words: Sequence[str]) -> str:
    env = dict(os.environ, COLUMNS="100", PYTHONPATH=str(repo))
    for key in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        env.pop(key, None)
    proc = subprocess.run([python, "-m", "mpisparse", *words, "--help"], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=120)
    if proc.returncode != 0:
        raise RunError(f"`mpisparse {' '.join([*words, '--help'])}` failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def subcommands(help_text: str) -> list[tuple[str, str]]:
    """``(name, summary)`` of the ``Commands:`` section of a click help text."""
    out: list[tuple[str, str]] = []
    if "\nCommands:" not in help_text:
        return out
    for line in help_text.split("\nCommands:", 1)[1].splitlines()[1:]:
        if not line.strip():
            break
        m = re.match(r"^  (\S+)\s*(.*)$", line)
        if m:
            out.append((m.group(1), m.group(2).strip()))
        elif out and line.startswith("    "):
            out[-1] = (out[-1][0], (out[-1][1] + " " + line.strip()).strip())
    return out


def command_tree(python: str = sys.executable, repo: str | os.PathLike | None = None) -> list[tuple[list[str], str]]:
    """Every command path with its ``--help`` text, depth first (``[]`` is ``mpisparse`` itself)."""
    repo = Path(repo) if repo is not None else REPO
    out: list[tuple[list[str], str]] = []

    def walk(words: list[str]) -> None:
        text = _help(python, repo, words)
        out.append((words, text))
        for name, _ in subcommands(text):
            walk([*words, name])

    walk([])
    return out


def _anchor(words: Sequence[str]) -> str:
    return "-".join(["mpisparse", *words])


def generate_cli(path: str | os.PathLike, *, python: str = sys.executable,
                 repo: str | os.PathLike | None = None) -> Path:
    """Write ``docs/cli.md`` from the ``--help`` text of every command and subcommand."""
    tree = command_tree(python, repo)
    lines = [f"{GENERATED_MARK} --only cli; edit the commands' help texts, not this file -->",
             "# Command-line reference", "",
             "Generated from `mpisparse --help` and the `--help` of every command and subcommand by "
             "`bin/docs-results --only cli`. Options shared by several schemes carry the schemes that declare "
             "them in brackets (`[cltk]`). Concepts: [design.md](design.md); schemes: [schemes.md](schemes.md).",
             ""]
    for words, _ in tree:
        indent = "  " * max(0, len(words) - 1)
        lines.append(f"{indent}- [`{' '.join(['mpisparse', *words])}`](#{_anchor(words)})")
    for words, text in tree:
        lines += ["", f"## `{' '.join(['mpisparse', *words])}`", "", "```text", text.rstrip(), "```"]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return out
