"""Keyed fingerprints of a conversation's content, to find its bytes after it is erased.

The physical check must look for content that no longer exists anywhere Lethe may keep it.
So, while the conversation is fenced but not yet erased, the first erasure step samples
content windows and keeps only keyed digests of them:

- A random 32-byte key per operation. Windows are 64 bytes: long enough that a digest
  confirms nothing a person could guess short of knowing the text already.
- Sampled per store: the first and last rows of each table (by primary key) and the start,
  middle and end of each value of at least 64 bytes; the start, middle and end of each
  engine file; the string values of each of the conversation's fleet rows. Values shorter
  than a window (titles, for instance) are not sampled; the logical verification covers
  them. Table values are sampled as stored in the SQLite file, engine files as their bytes
  are; on PostgreSQL only the engine folder is scanned. A fleet row's strings are sampled
  as the file holds them and in both forms JSON text takes (`\\uXXXX` escapes, as Lethe
  writes the fleet, and raw UTF-8, as most runtimes do): the file is rewritten whole by
  every write, so a copy made before holds the row in another form than the file now.
  At most MAX_WINDOWS windows, taken from the stores in turn, so every store is sampled
  however many files an earlier one holds.
- For each window, its keyed 16-byte digest, and a keyed 8-byte digest of each of its 33
  slices of 32 bytes. The scan hashes the 32 bytes at every offset that is a multiple of
  32: any occurrence of a window contains one such aligned slice, so a file is read once,
  with one hash per 32 bytes, and a slice that matches is confirmed with the window's own
  digest. A window split across database pages is not found; sampling many windows makes
  a clean scan meaningful, not a proof for every byte.
- The digests are dropped once a clean physical verification is recorded.
"""

from __future__ import annotations

import itertools
import mmap
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path

from django.db import connection

from lifecycle import fleet
from lifecycle.deletion import files
from lifecycle.enginefs import EngineHome, UnsafeEnginePath, open_regular, walk
from lifecycle.models import Conversation, ErasureFingerprint
from lifecycle.registry import RetentionClass, Store, erasure_order

WINDOW = 64
SLICE = 32
DIGEST = 16
SLICE_DIGEST = 8
ROWS_PER_STORE = 8
MAX_WINDOWS = 512
FILE_HEAD = 1 << 16


def _window_digest(secret: bytes, data: bytes) -> bytes:
    return blake2b(data, key=secret, digest_size=DIGEST, person=b"lethe-window").digest()


def _slice_digest(secret: bytes, data: bytes) -> bytes:
    return blake2b(data, key=secret, digest_size=SLICE_DIGEST, person=b"lethe-slice").digest()


