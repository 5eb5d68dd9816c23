"""The content-addressed adapter store on the volume shared with vLLM.

Layout under the adapter directory (all on one filesystem, so renames are atomic)::

    .store/<digest>/          the adapter files, immutable once renamed into place
    .meta/<name>.json         which origin <name> currently points to (no secrets)
    .staging/                 downloads in progress; wiped on start
    .kept/<key>.json          an unloaded adapter's tree kept for a place-back (``KeptTree``)
    <name> -> .store/<digest> the current revision of adapter <name>

``<digest>`` is the *tree digest*: sha256 over the lines ``"<sha256-of-file>  <file>\\n"``
of the kept files sorted by name, i.e. ``sha256sum $(ls | LC_ALL=C sort) | sha256sum``
in the directory. Equal content from any source lands in one directory. Dot-prefixed
names cannot collide with adapters (DNS-1123 names never start with a dot).
Blocking; the sidecar calls it from a thread.

Kept trees: ``keep(name)`` drops the pointer ``<name>`` but records its tree under the identity
it was downloaded for (``<key>`` = sha256 of the identity), so a later load of the same identity
``take_kept`` points at it instead of downloading; ``gc`` spares kept trees and ``forget`` drops
records (which to drop is the sidecar's pure policy, ``lorapool.sidecar.keep``). A restart of
the sidecar *keeps* them: a record is written (temp file + rename) only for a tree already
renamed whole into ``.store``, and ``kept`` reads only whole records whose tree is there, so
nothing ever acts on a half-written tree or record; ``kept_at`` is wall-clock time, so ages
and the LRU order carry over the restart.
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


@dataclass(frozen=True)
class KeptTree:
    """An unloaded adapter's tree, kept for a place-back of the same identity."""

    name: str  # the adapter it was unloaded from (a place-back may come under another name)
    identity: str
    digest: str
    bytes: int
    kept_at: float  # wall clock seconds of the unload: its last use
    origin: Origin  # what <name> pointed to; a place-back points at it again


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


class AdapterStore:
    """Atomic, content-addressed storage of adapters, with named pointers."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store_dir = root / ".store"
        self.meta_dir = root / ".meta"
        self.staging_dir = root / ".staging"
        self.kept_dir = root / ".kept"
        for d in (self.store_dir, self.meta_dir, self.staging_dir, self.kept_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._pins: dict[str, int] = {}

    def reset_staging(self) -> None:
        """Drop leftovers of downloads interrupted by a crash."""
        for entry in self.staging_dir.iterdir():
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
        for tmp in self.kept_dir.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)

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

    def in_use(self) -> set[str]:
        """Digests a name points at or a download has pinned."""
        with self._lock:
            return self._in_use()

    def _in_use(self) -> set[str]:
        used = set(self._pins)
        for name in self.names():
            with contextlib.suppress(OSError, ValueError, TypeError):
                used.add(json.loads((self.meta_dir / f"{name}.json").read_text())["digest"])
        return used

    def _kept_path(self, identity: str) -> Path:
        return self.kept_dir / f"{hashlib.sha256(identity.encode()).hexdigest()[:32]}.json"

    def keep(self, name: str, *, now: float) -> KeptTree | None:
        """Drop the pointer ``<name>`` but keep its tree for a place-back; None (and the pointer
        dropped) when it points at nothing intact."""
        check_name(name)
        with self._lock:
            origin = self.current(name)
            tree = None
            if origin is not None:
                size = tree_bytes(self.path_of(origin.digest))
                tree = KeptTree(name, origin.identity, origin.digest, size, now, origin)
                record = self._kept_path(origin.identity)
                tmp = record.with_name(f".{record.name}.tmp")
                tmp.write_text(json.dumps(asdict(tree), indent=2) + "\n")
                os.replace(tmp, record)  # recorded before the pointer goes: gc never sees it unused
            self.remove(name)
        return tree

    def kept(self) -> list[KeptTree]:
        """The kept trees, each whole: a record that does not parse or whose tree is gone is skipped."""
        out: list[KeptTree] = []
        for record in self.kept_dir.glob("[!.]*.json"):
            try:
                raw = json.loads(record.read_text())
                tree = KeptTree(**{**raw, "origin": Origin(**raw["origin"])})
            except (OSError, ValueError, TypeError, KeyError):
                continue
            if record == self._kept_path(tree.identity) and self.path_of(tree.digest).is_dir():
                out.append(tree)
        return out

    def take_kept(self, name: str, identity: str) -> KeptTree | None:
        """Point ``<name>`` at the tree kept for ``identity`` and stop keeping it; None when none is kept."""
        check_name(name)
        with self._lock:
            tree = next((t for t in self.kept() if t.identity == identity), None)
            if tree is None:
                return None
            self.point(name, tree.origin)  # in use before the record goes: gc never sees it unused
            self._kept_path(identity).unlink(missing_ok=True)
        return tree

    def forget(self, trees: list[KeptTree]) -> None:
        """Stop keeping these trees (unless kept again since they were read); the next ``gc`` deletes
        those no name points at."""
        with self._lock:
            current = {(t.identity, t.kept_at) for t in self.kept()}
            for tree in trees:
                if (tree.identity, tree.kept_at) in current:
                    self._kept_path(tree.identity).unlink(missing_ok=True)

    def gc(self) -> list[str]:
        """Delete store entries no name points to, nobody has pinned and nobody keeps; return their digests."""
        with self._lock:
            used = self._in_use() | {tree.digest for tree in self.kept()}
            removed: list[str] = []
            trash = Path(tempfile.mkdtemp(prefix="trash-", dir=self.staging_dir))
            for entry in self.store_dir.iterdir():
                if entry.name not in used:
                    os.rename(entry, trash / entry.name)  # atomic: never half-deleted in place
                    removed.append(entry.name)
        shutil.rmtree(trash, ignore_errors=True)
        return removed
