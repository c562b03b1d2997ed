"""The README's generated blocks: the headline table and the claims summary, built from the committed
results files, and the replacement of the text between a block's markers.
"""

from __future__ import annotations

import os
from pathlib import Path

from .framework import HEADLINE_BEGIN, HEADLINE_END, md_table
from .provenance import markdown_tables, parse_header
from .reproduce_tables import REPRODUCE_FULL_TIMED, REPRODUCE_LARGE, REPRODUCE_TARGETS


# --------------------------------------------------------------------------- README headline
def _find_table(text: str, heading_prefix: str) -> tuple[list[str], list[list[str]]] | None:
    for heading, cols, rows in markdown_tables(text):
        if heading.startswith(heading_prefix):
            return cols, rows
    return None


def _tta_columns(rd: Path) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """Time to target against the optimized dense baseline, one column per committed ``bench tta`` table
    (resnet18 on digits; gpt on pydoc at each rate): ``(headers, {scheme: cells}, source lines)``."""
    sources = [("tta.md", "Time to accuracy", "resnet18 to 90 % (digits), 200 Mbit/s")]
    sources += [("tta-gpt.md", f"Links of {rate}", f"gpt to held-out loss (pydoc), {rate}")
                for rate in ("100 Mbit/s", "1 Gbit/s")]
    headers: list[str] = []
    cells: dict[str, list[str]] = {}
    lines: list[str] = []
    for name, prefix, label in sources:
        f = rd / name
        if not f.exists():
            continue
        text = f.read_text()
        found = next(((cols, rows) for heading, cols, rows in markdown_tables(text)
                      if (heading.startswith(prefix) or name == "tta.md") and "speedup vs dense-opt" in cols), None)
        if found is None:
            continue
        cols, rows = found
        j = cols.index("speedup vs dense-opt")
        col = len(headers)
        headers.append(label)
        for r in rows:
            scheme = r[0].split(" ")[0]
            cells.setdefault(scheme, [])
            cells[scheme] += ["—"] * (col - len(cells[scheme])) + [r[j]]
        h = parse_header(text)
        if not any(name in line for line in lines):
            lines.append(f"[docs/results/{name}](docs/results/{name}) (commit {h.get('commit', '?')}, "
                         f"{h.get('date (UTC)', '?')} UTC, {h.get('machine', '?')})")
    for scheme in cells:
        cells[scheme] += ["—"] * (len(headers) - len(cells[scheme]))
    return headers, cells, lines


def headline(results_dir: str | os.PathLike) -> str | None:
    """The README's headline: time to target against the optimized dense baseline (``bench tta`` on the
    emulated cluster), then the digits training and ``bench step`` table; None if the files are missing."""
    rd = Path(results_dir)
    tta_headers, tta_cells, tta_sources = _tta_columns(rd)
    first = ""
    if tta_headers:
        first = (md_table(["scheme", *[f"time to target vs `dense-opt`: {h}" for h in tta_headers]],
                          [[s, *c] for s, c in tta_cells.items()])
                 + "\n\nSpeedup in wall-clock time to the target over `dense-opt`, the optimized dense baseline "
                 "(16-bit wire, overlapped with backward), training end to end on 2 emulated hosts whose compute "
                 "is this machine's CPU: " + "; ".join(tta_sources) + ".\n\n")
    rest = _digits_and_step(rd)
    if rest is None:
        return first or None
    return first + rest


