"""Claims in the docs' prose that the code decides, checked against the code (fast: one process, no MPI).

* **Scheme lists.** A sentence that lists the schemes with (or without) a capability names exactly the
  data-parallel schemes the registry gives it (or denies it): two-level collectives (``--hierarchical``: the
  class's ``hierarchical``), 16-bit values on the wire (``validate_options`` accepts ``wire_dtype="float16"``),
  bucket by bucket (``bucket_reason`` is None with some value of the scheme's own options).
* **Command lists.** A sentence that lists the commands with (or without) an option names exactly the
  commands whose ``--help`` has it.
* **An option next to a command.** A backticked ``COMMAND --option ...`` in prose (``train --checkpoint``,
  ``bench tta --json PATH``) names options that COMMAND takes, placeholders and all (tests/test_docs_commands.py
  parses the commands a reader can paste; this checks the rest too).

Each claim is found by a pattern whose ``list`` group holds the names; a sentence rewritten so that its pattern
no longer matches fails here too (update the pattern with the sentence).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

import click
import pytest

from test_docs_commands import CODE, FENCE, PAGES, ROOT


# ----------------------------------------------------------------------------- what the code says
def data_parallel() -> dict[str, type]:
    from mpisparse.registry import SCHEMES

    return {name: SCHEMES[name] for name in sorted(SCHEMES) if SCHEMES[name].runtime == "collective"}


def option_values(cls) -> list[dict]:
    """The scheme's options one at a time at a value other than the default (flags on, a number, every
    choice), after the defaults: what a sentence's "with ``layerwise=True``" can refer to."""
    probes: list[dict] = [{}]
    for o in cls.options:
        if o.kind is bool:
            probes.append({o.name: True})
        elif o.choices:
            probes += [{o.name: c} for c in o.choices if c != o.default]
        elif o.kind in (int, float):
            probes.append({o.name: o.kind(max(o.low or 0, 0) + 1)})
    return probes


def wire16(cls) -> bool:
    try:
        cls.validate_options({"wire_dtype": "float16"})
    except ValueError:
        return False
    return True


#: capability -> which data-parallel schemes have it
CAPABILITIES = {
    "hierarchical": lambda cls: bool(cls.hierarchical),
    "16-bit wire": wire16,
    "bucket by bucket": lambda cls: any(cls.bucket_reason(o) is None for o in option_values(cls)),
}


def schemes_with(capability: str, present: bool = True) -> set[str]:
    test = CAPABILITIES[capability]
    return {name for name, cls in data_parallel().items() if test(cls) == present}


def leaf_commands(group: click.Group | None = None, prefix: tuple[str, ...] = ()) -> dict[str, click.Command]:
    """``{"bench step": command, ...}``: every command that runs (not a group) under ``group``."""
    from mpisparse.cli import cli

    group = cli if group is None else group
    out = {}
    for name in group.list_commands(None):
        cmd = group.get_command(None, name)
        if isinstance(cmd, click.Group):
            out.update(leaf_commands(cmd, prefix + (name,)))
        else:
            out[" ".join(prefix + (name,))] = cmd
    return out


def options_of(cmd: click.Command) -> set[str]:
    names = {"--help"}
    for p in cmd.params:
        names |= set(p.opts) | set(p.secondary_opts)
    return names


def commands_with(option: str, under: str = "", present: bool = True) -> set[str]:
    """The commands (named relative to ``under``, e.g. "bench") whose options include ``option`` (or not)."""
    found = set()
    for name, cmd in leaf_commands().items():
        if under and not name.startswith(under + " "):
            continue
        if (option in options_of(cmd)) == present:
            found.add(name[len(under) + 1:] if under else name)
    return found


# ----------------------------------------------------------------------------- what the docs say
@dataclass(frozen=True)
class Claim:
    page: str
    #: finds the sentence; its ``list`` group holds the names (each match adds its names: a table's rows)
    pattern: str
    #: a capability of :data:`CAPABILITIES`, or an option (``--csv``) for a list of commands
    about: str
    #: the names are those with it (True) or those without it (False)
    present: bool = True
    #: commands: named relative to this group ("bench": ``overlap`` is ``bench overlap``)
    under: str = ""
    #: names the sentence leaves to another clause, each with the reason
    apart: tuple[str, ...] = ()


