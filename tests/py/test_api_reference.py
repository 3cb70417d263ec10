"""docs/api.md is generated from the live objects (tools/api_reference.py): it documents every public
name, and the file in the tree is what the generator gives now."""

import importlib.util

import pytest

import dtcore

from launch_helpers import ROOT

_spec = importlib.util.spec_from_file_location("api_reference", ROOT / "tools" / "api_reference.py")
api_reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(api_reference)


def test_docs_api_is_generated_from_the_objects():
    text = api_reference.api_markdown()
    for name in dtcore.__all__:
        assert f"`dtcore.{name}" in text, name
    assert "python -m dtcore.launch [OPTIONS]" in text  # the command lines' --help is in
    assert (ROOT / "docs" / "api.md").read_text() == text, (
        "docs/api.md is out of date: python tools/api_reference.py docs/api.md"
    )


def test_a_public_name_without_docstring_is_refused():
    def undocumented():
        pass

    with pytest.raises(ValueError, match="dtcore.undocumented has no docstring: every public name is documented"):
        api_reference.entry("dtcore.undocumented", undocumented)