def _digits_and_step(rd: Path) -> str | None:
    """Accuracy, bytes and density on digits at W=2, and ``bench step``'s speedup over float32 dense."""
    train = rd / "train-digits.md"
    if not train.exists():
        return None
    text = train.read_text()
    t = _find_table(text, "Schemes")
    if t is None:
        return None
    cols, rows = t
    ix = {c: i for i, c in enumerate(cols)}
    emu: dict[str, str] = {}
    emu_title = None
    emu_file = rd / "emucluster.md"
    if emu_file.exists():
        for heading, ecols, erows in markdown_tables(emu_file.read_text()):
            if "density 0.01" in heading and "vs dense" in ecols:
                emu_title = heading
                j = ecols.index("vs dense")
                emu = {r[0]: r[j] for r in erows}
                break
    hdr = ["scheme", "test accuracy (digits, W=2)", "bytes/rank/step (digits)", "density_actual (digits)"]
    if emu:
        hdr.append("`bench step` speedup over float32 dense (exchange only), emulated 1 Gbit/s links")
    out_rows = []
    for r in rows:
        row = [r[ix["scheme"]], r[ix["test accuracy"]], r[ix["bytes/rank/step"]], r[ix["density_actual"]]]
        if emu:
            row.append(emu.get(r[ix["scheme"]], "—"))
        out_rows.append(row)
    h = parse_header(text)
    lines = [md_table(hdr, out_rows), "",
             f"Digits columns: [docs/results/train-digits.md](docs/results/train-digits.md) (commit "
             f"{h.get('commit', '?')}, {h.get('date (UTC)', '?')} UTC, {h.get('machine', '?')})."]
    if emu:
        eh = parse_header(emu_file.read_text())
        lines.append(f"Speedup column: [docs/results/emucluster.md](docs/results/emucluster.md), {emu_title} "
                     f"(commit {eh.get('commit', '?')}): `bench step` times the sparsified exchange of synthetic "
                     "gradients with no forward or backward pass, against float32 dense without overlap, so it "
                     "is the exchange's speedup, not training's.")
    return "\n".join(lines)


def update_readme(readme: str | os.PathLike, block: str, begin: str = HEADLINE_BEGIN,
                  end: str = HEADLINE_END) -> bool:
    """Replace the text between two markers (the headline's by default); False if the README lacks them."""
    path = Path(readme)
    text = path.read_text()
    if begin not in text or end not in text:
        return False
    before, rest = text.split(begin, 1)
    _, after = rest.split(end, 1)
    path.write_text(f"{before}{begin}\n{block.rstrip()}\n{end}{after}")
    return True


# --------------------------------------------------------------------------- README claims summary
VERDICTS = ("yes", "no", "noise", "n/a")


def claim_counts(text: str) -> dict[str, int] | None:
    """Verdict counts of a generated reproduce file's claims table; None if it has none."""
    t = _find_table(text, "Claims against measurements")
    if t is None:
        return None
    cols, rows = t
    j = cols.index("holds")
    verdicts = [r[j] for r in rows]
    return {v: verdicts.count(v) for v in VERDICTS}


def claims_summary(results_dir: str | os.PathLike) -> str | None:
    """The README's claims summary: per reproduce target and size, how many claims hold, do not, are within
    noise or are not comparable, from the committed ``reproduce-*.md``; None if there are none."""
    rd = Path(results_dir)
    rows = []
    totals = dict.fromkeys(VERDICTS, 0)
    for name in REPRODUCE_TARGETS:
        forms = [("quick", f"reproduce-{name}"),
                 ("full" if name in REPRODUCE_FULL_TIMED else "full, --no-timing", f"reproduce-full-{name}")]
        if name in REPRODUCE_LARGE:
            forms.append((f"full model, W={REPRODUCE_LARGE[name]}", f"reproduce-w{REPRODUCE_LARGE[name]}-{name}"))
        for form, stem in forms:
            f = rd / f"{stem}.md"
            if not f.exists():
                continue
            text = f.read_text()
            counts = claim_counts(text)
            if counts is None:
                continue
            for v in VERDICTS:
                totals[v] += counts[v]
            h = parse_header(text)
            rows.append([f"`{name}`", form, *(counts[v] for v in VERDICTS),
                         f"[{stem}.md](docs/results/{stem}.md) ({h.get('commit', '?')}, {h.get('date (UTC)', '?')})"])
    if not rows:
        return None
    table = md_table(["target", "size", "hold", "do not", "within noise", "not comparable", "measured in"], rows,
                     right=(2, 3, 4, 5))
    return (table + "\n\n" + f"{totals['yes']} hold, {totals['no']} do not, {totals['noise']} within noise, "
            f"{totals['n/a']} not comparable. `reproduce` prints each `no` with its cause in the claim's note (the "
            "paper's setting that differs here, or a claim that does not carry over); each linked file shows "
            "the notes of the commit that generated it.")
