"""The model families of docs/compatibility.md, surveyed again with each tested transformers: the page must say
what ORTModule does with them today (trains, with which fixes, in parity), or this fails."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "compatibility.py"


def _script():
    spec = importlib.util.spec_from_file_location("compatibility_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_is_the_data_written_out():
    script = _script()
    assert script.PAGE.read_text() == script.page(json.loads(script.DATA.read_text())), (
        "docs/compatibility.md is not docs/compatibility.json written out: python scripts/compatibility.py page")


def test_the_data_covers_every_family_and_tested_version():
    from ortlab.demo.families import FAMILIES
    from ortlab.stacks.versions import TESTED_TRANSFORMERS

    data = json.loads(_script().DATA.read_text())
    assert data["versions"] == list(TESTED_TRANSFORMERS)
    for version in TESTED_TRANSFORMERS:
        assert [row["family"] for row in data["rows"][version]] == list(FAMILIES)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("version", ["4.51.3", "5.23.0"])
@pytest.mark.ort
def test_each_family_trains_as_the_compatibility_page_says(version):
    from ortlab.stacks.versions import TESTED_TRANSFORMERS

    assert version in TESTED_TRANSFORMERS
    if version.startswith("5.") and sys.version_info < (3, 11):
        pytest.skip(f"transformers {version} needs Python 3.11")
    script = _script()
    expected = {row["family"]: row for row in json.loads(script.DATA.read_text())["rows"][version]}
    observed = script.run_survey(version)
    for row in observed:
        want = expected[row["family"]]
        assert (row["status"], row["fixes"]) == (want["status"], want["fixes"]), (
            f"{row['family']} with transformers {version}: {row['status']} {row['fixes']}, the page says "
            f"{want['status']} {want['fixes']}: python scripts/compatibility.py write")
        assert [(b["kind"], b["op"]) for b in row["blockers"]] == [(b["kind"], b["op"]) for b in want["blockers"]]
        if row["status"] != "blocked":
            assert row["parity"]["pytorch"] == row["parity"]["ortmodule"] == "ok", row
            assert row["parity"]["agree"], f"{row['family']}: the fixes did not keep the math: {row['parity']}"
