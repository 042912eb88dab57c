"""docs/arguments.md's table is what the classes generate."""

import os

import pytest

from raytrainer.arguments.docs_table import markdown_table, table_in
from tests.support import ROOT

transformers = pytest.importorskip("transformers")

DOCS = os.path.join(ROOT, "docs", "arguments.md")


def test_docs_table_is_the_generated_one():
    with open(DOCS, encoding="utf-8") as f:
        documented = table_in(f.read())
    assert documented == markdown_table(), (
        "docs/arguments.md's table is stale: run `python -m raytrainer.arguments.docs_table docs/arguments.md`")

