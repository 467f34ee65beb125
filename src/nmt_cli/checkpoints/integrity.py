"""Is a file written by torch.save whole and undamaged? Checked before torch.load reads it.

torch.save writes a zip archive whose records (data.pkl, one per tensor storage) each carry a CRC-32 of their
bytes, but torch.load never compares them: a bit flipped on disk or in a copy inside a tensor's bytes loads
silently and translates garbage. `check_archive` reads every record once from a memory map and compares its CRC-32
(zlib's) with the archive's; docs/results.md#reliability has what it costs beside torch.load.
"""

from __future__ import annotations

import mmap
import zipfile
import zlib
from pathlib import Path

from nmt_cli.errors import CheckpointError

_LOCAL_HEADER = b"PK\x03\x04"  # a record's local header: 30 bytes, then its name and extra field, then its bytes


def check_archive(path: Path, fix: str, crc: bool = True) -> None:
    """Refuse (CheckpointError naming `path`, then `fix`: what the user should do) a zip archive that is incomplete,
    holds no data.pkl, or (with `crc`) has a record whose bytes do not match their CRC-32."""
    try:
        with open(path, "rb") as f, zipfile.ZipFile(f) as archive:
            records = archive.infolist()
            if not any(r.filename == "data.pkl" or r.filename.endswith("/data.pkl") for r in records):
                raise CheckpointError(f"{path}: a zip archive but not a PyTorch checkpoint (no data.pkl in it); {fix}")
            if crc and records:
                bad = _first_damaged(f, archive, records)
                if bad is not None:
                    raise CheckpointError(f"{path}: damaged (the bytes of its record {bad} do not match the checksum "
                                          f"saved with them: a bit flipped on disk or in a copy); {fix}")
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        raise CheckpointError(f"{path}: truncated or corrupt (its zip archive is incomplete or damaged: an "
                              f"interrupted copy or save?); {fix}") from None


def _first_damaged(f, archive: zipfile.ZipFile, records: list[zipfile.ZipInfo]) -> str | None:
    """The name of the first record whose CRC-32 differs from the archive's, or None."""
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data, memoryview(data) as view:
        for r in records:
            if r.CRC == 0 and r.file_size:  # written with torch's compute_crc32 off: nothing to compare with
                continue
            if r.compress_type != zipfile.ZIP_STORED:  # torch stores; another writer may compress: zipfile checks
                try:
                    with archive.open(r) as entry:
                        while entry.read(1 << 24):
                            pass
                except zipfile.BadZipFile:
                    return r.filename
                continue
            at = r.header_offset
            if view[at:at + 4] != _LOCAL_HEADER:
                return r.filename
            start = at + 30 + int.from_bytes(view[at + 26:at + 28], "little") + int.from_bytes(view[at + 28:at + 30],
                                                                                               "little")
            if start + r.compress_size > len(view) or zlib.crc32(view[start:start + r.compress_size]) != r.CRC:
                return r.filename
    return None
