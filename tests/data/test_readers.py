"""JSON, Parquet and Hugging Face dataset sources give the same records as JSON Lines."""

import json

import pytest

from rmkit.data import load_preference_data, load_validation_sets
from rmkit.errors import DataError

from .conftest import write_jsonl

ROWS = [{"prompt": "Q1", "chosen": "a", "rejected": "b", "margin": 1.0}, {"prompt": "Q2", "chosen": "c", "rejected": "d"}]


def as_tuples(result):
    return [(p.prompt, p.chosen, p.rejected, p.margin) for p in result.records]


def test_json_array_and_wrapped(tmp_path):
    expected = as_tuples(load_preference_data(write_jsonl(tmp_path / "d.jsonl", ROWS)))
    array = tmp_path / "d.json"
    array.write_text(json.dumps(ROWS))
    result = load_preference_data(array)
    assert as_tuples(result) == expected and result.records[1].source == f"{array}[1]"
    wrapped = tmp_path / "w.json"
    wrapped.write_text(json.dumps({"data": ROWS}))
    assert as_tuples(load_preference_data(wrapped)) == expected


def test_json_errors_name_file_and_position(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[\n{"prompt": "Q"},\n{oops}\n]')
    with pytest.raises(DataError, match=rf"{bad}:3: invalid JSON"):
        load_preference_data(bad)
    missing = tmp_path / "m.json"
    missing.write_text(json.dumps([ROWS[0], {"prompt": "Q", "chosen": "a"}]))
    with pytest.raises(DataError, match=rf"{missing}:1: field 'rejected': missing") as info:
        load_preference_data(missing)
    assert info.value.line == 1  # the 0-based record index for non-line files
    empty = tmp_path / "e.json"
    empty.write_text("[]")
    with pytest.raises(DataError, match="empty"):
        load_preference_data(empty)


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    result = load_preference_data(path)
    assert as_tuples(result) == [("Q1", "a", "b", 1.0), ("Q2", "c", "d", None)]
    assert result.records[0].source == f"{path}[0]"


def test_hf_dataset_saved_to_disk_and_local_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(saved))
    assert as_tuples(load_preference_data(saved)) == [("Q1", "a", "b", 1.0), ("Q2", "c", "d", None)]
    dict_dir = tmp_path / "dict"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(ROWS[:1])}).save_to_disk(str(dict_dir))
    assert len(load_preference_data(dict_dir, split="test").records) == 1
    # A folder of data files loads through `datasets.load_dataset`, as a hub id would.
    folder = tmp_path / "repo"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", ROWS)
    assert len(load_preference_data(str(folder)).records) == 2


def test_unknown_dataset_is_a_data_error(tmp_path):
    pytest.importorskip("datasets")
    with pytest.raises(DataError, match="cannot load dataset"):
        load_preference_data(str(tmp_path / "no_such_dataset"))


def test_validation_sets(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", ROWS)
    b = write_jsonl(tmp_path / "b.jsonl", ROWS[:1])
    sets = load_validation_sets({"hh": a, "other": b})
    assert {name: len(r.records) for name, r in sets.items()} == {"hh": 2, "other": 1}
    assert list(load_validation_sets(a)) == ["validation"]


def test_a_cut_json_line_names_the_column_where_it_stops(tmp_path):
    """A line cut after 45 characters: the error is at column 46 of that line, not "column 1" of the next."""
    path = tmp_path / "cut.jsonl"
    line = json.dumps({"prompt": "What is 2 plus 2?", "chosen": "4"})[:-1]  # the closing brace lost
    path.write_text(json.dumps(ROWS[0]) + "\n" + line + "\n")
    with pytest.raises(DataError) as err:
        load_preference_data(path)
    assert len(line) == 45 and str(err.value) == f"{path}:2: invalid JSON: Expecting ',' delimiter (column 46)"


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_lone_surrogate_escape_is_the_records_error(tmp_path, suffix):
    """Valid JSON, not text: JSON Lines and JSON arrays name the record and the field."""
    good = '{"prompt": "q", "chosen": "a", "rejected": "b"}'
    bad = '{"prompt": "q", "chosen": "x \\ud800 y", "rejected": "b"}'
    path = tmp_path / f"pairs{suffix}"
    path.write_text(f"{good}\n{bad}\n" if suffix == ".jsonl" else f"[{good}, {bad}]")
    where = f"{path}:2" if suffix == ".jsonl" else f"{path}:1"
    with pytest.raises(DataError, match=rf"{where}: field 'chosen': holds a lone surrogate \(\\ud800\)"):
        load_preference_data(path)