CLAIMS = [
    Claim("docs/schemes.md", r"It applies to every scheme whose exchange is only Allreduce, Bcast and\s+"
                             r"Allgatherv: (?P<list>[^.]*)\.", "hierarchical"),
    Claim("docs/schemes.md", r"The others, (?P<list>[^:]*?), are refused", "hierarchical", False),
    Claim("docs/schemes.md", r"^\| (?P<list>[\w, -]+) \| float32, float16, bfloat16 \|", "16-bit wire"),
    Claim("docs/schemes.md", r"^\| (?P<list>[\w, -]+) \| float32 only \|", "16-bit wire", False),
    Claim("docs/torch.md", r"`compression=fp16` is refused by (?P<list>[^(]*)\(", "16-bit wire", False),
    Claim("docs/porting.md", r"\)\. (?P<list>(?:`[\w-]+`,?\s+(?:and\s+)?)+)send float32 only and refuse it",
          "16-bit wire", False),
    Claim("docs/torch.md", r"Only schemes whose math is per element or per layer run bucket by bucket,\s+"
                           r"so that a bucket-wise step equals the whole-vector one: (?P<list>[^.]*)\.",
          "bucket by bucket"),
    Claim("docs/porting.md", r"only where the scheme's math is per element or per layer: (?P<list>[^.]*)\.",
          "bucket by bucket"),
    # the schemes that cannot overlap with their default options (topk without layerwise=True and threshold
    # without a fixed threshold= among them): "every other scheme" beside the list above
    Claim("docs/porting.md", r"Every other scheme \((?P<list>[^)]*)\) exchanges after backward",
          "bucket by bucket (defaults)", False),
    Claim("docs/usage.md", r"Commands that run ranks \((?P<list>[^)]*)\) take `-n W`", "-n",
          apart=("reproduce",)),  # the same sentence's driver clause: `reproduce -n W` is the largest W
    Claim("docs/usage.md", r"Every suite prints a table and takes `--json PATH`(?P<list>)", "--json", False,
          under="bench"),
    Claim("docs/usage.md", r"all but (?P<list>`[\w-]+`(?:,? and\s+`[\w-]+`)*) take `--plot PATH`", "--plot", False,
          under="bench"),
    Claim("docs/usage.md", r"all but (?P<list>`[\w-]+`(?:,? and\s+`[\w-]+`)*) take `--csv PATH`", "--csv", False,
          under="bench"),
]

CAPABILITIES["bucket by bucket (defaults)"] = lambda cls: cls.bucket_reason({}) is None


def named(listing: str, universe: set[str]) -> set[str]:
    """The names of ``universe`` that ``listing`` mentions as words (backticked or not; ``threshold=`` counts)."""
    words = re.findall(r"[\w-]+(?: [\w-]+)?", listing)
    singles = set(re.findall(r"[\w-]+", listing))
    return {n for n in universe if n in singles or n in words or f"`{n}`" in listing}


def claimed(claim: Claim, text: str) -> tuple[set[str], set[str]]:
    """``(names the sentence lists, the names the code gives)`` for one claim on a page's ``text``."""
    matches = list(re.finditer(claim.pattern, text, re.M | re.S))
    assert matches, f"{claim.page}: no sentence matches {claim.pattern!r} (reworded? update the claim)"
    if claim.about.startswith("-"):
        expected = commands_with(claim.about, claim.under, claim.present)
        universe = commands_with(claim.about, claim.under, True) | commands_with(claim.about, claim.under, False)
    else:
        expected = schemes_with(claim.about, claim.present)
        universe = set(data_parallel())
    listed: set[str] = set()
    for m in matches:
        listed |= named(" ".join(m.group("list").split()), universe)
    return listed, expected - set(claim.apart)


def page_text(page: str) -> str:
    return (ROOT / page).read_text(encoding="utf-8")


@pytest.mark.parametrize("claim", CLAIMS, ids=[f"{c.page}:{c.about}:{'with' if c.present else 'without'}"
                                               for c in CLAIMS])
def test_every_listed_capability_is_the_codes(claim):
    listed, expected = claimed(claim, page_text(claim.page))
    assert listed == expected, (f"{claim.page}: the sentence lists {sorted(listed)} as "
                                f"{'having' if claim.present else 'lacking'} {claim.about}; the code says "
                                f"{sorted(expected)} (missing {sorted(expected - listed)}, "
                                f"wrong {sorted(listed - expected)})")


# ----------------------------------------------------------------------------- options next to a command
def command_spans() -> list[tuple[str, int, str, str, list[str]]]:
    """``(page, line, span, command, its options)`` for each backticked ``COMMAND --option ...`` in prose."""
    commands = leaf_commands()
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for m in CODE.finditer(prose):
            try:
                words = shlex.split(m.group(1))
            except ValueError:
                words = m.group(1).split()
            if words[:1] == ["mpisparse"]:
                words = words[1:]
            name = next((" ".join(words[:i]) for i in (2, 1) if " ".join(words[:i]) in commands), None)
            if name is None:
                continue
            options = [w.split("=", 1)[0] for w in words[len(name.split()):] if re.match(r"--?[A-Za-z]", w)]
            if options:
                found.append((str(page.relative_to(ROOT)), prose.count("\n", 0, m.start()) + 1, m.group(1), name,
                              options))
    return found


