"""Archive builders for source tests (imported by name: tests are not a package)."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path


def make_tar(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]], mode: str = "w:gz") -> Path:
    """A tar whose members are (name, bytes) regular files or raw TarInfo (links, devices)."""
    with tarfile.open(path, mode) as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                name, data = member
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def tar_of_dir(path: Path, directory: Path, prefix: str = "") -> Path:
    return make_tar(path, [(f"{prefix}{f.name}", f.read_bytes()) for f in sorted(directory.iterdir())])


def zip_of_dir(path: Path, directory: Path, prefix: str = "") -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for f in sorted(directory.iterdir()):
            zf.writestr(prefix + f.name, f.read_bytes())
    return path
