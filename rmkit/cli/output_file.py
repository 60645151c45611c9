"""Where a command writes after long work (`rmkit score`'s file, `rmkit eval --report`'s folder), checked before the
work starts.

`check_output_file` and `check_output_folder` run before the model loads: a trial file is written and removed in
the nearest folder that exists on the way (nothing is created before the work is done), so a folder that cannot be written (a read-only one, a path under a file), an output file that
is a folder or the input itself is one line naming the option, not a traceback after the whole input was scored. `write_lines` then writes the lines to
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


def check_output_file(path: str | Path, key: str, source: str | Path | None = None) -> Path:
    """`path` as a Path once a file can be written there and it is not `source` (the input it is made from);
    else a ConfigError naming `key`."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ConfigError(key, f"{path} is a folder; {key} names a file to write (e.g. {path / 'scored.jsonl'})")
    if source is not None and Path(source).expanduser().resolve() == path.resolve():
        raise ConfigError(key, f"{path} is the input file: writing it would replace the records being read; give "
                               f"{key} another file")
    _try_writing(path.parent, path, key)
    return path


def check_output_folder(path: str | Path, key: str) -> Path:
    """`path` as a Path once files can be written into it (created if need be); else a ConfigError naming `key`."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(key, f"{path} is a file; {key} names a folder to write into")
    _try_writing(path, path, key)
    return path


def _try_writing(folder: Path, target: Path, key: str) -> None:
    """Write and remove a trial file in the nearest existing folder of `folder` and its parents; a ConfigError
    naming `key` and `target` when that is a file or cannot be written."""
    existing = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(key, f"cannot write {target}: {existing} is a file, not a folder; give {key} a place "
                               "you can write")
    trial = existing / f".rmkit-write-check-{os.getpid()}"
    try:
        trial.open("w", encoding="utf-8").close()
        trial.unlink()
    except OSError as err:
        raise ConfigError(key, f"cannot write {target} ({err.strerror}); give {key} a place you can write") from None


def write_lines(path: Path, lines: Iterable[str]) -> None:
    """Every line (each ending in a newline) into `path`, through `<name>.partial` and a rename."""
    partial = _partial(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(partial, "w", encoding="utf-8") as out:
        out.writelines(lines)
    os.replace(partial, path)