def windows_of(value: bytes) -> list[bytes]:
    if len(value) < WINDOW:
        return []
    starts = {0, (len(value) - WINDOW) // 2, len(value) - WINDOW}
    return [value[s:s + WINDOW] for s in sorted(starts)]


def _table_values(store: Store, conversation_id: int) -> Iterator[bytes]:
    table, pk = store.db_table, store.model_class._meta.pk.column
    q = connection.ops.quote_name
    columns = ", ".join(q(c) for c in store.content_columns())
    half = ROWS_PER_STORE // 2
    with connection.cursor() as cursor:
        for order in ("ASC", "DESC"):
            cursor.execute(
                f"SELECT {columns} FROM {q(table)} WHERE {q(store.lookup)} = %s ORDER BY {q(pk)} {order} LIMIT {half}",
                [conversation_id],
            )
            for row in cursor.fetchall():
                for value in row:
                    if isinstance(value, str):
                        yield value.encode()
                    elif isinstance(value, bytes | memoryview):
                        yield bytes(value)


def _file_values(folder: Path) -> Iterator[bytes]:
    """The head, middle and tail of every regular file under the folder, listed and opened
    through folder descriptors (`walk`, `open_regular`): never a file outside it, even while a
    folder in it is swapped for a link. Links, FIFOs, sockets and devices are not read (opening
    a FIFO would wait for a writer for ever), nor are files this process may not read or that
    vanish meanwhile: the sample only serves the physical check, and the folder's own step
    removes them all the same."""
    for path, at, entries in walk(folder):
        for name, info in entries:
            if not stat.S_ISREG(info.st_mode):
                continue
            try:  # replaced by a FIFO or a link since: no wait, no follow
                fd = open_regular(path / name, folder=at)
            except (OSError, UnsafeEnginePath):
                continue
            with open(fd, "rb") as handle:
                size = os.fstat(fd).st_size
                if size <= FILE_HEAD * 3:
                    yield handle.read()
                    continue
                yield handle.read(FILE_HEAD)
                handle.seek(size // 2)
                yield handle.read(FILE_HEAD)
                handle.seek(size - FILE_HEAD)
                yield handle.read(FILE_HEAD)


def sample(conversation: Conversation, home: EngineHome) -> list[bytes]:
    """Content windows of the conversation from every store a delete erases or compacts, at most
    MAX_WINDOWS, taken from the stores in turn (each store's first window, then each one's
    second...): a store late in the erasure order is sampled as well as an early one. (Taken in
    order, a conversation with a few hundred artifact files filled the cap before its fleet rows,
    and a copy of the fleet file left behind was called clean.) A store's reading stops at the
    cap: no file is read for windows that could not be kept."""
    seen: set[bytes] = set()
    per_store: list[list[bytes]] = []

    def windows(values: Iterator[bytes]) -> None:
        taken: list[bytes] = []
        try:
            for value in values:
                for window in windows_of(value):
                    if window not in seen:
                        seen.add(window)
                        taken.append(window)
                if len(taken) >= MAX_WINDOWS:
                    break
        finally:
            values.close()  # (the folder and file descriptors of a walk stopped early, now)
        per_store.append(taken)

    for store in erasure_order():
        if store.retention not in (RetentionClass.ERASE, RetentionClass.COMPACT):
            continue
        if store.kind == "table" and connection.vendor == "sqlite" and store.content_columns():
            windows(_table_values(store, conversation.pk))
        elif store.kind == "file" and store.shared_file:
            path = store.paths(home, conversation)[0]
            try:
                rows = fleet.stored_children(path, conversation.public_id)
            except fleet.FleetUnreadable:
                continue  # its own step stops on it; the other stores are erased meanwhile
            windows(v for row in rows for v in fleet.row_values(row))
        elif store.kind == "file":
            try:
                folder = files.checked(home, store.paths(home, conversation)[0])
            except (files.UnsafeFolder, ValueError):
                continue  # never followed; its own step stops on it
            if folder is not None:
                windows(_file_values(folder))
    turns = itertools.zip_longest(*per_store)
    return list(itertools.islice((w for turn in turns for w in turn if w is not None), MAX_WINDOWS))


def record(operation, windows: list[bytes]) -> ErasureFingerprint:
    secret = secrets.token_bytes(32)
    digests = b"".join(_window_digest(secret, w) for w in windows)
    slices = b"".join(
        _slice_digest(secret, w[offset:offset + SLICE]) for w in windows for offset in range(WINDOW - SLICE + 1)
    )
    fingerprint, _created = ErasureFingerprint.objects.update_or_create(
        operation=operation,
        defaults={"secret": secret, "windows": digests, "grams": slices, "window_count": len(windows),
                  "conversation_id": operation.conversation_id},
    )
    return fingerprint


@dataclass(frozen=True)
class Hit:
    path: Path
    offset: int
    window: int


class Scanner:
    """Finds any fingerprinted window in raw bytes: one keyed hash per 32 aligned bytes."""

    PER_WINDOW = WINDOW - SLICE + 1

    def __init__(self, fingerprint: ErasureFingerprint) -> None:
        self.secret = bytes(fingerprint.secret)
        windows = bytes(fingerprint.windows)
        grams = bytes(fingerprint.grams)
        self.windows = [windows[i:i + DIGEST] for i in range(0, len(windows), DIGEST)]
        self.slices: dict[bytes, list[tuple[int, int]]] = {}
        for n in range(len(self.windows)):
            for offset in range(self.PER_WINDOW):
                at = (n * self.PER_WINDOW + offset) * SLICE_DIGEST
                self.slices.setdefault(grams[at:at + SLICE_DIGEST], []).append((n, offset))

    def scan_bytes(self, data, path: Path) -> list[Hit]:
        hits: list[Hit] = []
        found: set[tuple[int, int]] = set()
        secret, slices, size = self.secret, self.slices, len(data)
        for position in range(0, size - SLICE + 1, SLICE):
            matches = slices.get(_slice_digest(secret, data[position:position + SLICE]))
            if not matches:
                continue
            for window, offset in matches:
                start = position - offset
                if start < 0 or start + WINDOW > size or (window, start) in found:
                    continue
                if _window_digest(secret, data[start:start + WINDOW]) == self.windows[window]:
                    found.add((window, start))
                    hits.append(Hit(path, start, window))
        return hits

    def scan_file(self, path: Path, *, engine: bool = False) -> list[Hit]:
        """The hits in one file. An engine folder's file is opened as the engine folder's files
        are (`open_regular`): one that became a link or a FIFO since it was listed is not read."""
        try:
            with open(open_regular(path) if engine else path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size == 0:
                    return []
                with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    return self.scan_bytes(data, path)
        except (FileNotFoundError, ValueError, UnsafeEnginePath):
            return []

    def window_at(self, hit: Hit) -> bytes:
        with open(hit.path, "rb") as handle:
            handle.seek(hit.offset)
            return handle.read(WINDOW)
