"""A run whose every record would be quarantined is refused when it is created: the first
input file's first records lack a field an aggregating node reads
(orchestrator/run/lifecycle.py, orchestrator/pipeline/sample.py ``unread_fields``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from orchestrator.models import Run
from orchestrator.run.lifecycle import RunError, create_run
from tests.orchestrator.run.scenarios import REFERENCE, policy

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def _reference(fmt: str = "jsonl", **params: Any) -> dict[str, Any]:
    doc: dict[str, Any] = copy.deepcopy(yaml.safe_load(REFERENCE.read_text()))
    doc["nodes"][0]["params"]["format"] = fmt
    for node in doc["nodes"][1:4]:
        node["params"] = {**node["params"], **params}
    return doc


def _jsonl(path: Path, records: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_records_without_the_value_field_are_refused_saying_which_node_reads_it(
    tmp_path: Path,
) -> None:
    data = _jsonl(tmp_path / "flights.jsonl", [{"key": "UA", "amount": 3, "user": "N1"}] * 5)
    with pytest.raises(RunError) as refused:
        create_run(topology=_reference(), policy=policy(), input_path=data)
    message = str(refused.value)
    assert message.startswith("every record would be quarantined: task1 reads 'value' (value)")
    assert f"none of the first 5 records of {data} has" in message
    assert "nothing was created" in message
    assert not Run.objects.exists()


def test_a_field_in_another_case_or_present_in_some_records_is_not_refused(
    tmp_path: Path,
) -> None:
    records = [{"KEY": "a", "Value": 1, "user": "u"}] * 3 + [{"key": "b", "value": 2}]
    data = _jsonl(tmp_path / "mixed.jsonl", records)
    assert create_run(topology=_reference(), policy=policy(), input_path=data).pk
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert create_run(topology=_reference(), policy=policy(), input_path=str(empty)).pk


def test_a_csv_header_and_a_parquet_footer_say_which_fields_there_are(tmp_path: Path) -> None:
    csv_file = tmp_path / "t.csv"
    csv_file.write_text("\ufeffkey,value\na,1\n")
    with pytest.raises(RunError, match=r"task1 reads 'user' \(distinct\)"):
        create_run(topology=_reference("csv"), policy=policy(), input_path=str(csv_file))
    parquet_file = tmp_path / "t.parquet"
    pq.write_table(pa.table({"k": ["a"], "value": [1.0], "user": ["u"]}), parquet_file)
    with pytest.raises(RunError, match=r"task1 reads 'key' \(key\), which none of the first 1"):
        create_run(topology=_reference("parquet"), policy=policy(), input_path=str(parquet_file))
    # (a header's byte-order mark does not hide its first field)
    csv_file.write_text("\ufeffkey,value,user\na,1,u\n")
    assert create_run(topology=_reference("csv"), policy=policy(), input_path=str(csv_file)).pk


def test_a_windowed_pipeline_needs_its_event_time_field(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "events.jsonl", [{"key": "a", "value": 1, "user": "u", "ts": 5}])
    windowed = _reference(window_s=60)
    with pytest.raises(RunError, match=r"task1 reads 'event_time' \(event_time\)"):
        create_run(topology=windowed, policy=policy(), input_path=data)
    ok = _reference(window_s=60, event_time="ts")
    assert create_run(topology=ok, policy=policy(), input_path=data).pk


def test_grouped_measures_read_a_field_no_record_has_as_null_and_start(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "flights.jsonl", [{"key": "UA", "user": "N1"}] * 5)
    doc = _reference()
    for node in doc["nodes"][1:4]:
        node["params"] = {
            "group_by": ["key"],
            "measures": [{"name": "mean", "fn": "avg", "field": "value"}],
        }
    # Nothing would be quarantined: each group's mean is null, as SQL's would be
    assert create_run(topology=doc, policy=policy(), input_path=data).pk
