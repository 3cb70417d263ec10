"""docs/knobs.md lists exactly the knobs the C++ registry declares, with the same defaults and docs."""

import re
from pathlib import Path

from dtcore import _C

DOC = Path(__file__).resolve().parents[2] / "docs" / "knobs.md"


def test_docs_table_matches_the_registry():
    rows = []
    for line in DOC.read_text().splitlines():
        m = re.match(r"\| `(DTCORE_\w+)` \|\s*`?([^|`]*?)`?\s*\| (.*) \|$", line)
        if m:
            rows.append((m.group(1), m.group(2).strip(), m.group(3).strip()))
    assert rows == [tuple(k) for k in _C.knobs()]


def test_undeclared_knob_is_a_bug_not_a_silent_default():
    import pytest

    with pytest.raises(Exception, match="not declared"):
        _C.knob_value("DTCORE_NO_SUCH_KNOB")
    assert _C.knob_value("DTCORE_TIMEOUT", {}) == "300"
    assert _C.knob_value("DTCORE_TIMEOUT", {"DTCORE_TIMEOUT": "7"}) == "7"
    assert _C.knob_value("DTCORE_RANK", {}) is None
