"""Export folders appear whole or not at all: written into a temporary directory beside the target, then renamed.

A crash, Ctrl-C or a refused conversion leaves the target as it was (absent, or the previous export with
`replace=True`); the temporary directory is removed on any error. Only SIGKILL (or a power cut) leaves it behind:
its name, .TARGET.PID@HOST.XXXX.tmp, says whose it was, and the next writer of the same target removes those
whose process has ended (never a live writer's), and puts back a previous export that a kill left moved aside
(.TARGET.PID@HOST.old, between the two renames) where the target is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nmt_cli.atomic import os_error_behind, owner_gone, owner_tag
from nmt_cli.errors import ConfigError


def check_target(target: Path, replace: bool = False, force_option: str | None = "--force") -> None:
    """Refuse a target that is a file, or a non-empty directory unless `replace` (`force_option` is the option that
    asks for it, named in the message)."""
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{target} is a file; give the path of a directory")
    if target.is_dir() and any(target.iterdir()) and not replace:
        how = f" or pass {force_option} to replace it" if force_option else " or remove it first"
        raise ConfigError(f"{target} already exists and is not empty; choose another directory{how}")


@contextmanager
def atomic_folder(target: str | os.PathLike, replace: bool = False,
                  force_option: str | None = "--force") -> Iterator[Path]:
    """Yield an empty temporary directory; when the block ends without error it becomes `target`."""
    target = Path(target)
    remove_stale(target)
    check_target(target, replace, force_option)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.{owner_tag()}.", suffix=".tmp", dir=target.parent))
    except OSError as exc:
        raise ConfigError(f"cannot write {target}: {exc.strerror or exc}; make {target.parent} writable") from exc
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; an export is an ordinary folder
        old = None
        if target.exists():  # (replace=True) move the previous export aside; put it back if the rename fails
            old = target.with_name(f".{target.name}.{owner_tag()}.old")
            os.replace(target, old)
        try:
            os.replace(tmp, target)
        except OSError:
            if old is not None:
                os.replace(old, target)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        # the system's error, also where a writer library hides it (safetensors) or an inner folder reported it
        cause = os_error_behind(exc)
        if cause is not None:
            raise ConfigError(f"cannot write {target}: {cause.strerror or cause}; {target} was left as it was. "
                              "Free disk space or make the directory writable") from exc
        raise


def remove_stale(target: Path) -> list[Path]:
    """Remove the temporary folders that killed writers of `target` left beside it (their process has ended on
    this host), first putting back a previous export moved aside by a kill where `target` is missing -> what was
    removed or put back."""
    try:
        siblings = sorted(target.parent.iterdir(), key=lambda p: not p.name.endswith(".old"))  # .old ones first
    except OSError:  # no parent yet, or one that cannot be listed (then mkdtemp's error will say so)
        return []
    pattern = re.compile(re.escape(f".{target.name}.") + r"([0-9]+@[A-Za-z0-9_-]+)\.(?:[a-z0-9_]+\.tmp|old)")
    done = []
    for path in siblings:
        found = pattern.fullmatch(path.name)
        if found is None or not path.is_dir() or not owner_gone(found.group(1)):
            continue
        if path.name.endswith(".old") and not target.exists():
            try:
                os.replace(path, target)  # the previous export, whole: the kill came between the two renames
                done.append(path)
                continue
            except OSError:
                pass
        shutil.rmtree(path, ignore_errors=True)
        done.append(path)
    return done


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
