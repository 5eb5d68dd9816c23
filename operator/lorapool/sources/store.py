"""The content-addressed adapter store on the volume shared with vLLM.

Layout under the adapter directory (all on one filesystem, so renames are atomic)::

    .store/<digest>/          the adapter files, immutable once renamed into place
    .meta/<name>.json         which origin <name> currently points to (no secrets)
    .staging/                 downloads in progress; wiped on start
    <name> -> .store/<digest> the current revision of adapter <name>

``<digest>`` is the *tree digest*: sha256 over the lines ``"<sha256-of-file>  <file>\\n"``
of the kept files sorted by name, i.e. ``sha256sum $(ls | LC_ALL=C sort) | sha256sum``
in the directory. Equal content from any source lands in one directory. Dot-prefixed
names cannot collide with adapters (DNS-1123 names never start with a dot).
Blocking; the sidecar calls it from a thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from lorapool.api.report import adapter_identity as adapter_identity  # re-exported: one definition, in the API
from lorapool.sources.base import sha256_file
from lorapool.sources.layout import check_name


def tree_manifest(files: dict[str, Path]) -> dict[str, str]:
    """file name -> sha256 of its bytes."""
    return {name: sha256_file(path) for name, path in sorted(files.items())}


def tree_digest(manifest: dict[str, str]) -> str:
    lines = "".join(f"{digest}  {name}\n" for name, digest in sorted(manifest.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


@dataclass(frozen=True)
class Origin:
    """Where the content behind ``<name>`` came from."""

    identity: str  # adapter_identity(source, revision, sha256)
    source: str  # redacted URL, for humans
    revision: str | None
    resolved_revision: str | None
    digest: str  # tree digest = the .store directory name
    fetched_at: str  # RFC 3339


class AdapterStore:
    """Atomic, content-addressed storage of adapters, with named pointers."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store_dir = root / ".store"
        self.meta_dir = root / ".meta"
        self.staging_dir = root / ".staging"
        for d in (self.store_dir, self.meta_dir, self.staging_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._pins: dict[str, int] = {}

    def reset_staging(self) -> None:
        """Drop leftovers of downloads interrupted by a crash."""
        for entry in self.staging_dir.iterdir():
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)

    def staging(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="dl-", dir=self.staging_dir))

    def path_of(self, digest: str) -> Path:
        return self.store_dir / digest

    def put(self, files: dict[str, Path], manifest: dict[str, str]) -> str:
        """Move ``files`` into the store under their tree digest and pin it; return the digest.

        The caller must ``unpin`` it once a name points to it (or it is abandoned)."""
        digest = tree_digest(manifest)
        target = self.path_of(digest)
        with self._lock:
            self._pins[digest] = self._pins.get(digest, 0) + 1
            if target.is_dir():
                return digest
        build = Path(tempfile.mkdtemp(prefix="put-", dir=self.staging_dir))
        for name, path in files.items():
            os.replace(path, build / name)  # same filesystem: a rename, no copy
            (build / name).chmod(0o444)
        build.chmod(0o755)
        with self._lock:
            try:
                os.rename(build, target)
            except OSError:  # the same content arrived concurrently; keep the first
                shutil.rmtree(build, ignore_errors=True)
        return digest

    def unpin(self, digest: str) -> None:
        with self._lock:
            left = self._pins.get(digest, 0) - 1
            if left > 0:
                self._pins[digest] = left
            else:
                self._pins.pop(digest, None)

    def point(self, name: str, origin: Origin) -> Path:
        """Make ``<name>`` the adapter in ``.store/<origin.digest>``, atomically."""
        check_name(name)
        meta = self.meta_dir / f"{name}.json"
        tmp_meta = self.meta_dir / f".{name}.json.tmp"
        tmp_meta.write_text(json.dumps(asdict(origin), indent=2) + "\n")
        os.replace(tmp_meta, meta)
        link = self.root / name
        tmp_link = self.root / f".{name}.link.tmp"
        tmp_link.unlink(missing_ok=True)
        tmp_link.symlink_to(Path(".store") / origin.digest)
        os.replace(tmp_link, link)
        return self.path_of(origin.digest)

    def current(self, name: str) -> Origin | None:
        """The origin ``<name>`` points to, if its content is intact."""
        check_name(name)
        try:
            raw = json.loads((self.meta_dir / f"{name}.json").read_text())
            origin = Origin(**raw)
        except (OSError, ValueError, TypeError):
            return None
        link = self.root / name
        if not (link.is_symlink() and os.readlink(link) == str(Path(".store") / origin.digest)):
            return None
        return origin if self.path_of(origin.digest).is_dir() else None

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.meta_dir.glob("*.json") if not p.name.startswith("."))

    def remove(self, name: str) -> None:
        """Drop the pointer ``<name>``; its content goes at the next ``gc``."""
        check_name(name)
        (self.root / name).unlink(missing_ok=True)
        (self.meta_dir / f"{name}.json").unlink(missing_ok=True)

    def gc(self) -> list[str]:
        """Delete store entries no name points to and nobody has pinned; return their digests."""
        with self._lock:
            used = set(self._pins)
            for name in self.names():
                with contextlib.suppress(OSError, ValueError, TypeError):
                    used.add(json.loads((self.meta_dir / f"{name}.json").read_text())["digest"])
            removed: list[str] = []
            trash = Path(tempfile.mkdtemp(prefix="trash-", dir=self.staging_dir))
            for entry in self.store_dir.iterdir():
                if entry.name not in used:
                    os.rename(entry, trash / entry.name)  # atomic: never half-deleted in place
                    removed.append(entry.name)
        shutil.rmtree(trash, ignore_errors=True)
        return removed
