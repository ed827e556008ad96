"""Every fact parser against the recorded outputs in tests/cases/<fact>/*.json."""
import json
from pathlib import Path

import pytest

from llmgw.facts import gpu, host, journal, ldd, metrics, tarlist

CASES = Path(__file__).parent / "cases"


def _journal(output):
    lines, cursor = journal.parse_journal_json(output)
    return {"lines": lines, "cursor": cursor}


PARSERS = {"discovery": host.parse_discovery, "ldd": ldd.missing_libraries, "journal": _journal,
           "gpus": gpu.parse_gpus, "metrics": metrics.parse_load, "tarlist": lambda out: [list(m) for m in tarlist.parse_listing(out)]}


def all_cases():
    for fact, parser in PARSERS.items():
        for path in sorted((CASES / fact).glob("*.json")):
            yield pytest.param(parser, path, id=f"{fact}/{path.stem}")


@pytest.mark.parametrize("parser,path", list(all_cases()))
def test_recorded_output_parses_to_expected(parser, path):
    case = json.loads(path.read_text())
    assert parser(case["output"]) == case["expected"]


def test_every_fact_has_cases():
    for fact in PARSERS:
        assert list((CASES / fact).glob("*.json")), f"no recorded cases for {fact}"