SPANS = command_spans()


@pytest.mark.parametrize("page,line,span,command,options", SPANS, ids=[f"{p}:{n}" for p, n, *_ in SPANS])
def test_every_option_named_beside_a_command_is_one_it_takes(page, line, span, command, options):
    known = options_of(leaf_commands()[command])
    unknown = [o for o in options if o not in known]
    assert not unknown, f"{page}:{line}: `{span}`: `{command}` has no {', '.join(unknown)} (its --help)"


# ----------------------------------------------------------------------------- a count against the results
NUMBERS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve "
                                      "thirteen fourteen fifteen sixteen".split())}
#: a GPU check's row for one scheme's training on the device against the CPU (docs/results/gpu/, gpu-check)
DEVICE_TRAINED = re.compile(r"^\| train --scheme ([\w-]+): the GPU run within [\d.]+ points of the CPU run.*\| yes \|$",
                            re.M)


def trained_on_the_device() -> set[str]:
    return {m.group(1) for f in sorted((ROOT / "docs" / "results" / "gpu").glob("gpu-check-*.md"))
            for m in DEVICE_TRAINED.finditer(f.read_text(encoding="utf-8"))}


def test_the_readme_counts_the_schemes_the_gpu_checks_trained():
    m = re.search(r"the (\w+) data-parallel\s+schemes there were then trained on the device to the CPU's accuracy",
                  page_text("README.md"))
    assert m, "README.md: the sentence on the schemes trained on the device is gone (reworded? update the test)"
    trained = trained_on_the_device()
    assert NUMBERS.get(m.group(1)) == len(trained), (f"README.md says {m.group(1)}; docs/results/gpu/ has "
                                                     f"{len(trained)}: {sorted(trained)}")


# ----------------------------------------------------------------------------- numbers cited to a page
#: (page, pattern): the ``numbers`` group's numbers must appear in the page the ``target`` group links to
CITED = [
    ("docs/choosing.md", r"shared memory on one host carried dense's exchange at only (?P<numbers>[\d.]+(?:-[\d.]+)?) "
                         r"Gbit/s[^(]*\(\[[^]]*\]\((?P<target>results/[\w-]+\.md)\)"),
]


@pytest.mark.parametrize("page,pattern", CITED, ids=[p for p, _ in CITED])
def test_every_cited_number_is_in_the_page_it_cites(page, pattern):
    m = re.search(pattern, page_text(page), re.S)
    assert m, f"{page}: no sentence matches {pattern!r} (reworded? update the test)"
    cited = page_text(str((ROOT / page).parent.relative_to(ROOT) / m.group("target")))
    missing = [x for x in re.findall(r"\d+(?:\.\d+)?", m.group("numbers"))
               if not re.search(rf"(?<![\d.]){re.escape(x)}(?!\d)", cited)]
    assert not missing, f"{page}: {', '.join(missing)} cited to {m.group('target')}, which has no such number"


# ----------------------------------------------------------------------------- the checks can fail
def test_a_wrong_list_or_option_is_caught():
    hier = CLAIMS[0]
    text = page_text(hier.page)
    listed, expected = claimed(hier, text)
    assert listed == expected and {"powersgd", "dense"} <= listed and "oktopk" not in listed
    # one scheme dropped from the list, one added that cannot: both seen
    wrong = re.sub(r"(`dgc`), `powersgd`", r"\1, `oktopk`", text)
    assert wrong != text
    listed, expected = claimed(hier, wrong)
    assert expected - listed == {"powersgd"} and listed - expected == {"oktopk"}
    csv = next(c for c in CLAIMS if c.about == "--csv")
    listed, expected = claimed(csv, "all but `overlap` take `--csv PATH`")
    assert expected - listed == {"tta"}
    n = next(c for c in CLAIMS if c.about == "-n")
    listed, expected = claimed(n, "Commands that run ranks (`info`, `train`, `bench step`) take `-n W`")
    assert {"bench tta", "advise-steps"} <= expected - listed
    assert "--csv" not in options_of(leaf_commands()["bench tta"]) and "--json" in options_of(leaf_commands()["bench tta"])


def test_there_are_claims_and_spans_to_check():
    assert len(SPANS) > 50 and {c.page for c in CLAIMS} >= {"docs/schemes.md", "docs/torch.md", "docs/usage.md"}
    assert schemes_with("hierarchical", False) >= {"gtopk", "oktopk"}
    assert schemes_with("16-bit wire", False) >= {"gtopk", "oktopk", "powersgd"}
    assert {"dense", "topk", "threshold"} <= schemes_with("bucket by bucket")
