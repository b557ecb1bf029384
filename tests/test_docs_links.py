"""The docs' links resolve inside the repository, and no doc or message names an internal tracker entry."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "src").rglob("README.md")])
# Pages other branches add; a link to one is checked once it exists (empty this set once they are merged).
PENDING: set[str] = set()

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
_REPO_PATH = re.compile(r"(?<![\w/.])((?:src|docs|scripts|tests)/[\w/.\-]*\w)(?![\w<*{])")
_TRACKER = re.compile(r"\b(issues?|PR|pull request) ?#?\d+\b|\(#\d+\)", re.I)


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def _links(text: str) -> list[str]:
    return _LINK.findall(_CODE_SPAN.sub("", _FENCE.sub("", text)))


def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens, repeats numbered."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#+ +(.+?) *#*$", _FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_relative_links_resolve(doc):
    text = doc.read_text()
    broken = []
    for link in _links(text):
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc
        if ROOT not in target.parents and target != ROOT:
            broken.append(f"{link} (outside the repository)")
            continue
        if not target.exists():
            if str(target.relative_to(ROOT)) not in PENDING:
                broken.append(f"{link} (no such file)")
            continue
        if anchor and target.suffix == ".md" and anchor not in _anchors(target.read_text()):
            broken.append(f"{link} (no such heading)")
    assert not broken, f"{doc.relative_to(ROOT)}: {broken}"


def test_readme_links_every_page_of_docs():
    linked = {(ROOT / link.partition("#")[0]).resolve() for link in _links((ROOT / "README.md").read_text())}
    unlinked = [p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in linked]
    assert not unlinked, f"docs pages README.md does not link: {unlinked}"


def test_named_repository_paths_exist():
    """A path such as `src/torchkiln/runtime/limits.py` named in a doc, docstring or message exists."""
    files = [*DOCS, *(ROOT / "src").rglob("*.py"), *(ROOT / "scripts").glob("*.py"), *(ROOT / "tests").glob("*.py")]
    missing = sorted({f"{path.relative_to(ROOT)}: {name}" for path in files
                      for name in _REPO_PATH.findall(path.read_text())
                      if not (ROOT / name).exists() and name not in PENDING})
    assert not missing, missing


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_no_paths_outside_the_repository(doc):
    text = doc.read_text()
    assert not re.search(r"\.\./shared|(?<![\w.~])/work/|/home/|/tmp/", text), doc.relative_to(ROOT)


def test_no_internal_tracker_numbers():
    """A reader cannot see the project's tracker: docs, messages and comments say the thing itself."""
    files = [*DOCS, *(ROOT / "src").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]
    found = [f"{path.relative_to(ROOT)}:{number}: {match.group(0)}"
             for path in files for number, line in enumerate(path.read_text().splitlines(), 1)
             for match in _TRACKER.finditer(line)]
    assert not found, found
