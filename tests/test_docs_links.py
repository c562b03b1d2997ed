"""Every relative link in the README and docs/ reaches a file of the repo, and every ``#anchor`` a heading of it;
the README stays short and links every docs page."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub renders it: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links(path: Path) -> list[str]:
    """The relative links of ``path`` (code blocks left out)."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def broken(path: Path) -> list[str]:
    out = []
    for target in links(path):
        name, _, frag = target.partition("#")
        dest = (path.parent / name).resolve() if name else path
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            out.append(f"{target}: no heading #{frag} in {dest.name}")
    return out


def test_the_slug_is_githubs():
    assert slug("The update written into the gradient (`--output gradient`)") == \
        "the-update-written-into-the-gradient---output-gradient"
    assert slug("Why the compute row is not met by every scheme") == "why-the-compute-row-is-not-met-by-every-scheme"


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n## Some part\n\n[ok](#some-part) [ok](a.md#top) [x](#nope) "
                                   "[x](b.md) [web](https://example.org/x)\n\n```\n[code](c.md)\n```\n")
    found = broken(tmp_path / "a.md")
    assert len(found) == 2 and "#nope" in found[0] and "b.md: no such file" in found[1]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    assert broken(doc) == []


def test_there_are_links_and_anchors_to_check():
    """The checks above are not vacuous: the pages hold hundreds of relative links, dozens to a heading."""
    found = [t for doc in DOCS for t in links(doc)]
    assert len(DOCS) > 20 and len(found) > 200
    assert sum("#" in t for t in found) > 20


def test_the_readme_is_short_and_links_every_docs_page():
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 220
    readme_links = {t.split("#", 1)[0] for t in links(readme)}
    for doc in ("design", "cli", "schemes", "extending", "cluster", "gpu", "failures", "architecture",
                "performance", "performance-log", "usage", "torch"):
        assert f"docs/{doc}.md" in readme_links, f"README.md does not link docs/{doc}.md"
