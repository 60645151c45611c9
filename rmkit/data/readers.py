"""Read raw records from JSON Lines, JSON, Parquet or a Hugging Face dataset, each with its position.

Every reader yields, in file order, either a `RawRecord` (a dict and where it came from) or the
`DataError` that describes a line that could not be read (invalid JSON, a non-UTF-8 byte, not an
object), so the caller decides whether a bad line is fatal or skipped. A file with no records at all
is always an error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rmkit.errors import ConfigError, DataError

JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSON_SUFFIXES = (".json",)
PARQUET_SUFFIXES = (".parquet", ".pq")


@dataclass(frozen=True)
class RawRecord:
    """One record as read: `line` is 1-based for JSON Lines, else the 0-based record index."""

    path: str
    line: int
    data: dict
    line_oriented: bool = True

    @property
    def source(self) -> str:
        return f"{self.path}:{self.line}" if self.line_oriented else f"{self.path}[{self.line}]"

    def error(self, field: str | None, message: str) -> DataError:
        """A `DataError` located at this record."""
        return DataError(self.path, self.line, field, message)


def read_jsonl(path: str | Path) -> Iterator[RawRecord | DataError]:
    """Records of a JSON Lines file; blank lines are ignored, line numbers are 1-based."""
    path = str(path)
    seen = False
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield DataError(path, number, None, f"not valid UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})")
                seen = True
                continue
            if number == 1:
                text = text.removeprefix("\ufeff")  # a UTF-8 byte order mark
            if not text.strip():
                continue
            seen = True
            try:
                data = json.loads(text.rstrip("\r\n"))  # with its newline, a cut line's error is "line 2 column 1"
            except json.JSONDecodeError as err:
                yield DataError(path, number, None, f"invalid JSON: {err.msg} (column {err.colno})")
                continue
            if not isinstance(data, dict):
                yield DataError(path, number, None, f"expected a JSON object, got {type(data).__name__}")
                continue
            if "\\u" in text and (bad := unencodable(data)) is not None:  # only an escape makes a lone surrogate
                yield DataError(path, number, *bad)
                continue
            yield RawRecord(path, number, data)
    if not seen:
        raise DataError(path, None, None, "the file is empty (no records)")


def unencodable(data: dict) -> tuple[str, str] | None:
    """`(field, message)` for the first field of a record whose text holds a lone UTF-16 surrogate (JSON allows the
    escape `\\ud800` alone; it is not a character, and no tokenizer can encode it), else None."""
    for key, value in data.items():
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as err:
            char = err.object[err.start]
            return str(key), (f"holds a lone surrogate (\\u{ord(char):04x}), which is not text: no tokenizer can encode "
                              "it; fix or drop this record")
    return None


def read_json(path: str | Path) -> Iterator[RawRecord | DataError]:
    """Records of a JSON file holding a list of objects (or `{"data": [...]}`); 0-based indices."""
    path = str(path)
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise DataError(path, line, None, f"not valid UTF-8 (byte 0x{raw[err.start]:02x})") from None
    if not text.strip():
        raise DataError(path, None, None, "the file is empty (no records)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(path, err.lineno, None, f"invalid JSON: {err.msg} (column {err.colno})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if isinstance(data, dict):  # a single record
        data = [data]
    if not isinstance(data, list):
        raise DataError(path, None, None, "expected a JSON list of objects")
    if not data:
        raise DataError(path, None, None, "the file is empty (no records)")
    yield from _from_rows(path, data, may_hold_surrogates="\\u" in text)


def read_parquet(path: str | Path) -> Iterator[RawRecord | DataError]:
    """Records of a Parquet file (needs `pyarrow`, the `data` extra); 0-based row indices."""
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - depends on the environment
        raise DataError(str(path), None, None, "reading Parquet needs pyarrow: pip install 'rmkit[data]'") from None
    try:
        rows = pq.read_table(str(path)).to_pylist()
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise DataError(str(path), None, None, f"not a readable Parquet file ({err})") from None
    if not rows:
        raise DataError(str(path), None, None, "the file is empty (no records)")
    yield from _from_rows(str(path), rows)


def read_hf_dataset(name_or_path: str, split: str = "train") -> Iterator[RawRecord | DataError]:
    """Records of a Hugging Face dataset: a `save_to_disk` directory, or a name `load_dataset` knows
    (a hub id, or a local folder of data files)."""
    try:
        import datasets
    except ImportError:  # pragma: no cover - depends on the environment
        raise DataError(name_or_path, None, None, "reading datasets needs `datasets`: pip install 'rmkit[data]'") from None
    path = Path(name_or_path)
    try:
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            loaded = datasets.load_from_disk(str(path))
            dataset = loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
        else:
            dataset = datasets.load_dataset(name_or_path, split=split)
    except (OSError, KeyError, ValueError, datasets.exceptions.DatasetsError) as err:
        raise DataError(name_or_path, None, None, f"cannot load dataset split '{split}': {err}") from None
    if len(dataset) == 0:
        raise DataError(name_or_path, None, None, f"split '{split}' is empty (no records)")
    yield from _from_rows(f"{name_or_path}:{split}" if split != "train" else name_or_path, dataset)


def _from_rows(path: str, rows, may_hold_surrogates: bool = False) -> Iterator[RawRecord | DataError]:
    """`rows` as records; `may_hold_surrogates`: the source is JSON text with `\\u` escapes (Parquet's and Arrow's
    strings are valid UTF-8, so only an escape can make a lone surrogate: `unencodable` runs only then)."""
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            yield DataError(path, index, None, f"expected an object, got {type(row).__name__}")
        elif may_hold_surrogates and (bad := unencodable(row)) is not None:
            yield DataError(path, index, *bad)
        else:
            yield RawRecord(path, index, row, line_oriented=False)


READ = "rmkit reads JSON Lines (.jsonl), JSON (.json) and Parquet (.parquet) files, and Hugging Face datasets"
NOT_DATA = (".md", ".txt", ".gitattributes", ".lock")  # what a dataset folder holds beside its data files


def unread_folder(folder: Path) -> str | None:
    """Why rmkit cannot read a local folder of data files (not a `save_to_disk` folder): none of them, or files of
    more than one kind, or of a kind it does not read. `load_dataset` on such a folder reads the most common kind
    and leaves the other files out without a word. None when its files are all `.jsonl`/`.json` or all `.parquet`."""
    if (folder / "dataset_info.json").exists() or (folder / "dataset_dict.json").exists():
        return None
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not any(part.startswith(".") for part in
                   p.relative_to(folder).parts) and not p.name.lower().endswith(NOT_DATA))
    kinds = {"json" if p.name.lower().endswith(JSONL_SUFFIXES + JSON_SUFFIXES) else
             "parquet" if p.name.lower().endswith(PARQUET_SUFFIXES) else p.suffix.lower() or p.name for p in files}
    if not files:
        return f"a folder with no data file in it; {READ}"
    if len(kinds) == 1 and kinds <= {"json", "parquet"}:
        return None
    other = [p for p in files if not p.name.lower().endswith(JSONL_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES)]
    shown = ", ".join(str(p.relative_to(folder)) for p in (other or files)[:3])
    return (f"a folder of mixed files ({shown}{', ...' if len(other or files) > 3 else ''}): a folder is read as "
            "one dataset of one kind, and the files of other kinds would be left out; keep only .jsonl/.json or only "
            ".parquet files in it, or give one file")


def unread_file(path: str | Path) -> str | None:
    """Why rmkit cannot read `path`, when it is a local file of another kind than `.jsonl`, `.json`, `.parquet` (a
    CSV, a compressed file, ...: such a file would otherwise be taken for a Hub dataset name), or a local folder
    `unread_folder` refuses. None otherwise."""
    local = Path(path).expanduser()
    if local.is_dir():
        return unread_folder(local)
    if not local.is_file() or str(path).lower().endswith(JSONL_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES):
        return None
    read = READ
    if local.suffix.lower() in (".gz", ".bz2", ".xz", ".zst", ".zip"):
        return f"a compressed file: {read}; decompress it first (e.g. gunzip -k {local.name})"
    if local.suffix.lower() in (".csv", ".tsv"):
        sep = "\\t" if local.suffix.lower() == ".tsv" else ","
        return (f"{read}; convert the table first: python -c \"import pandas as pd; pd.read_csv('{local}', "
                f"sep='{sep}').to_json('{local.with_suffix('.jsonl')}', orient='records', lines=True)\"")
    return f"{read}; convert it to one of them"


def read_records(path: str | Path, split: str = "train") -> Iterator[RawRecord | DataError]:
    """Dispatch on the path: `.jsonl`, `.json`, `.parquet`, else a Hugging Face dataset (directory or
    name). Another local file (a CSV, a `.jsonl.gz`) is a DataError saying what is read."""
    text = str(path)
    lower = text.lower()
    local = Path(text)
    if (why := unread_file(text)) is not None:
        raise DataError(text, None, None, why)
    if lower.endswith(JSONL_SUFFIXES) or lower.endswith(JSON_SUFFIXES) or lower.endswith(PARQUET_SUFFIXES):
        if not local.is_file():
            raise DataError(text, None, None, "no such file")
        if lower.endswith(JSONL_SUFFIXES):
            return read_jsonl(text)
        return read_json(text) if lower.endswith(JSON_SUFFIXES) else read_parquet(text)
    return read_hf_dataset(text, split)


def first_record(path: str | Path, split: str = "train") -> RawRecord | None:
    """The first readable record of `path` (`read_records`), None when no record is readable."""
    return next((item for item in read_records(path, split) if isinstance(item, RawRecord)), None)


def check_data_path(path: str | Path, key: str) -> None:
    """A ConfigError naming `key` when `path` cannot hold data, before anything loads: a file name (`.jsonl`,
    `.json`, `.parquet`) that is not a file, or a path that does not exist and is no Hub dataset name
    (`name` or `org/name`, with no part of it on disk)."""
    text, local = str(path), Path(path).expanduser()
    lower = text.lower()
    if (why := unread_file(text)) is not None:
        raise ConfigError(key, f"{text} is {why}" if why.startswith("a compressed") else f"{text}: {why}")
    where = f" (a relative path is read from the folder you run in, {Path.cwd()})" if not local.is_absolute() else ""
    if lower.endswith(JSONL_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES):
        if not local.is_file():
            raise ConfigError(key, f"no such file: {text}{where}" if not local.exists() else f"{text} is not a file")
        try:
            open(local, "rb").close()
        except OSError as err:
            raise ConfigError(key, f"cannot read {text} ({err.strerror}); give a file this user can read") from None
    elif not local.exists() and not _hub_name(text):
        raise ConfigError(key, f"no such file or dataset directory: {text}{where}")


def _hub_name(text: str) -> bool:
    return bool(re.fullmatch(r"[\w.-]+(/[\w.-]+)?", text)) and not Path(text.split("/")[0]).exists()
