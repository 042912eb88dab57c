"""The documentation holds together: every relative link in the project's Markdown pages leads to a file or
folder of the repository (and, for a link to a heading, to a heading that exists), and every numbered
principle that a comment in the code cites is a numbered principle of docs/design.md.

Plain file reading: no Ray, no torch, a few milliseconds.
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote

import pytest

from tests.support import ROOT

while not os.path.isfile(os.path.join(ROOT, "pyproject.toml")) and os.path.dirname(ROOT) != ROOT:
    ROOT = os.path.dirname(ROOT)  # the tests may move into sub-folders: find the repository root

DESIGN = "docs/design.md"
# Folders that are not the project's own text: environments, build output, caches, git's data.
SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "node_modules", "__pycache__", ".pytest_cache",
             ".ruff_cache"}
CODE_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".sh", ".txt")

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?!`).*?(?<!`)\1", re.S)
LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.+?)\s*#*\s*$", re.M)
CITED = re.compile(r"\bprinciples? (\d+)", re.I)
NUMBERED = re.compile(r"^(\d+)\. ", re.M)


@pytest.fixture(autouse=True)
def no_leaked_process_group():
    """Replaces the suite's guard of the same name (tests/conftest.py) for this module: these tests start no
    process group, and the guard's import of raytrainer (torch, Ray) would cost seconds."""
    yield


def read(relative: str) -> str:
    with open(os.path.join(ROOT, relative), encoding="utf-8") as f:
        return f.read()


def pages() -> list[str]:
    """The Markdown pages a user reads: the README, docs/, and the READMEs of benchmarks/, cluster/, k8s/."""
    found = ["README.md", "benchmarks/README.md", "cluster/README.md"]
    for folder in ("docs", "k8s"):
        if os.path.isdir(os.path.join(ROOT, folder)):
            found += sorted(f"{folder}/{name}" for name in os.listdir(os.path.join(ROOT, folder))
                            if name.endswith(".md"))
    return [page for page in found if os.path.isfile(os.path.join(ROOT, page))]


def prose(text: str) -> str:
    """The text without code blocks and inline code, where brackets and parentheses are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (but `-` and `_`), spaces to `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"[^\w\- ]", "", text.replace("`", "").strip().lower())
    return text.replace(" ", "-")


def anchors(page: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, title in HEADING.findall(FENCE.sub("", read(page))):
        base = slug(title)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: str) -> list[str]:
    problems = []
    folder = os.path.dirname(page)
    for target in LINK.findall(prose(read(page))):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # https:, mailto:, ...: not ours to check
            continue
        path, _, anchor = target.partition("#")
        path = unquote(path)
        resolved = os.path.normpath(os.path.join(folder, path)) if path else page
        if path.startswith("/") or resolved == ".." or resolved.startswith(".." + os.sep):
            problems.append(f"{page}: {target} points outside the repository")
            continue
        if not os.path.exists(os.path.join(ROOT, resolved)):
            problems.append(f"{page}: {target} -> {resolved} does not exist")
            continue
        if anchor and resolved.endswith(".md") and unquote(anchor).lower() not in anchors(resolved):
            problems.append(f"{page}: {target} -> no heading #{anchor} in {resolved}")
    return problems


def test_the_pages_exist():
    for page in ("README.md", DESIGN, "benchmarks/README.md"):
        assert os.path.isfile(os.path.join(ROOT, page)), f"{page} is missing"


@pytest.mark.parametrize("page", pages())
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_slug_is_githubs():
    assert slug("`ray_data.py`: Ray Data input against a map-style dataset") == \
        "ray_datapy-ray-data-input-against-a-map-style-dataset"
    assert slug("Layers: lower never imports upper") == "layers-lower-never-imports-upper"
    assert slug("One run per `output_dir`") == "one-run-per-output_dir"
    assert slug("Sharded checkpoints (FSDP)") == "sharded-checkpoints-fsdp"


def numbered_principles() -> set[int]:
    """The numbers of the list under docs/design.md's "Principles" heading."""
    text = FENCE.sub("", read(DESIGN))
    match = re.search(r"^## Principles\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f'{DESIGN} has no "## Principles" section'
    return {int(n) for n in NUMBERED.findall(match.group(1))}


def cited_principles() -> dict[int, list[str]]:
    """{principle number: ["file:line", ...]} for every citation in the repository's text files."""
    cited: dict[int, list[str]] = {}
    for directory, folders, files in os.walk(ROOT):
        folders[:] = [f for f in folders if f not in SKIP_DIRS and not f.endswith(".egg-info")]
        for name in files:
            relative = os.path.relpath(os.path.join(directory, name), ROOT)
            if not name.endswith(CODE_SUFFIXES) or relative == os.path.normpath(DESIGN):
                continue
            try:
                text = read(relative)
            except UnicodeDecodeError:
                continue
            for match in CITED.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                cited.setdefault(int(match.group(1)), []).append(f"{relative}:{line}")
    return cited


def test_principles_are_numbered_from_one():
    numbers = numbered_principles()
    assert numbers and numbers == set(range(1, max(numbers) + 1)), sorted(numbers)


def test_every_cited_principle_exists_in_design_md():
    numbers = numbered_principles()
    missing = {n: where for n, where in cited_principles().items() if n not in numbers}
    assert not missing, f"cited but not in {DESIGN}'s numbered principles: {missing}"
