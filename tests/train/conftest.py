"""Fixtures of the train tests."""

import pytest


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    f = tmp_path_factory.mktemp("c") / "corpus.txt"
    f.write_text("".join(f"sample {i}: lorem ipsum dolor {i % 7}\n" for i in range(200)))
    return f
