"""`lambdactl tables load`'s file reading: CSV and JSON Lines rows as table records, checked
before anything is sent (a file with an invalid row is refused whole, naming its lines)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from lambdactl.tables import TableFileError, table_records
from shared.config import TableConfig

TABLE = TableConfig(name="pages", topic="pages", key_field="page", time_field="valid_from")


def test_csv_rows_become_records_keyed_by_the_table_key(tmp_path: Path) -> None:
    path = tmp_path / "pages.csv"
    path.write_text(
        "page,section,valid_from,rank\n"
        "/a,news,2020-01-01T00:00:00Z,7\n"
        "7,sport,1780000000000,007\n"
        "/b,,1780000000000,\n"
    )
    records = table_records(TABLE, path, 0)
    assert [r.key for r in records] == [b"/a", b"7", b"/b"]
    values = [orjson.loads(r.value) for r in records]
    assert values[0] == {
        "page": "/a",
        "section": "news",
        "valid_from": "2020-01-01T00:00:00Z",
        "rank": 7,
    }
    assert values[1] == {"page": 7, "section": "sport", "valid_from": 1780000000000, "rank": "007"}
    assert values[2] == {"page": "/b", "valid_from": 1780000000000}, "an empty cell is absent"


def test_json_lines_are_sent_as_written(tmp_path: Path) -> None:
    path = tmp_path / "pages.jsonl"
    path.write_text(
        '{"page": "/a", "valid_from": 5, "meta": {"owner": "x"}}\n\n'
        '{"page": "/a", "valid_from": 9, "deleted": true}\n'
    )
    records = table_records(TABLE, path, 0)
    assert [orjson.loads(r.value)["valid_from"] for r in records] == [5, 9]


@pytest.mark.parametrize(
    ("name", "content", "problems"),
    [
        (
            "t.csv",
            "page,valid_from\n,5\n/a,yesterday\n/b,5\n",
            ["line 2: key_missing", "line 3: time_invalid"],
        ),
        (
            "t.jsonl",
            '{"page": "/a", "valid_from": 5}\nnot json\n[1]\n',
            ["line 2: not_json", "line 3: not_object"],
        ),
        ("t.txt", "page\n", [".csv or .jsonl"]),
    ],
)
def test_a_file_with_an_invalid_row_is_refused_whole(
    tmp_path: Path, name: str, content: str, problems: list[str]
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(TableFileError) as refused:
        table_records(TABLE, path, 0)
    for problem in problems:
        assert problem in str(refused.value)
