"""An output file a command fills after long work (`rmkit score`), checked before the work starts.

`check_output_file` runs before the model loads: the folder is created and a trial file written and removed, so
a folder that cannot be written (a read-only one, a path under a file) or an output that is a folder is one line
naming the option, not a traceback after the whole input was scored. `write_lines` then writes the lines to
`<name>.partial` beside it and renames that over the output, so an interrupted write never leaves half a file
under the output's name.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from rmkit.errors import ConfigError


def _partial(path: Path) -> Path:
    return path.with_name(path.name + ".partial")


def check_output_file(path: str | Path, key: str) -> Path:
    """`path` as a Path once a file can be written there; else a ConfigError naming `key`."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ConfigError(key, f"{path} is a folder; {key} names a file to write (e.g. {path / 'scored.jsonl'})")
    blocker = next((p for p in path.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise ConfigError(key, f"cannot write {path}: {blocker} is a file, not a folder; give {key} a file in a "
                               "folder you can write")
    trial = _partial(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        trial.open("w", encoding="utf-8").close()
        trial.unlink()
    except OSError as err:
        raise ConfigError(key, f"cannot write {path} ({err.strerror}); give {key} a file in a folder you can "
                               "write") from None
    return path


def write_lines(path: Path, lines: Iterable[str]) -> None:
    """Every line (each ending in a newline) into `path`, through `<name>.partial` and a rename."""
    partial = _partial(path)
    with open(partial, "w", encoding="utf-8") as out:
        out.writelines(lines)
    os.replace(partial, path)
