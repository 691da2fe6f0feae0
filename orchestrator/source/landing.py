"""A landing folder: files picked up as they appear, each once, in arrival order.

The ingestion pattern of Structured Streaming's file source and Auto Loader. A file
counts once it is complete: a hidden (``.``/``_``) or ``.tmp`` name is never taken (a
writer renames the finished file in), and a file's last change must be ``stable_s``
old. Each file taken is numbered durably (``SourceFile``) before any of its chunks is
emitted, so the ledger's origin (file number, offset) names data that survives a
restart; its size is the one it had when taken, which is all the run reads of it.

A file rewritten or truncated after it was taken is never read again: the change is
reported once (an event, and the file marked ``changed``); one truncated while being
read ends where the run had read it, so coverage stays what was really ingested.

Once every chunk of a file is merged (no segment from it is unfinished), the file is
kept, moved to the archive folder or deleted, as the source's ``clean`` says (Spark's
``cleanSource``). Archived or deleted, the folder itself says where the next run starts;
kept, a named ``checkpoint`` does: a run skips the files its checkpoint's earlier runs
read (their rows are kept for as long as the runs are).

The folder (and the archive folder) is opened when the source is, by a walk from its
input root that follows no symbolic link, and held by its descriptor for the source's
life: every listing, open, stat, rename and delete is relative to it, so nothing is
read, moved or deleted through a link put in the folder's place. Each listing and each
clean-up first walks the path again: a folder that is no longer the one held (a link,
another folder, gone) fails the run, naming it (ADR 12).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fnmatch
import logging
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from balancer.units import MB
from orchestrator.ledger.events import record_event
from orchestrator.ledger.segments import StaleEpochError
from orchestrator.models import Run, Segment, SourceFile
from orchestrator.pipeline.beneath import Folder, Roots
from orchestrator.pipeline.inputs import Chunk, InputError, InputFile, chunks, measure_file
from orchestrator.source.base import SourceLag
from orchestrator.source.spec import LandingSpec

log = logging.getLogger(__name__)

# How often the folder is listed: often enough for freshness, rarely enough to cost
# nothing on a folder of many files.
SCAN_S = 0.5
# Most files taken in by one listing: a huge backlog is numbered a slice at a time.
MAX_FILES_PER_SCAN = 1000
HOUSEKEEPING_S = 2.0


class LandingFolderSource:
    unbounded = True
    partitions = 1  # files are read one after another

    def __init__(
        self,
        run_id: int,
        epoch: int,
        spec: LandingSpec,
        params: Mapping[str, Any],
        position: Mapping[str, Any],
    ) -> None:
        self.run_id, self.epoch, self.spec = run_id, epoch, spec
        self.roots = Roots(settings.INPUT_ROOTS)
        with contextlib.ExitStack() as opened:  # all closed again if one does not open
            opened.callback(self.roots.close)
            self.folder = opened.enter_context(
                self._open("landing folder", spec.folder, create=False)
            )
            self.archive: Folder | None = None
            if spec.clean == "archive":
                self.archive = opened.enter_context(
                    self._open("archive folder", spec.archive, create=True)
                )
            opened.pop_all()  # held from here until close()
        # The folder's files, opened relative to the folder held.
        self.inside = Roots((), held={spec.folder: self.folder})
        self.segment_bytes = max(1, int(float(params.get("segment_mb", 1.0)) * MB))
        self.route_by = str(params.get("route_by", "key"))
        # The position after the last chunk in the ledger, and after the last one read
        # (read ahead, maybe not yet sent).
        self.emitted_file = int(position.get("file", 0))
        offset = position.get("offset")
        self.emitted_offset = int(offset) if offset is not None else None
        self._catch_up_read_states()
        rows = list(SourceFile.objects.filter(run_id=run_id).order_by("index"))
        # The files by number from the one the ledger is in on: those before it are
        # never read again, so a run that goes on for days holds only the few ahead
        # (rows of files cleaned long ago are even deleted: numbers may have gaps).
        ahead = [r for r in rows if r.index >= self.emitted_file]
        self.files = {r.index: InputFile(r.path, r.data_start, r.size) for r in ahead}
        self.mtimes = {r.index: r.mtime_ns for r in ahead}
        self.taken = rows[-1].index + 1 if rows else 0  # the next file's number
        # What each path in the folder looked like when taken: a later change is
        # reported once (a cleaned file's name is free again). With a checkpoint, what
        # its earlier runs read is known too.
        in_folder = [r for r in rows if r.state != SourceFile.State.CLEANED]
        self.known = self._read_before() | {r.path: r.mtime_ns for r in in_folder}
        self.reported = {r.path for r in in_folder if r.changed}
        self.read_index = int(position.get("chunk", 0))
        self.read_file = self.emitted_file
        self.read_offset = self.emitted_offset
        whole = self.files.get(self.emitted_file)
        if (
            whole is not None
            and self.emitted_offset is not None
            and self.emitted_offset >= whole.size
        ):
            # Read whole, and maybe archived or deleted since: it is not opened again.
            self.read_file, self.read_offset = self.emitted_file + 1, None
        self.current: Iterator[Chunk] | None = None
        self.stopped = False
        self.finishing: int | None = None  # the file a stopped source still reads to its end
        self.last_scan = self.last_housekeeping = 0.0

    def _open(self, what: str, path: str, *, create: bool) -> Folder:
        """The folder at ``path`` walked from its input root, no component followed if
        it is a link (made when missing and ``create``)."""
        try:
            return self.roots.open_folder(path, create=create)
        except OSError as exc:
            raise InputError(f"the {what} cannot be opened: {exc}") from None

    def _check_folders(self) -> None:
        """Raise :class:`InputError` unless the path of each folder held still walks to
        the folder held: one swapped since the source opened it is never followed."""
        held = [("landing folder", self.spec.folder, self.folder)]
        if self.archive is not None:
            held.append(("archive folder", self.spec.archive, self.archive))
        for what, path, folder in held:
            with self._open(what, path, create=False) as now:
                same = now.identity == folder.identity
            if not same:
                raise InputError(
                    f"the {what} {path} was replaced by another folder since the run "
                    "opened it; the run reads and cleans only the folder it opened"
                )

    def _read_before(self) -> dict[str, int]:
        """The files that earlier runs with this checkpoint read whole over this folder,
        and completed (every chunk merged), with their modification times. A file of a
        run that failed or was cancelled is read again: that run's results were
        abandoned with it, as a query restarted from its checkpoint redoes the batches
        it had not committed."""
        if not self.spec.checkpoint:
            return {}
        rows = SourceFile.objects.filter(
            run__input_spec__kind="folder",
            run__input_spec__folder=self.spec.folder,
            run__input_spec__checkpoint=self.spec.checkpoint,
            run__status=Run.Status.COMPLETED,
            run_id__lt=self.run_id,
            state=SourceFile.State.READ,
        )
        return dict(rows.values_list("path", "mtime_ns"))

    # -- reading ----------------------------------------------------------------------

    def next_chunk(self) -> Chunk | None:
        while True:
            if self.stopped and (self.current is None or self.read_file != self.finishing):
                self.current = None  # stopped, and done with the file it was finishing
                return None
            if self.current is None:
                if self.read_file >= self.taken:
                    self._scan()
                    if self.read_file >= self.taken:
                        return None
                self.current = self._file_chunks(self.read_file)
            try:
                chunk = next(self.current, None)
            except InputError:  # gone, or swapped for a link, before this chunk was cut
                self._mark_changed(self.read_file)
                chunk = None
            if chunk is not None and self._unchanged(chunk.file_index):
                self.read_index = chunk.index + 1
                self.read_offset = chunk.offset + chunk.length
                return chunk
            # The file is read to its end (or changed under us): on to the next one.
            item = self.files[self.read_file]
            if item.size <= item.data_start:  # no record in it: no chunk will mark it read
                SourceFile.objects.filter(run_id=self.run_id, index=self.read_file).update(
                    state=SourceFile.State.READ
                )
            self.current = None
            self.read_file += 1
            self.read_offset = None

    def _file_chunks(self, index: int) -> Iterator[Chunk]:
        start = self.read_offset if self.read_offset is not None else None
        return chunks(
            self.files,
            self.spec.format,
            segment_bytes=self.segment_bytes,
            route_by=self.route_by,
            start_file=index,
            stop_file=index + 1,
            start_offset=start,
            start_index=self.read_index,
            # Copied, never linked: a file rewritten after it was taken must not change
            # what the run took (ADR 11).
            in_place=False,
            opener=self.inside,
        )

    @property
    def exhausted(self) -> bool:
        return self.stopped and self.current is None

    def committed(self, chunk: Chunk) -> None:
        for passed in range(self.emitted_file, chunk.file_index):
            self.files.pop(passed, None)  # never read again
            self.mtimes.pop(passed, None)
        self.emitted_file, self.emitted_offset = chunk.file_index, chunk.offset + chunk.length
        if self.emitted_offset >= self.files[chunk.file_index].size:
            SourceFile.objects.filter(run_id=self.run_id, index=chunk.file_index).update(
                state=SourceFile.State.READ
            )

    def stop(self, ahead: Sequence[Chunk]) -> list[Chunk]:
        """Take no new file, but finish the one the ledger has part of: a stopped run
        leaves every file it took whole, so the next run over the folder (with clean
        archive or delete) goes on exactly where this one ended."""
        item = self.files.get(self.emitted_file)
        size = item.size if item is not None else 0
        emitted = self.emitted_offset
        self.finishing = self.emitted_file if emitted is not None and emitted < size else None
        self.stopped = True
        if self.read_file != self.finishing:
            self.current = None
        return [c for c in ahead if c.file_index == self.finishing]

    def lag(self) -> SourceLag:
        """The files taken but not yet read into the ledger, and the oldest one's age."""
        entries, waiting, oldest = 0, 0, 0
        for index in range(self.emitted_file, self.taken):
            item = self.files[index]
            start = (
                self.emitted_offset
                if index == self.emitted_file and self.emitted_offset is not None
                else item.data_start
            )
            if start < item.size:
                entries += 1
                waiting += item.size - start
                oldest = oldest or self.mtimes[index]
        age = max(0.0, time.time() - oldest / 1e9) if oldest else 0.0
        return SourceLag(entries=entries, bytes=waiting, age_s=age)

    # -- the folder -------------------------------------------------------------------

    def _scan(self) -> None:
        """Take in the complete files that appeared since the last listing."""
        now = time.monotonic()
        if now - self.last_scan < SCAN_S:
            return
        self.last_scan = now
        self._check_folders()
        wall = time.time()
        found: list[tuple[int, str, int]] = []
        try:
            entries = list(self.folder.scandir())
        except OSError as exc:
            self._report_once(
                self.spec.folder, f"the landing folder cannot be listed: {exc.strerror or exc}"
            )
            return
        for entry in entries:
            name = entry.name
            if name.startswith((".", "_")) or name.endswith(".tmp"):
                continue  # still being written, by the rename-in convention
            if not fnmatch.fnmatchcase(name, self.spec.pattern):
                continue
            try:
                if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
                    continue  # a link could name a file outside the folder
                stat = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone between the listing and the look
            path = str(Path(self.spec.folder) / name)
            taken = self.known.get(path)
            if taken is not None:
                if taken != stat.st_mtime_ns:
                    self._changed_after_taken(path)
                continue
            if wall - stat.st_mtime < self.spec.stable_s:
                continue  # may still be growing
            found.append((stat.st_mtime_ns, name, stat.st_mtime_ns))
        if found:
            found.sort()
            self._take([(str(Path(self.spec.folder) / n), m) for _, n, m in found])

    def _take(self, paths: list[tuple[str, int]]) -> None:
        """Number the files durably, fenced by the driver's epoch."""
        taken: list[tuple[InputFile, int]] = []
        for path, mtime_ns in paths[:MAX_FILES_PER_SCAN]:
            try:
                taken.append((measure_file(Path(path), self.spec.format, self.inside), mtime_ns))
            except (OSError, ValueError) as exc:
                self._report_once(path, f"file {path} cannot be read: {exc}")
        if not taken:
            return
        with transaction.atomic():
            owner = Run.objects.select_for_update().filter(pk=self.run_id, epoch=self.epoch)
            refreshed = owner.values_list("references", flat=True).first()
            if refreshed is None:
                raise StaleEpochError(f"run {self.run_id} has a newer driver")
            # Under the run's lock, which a refresh of a join's table also takes: a file
            # joins the copy read last before it was taken in, whoever replays it.
            bound = {stage: str(copy["file"]) for stage, copy in refreshed.items()}
            first = self.taken
            SourceFile.objects.bulk_create(
                SourceFile(
                    run_id=self.run_id,
                    index=first + offset,
                    path=item.path,
                    size=item.size,
                    data_start=item.data_start,
                    mtime_ns=mtime_ns,
                    references=bound,
                )
                for offset, (item, mtime_ns) in enumerate(taken)
            )
        for item, mtime_ns in taken:
            self.files[self.taken] = item
            self.mtimes[self.taken] = mtime_ns
            self.taken += 1
            self.known[item.path] = mtime_ns

    def _unchanged(self, index: int) -> bool:
        """Is the file still as it was taken? Checked before each chunk of it is cut."""
        item = self.files[index]
        try:
            stat = self.folder.stat(Path(item.path).name)
            same = stat.st_mtime_ns == self.mtimes[index]
        except OSError:
            same = False
        if not same:
            self._mark_changed(index)
        return same

    def _mark_changed(self, index: int) -> None:
        """The file ends where the run had read it, reported once."""
        item = self.files[index]
        end = self.read_offset if self.read_offset is not None else item.data_start
        self.files[index] = InputFile(item.path, item.data_start, end)
        SourceFile.objects.filter(run_id=self.run_id, index=index).update(size=end, changed=True)
        self._changed_after_taken(item.path, read_to=end)

    def _changed_after_taken(self, path: str, read_to: int | None = None) -> None:
        if read_to is None:
            SourceFile.objects.filter(run_id=self.run_id, path=path).update(changed=True)
        where = f"; the run read it up to offset {read_to}" if read_to is not None else ""
        self._report_once(
            path, f"file {path} changed after it was taken in{where}; the change is not read"
        )

    def _report_once(self, path: str, text: str) -> None:
        if path in self.reported:
            return
        self.reported.add(path)
        log.warning("run %s: %s", self.run_id, text)
        record_event(self.run_id, "source_file_changed", text, data={"path": path[-300:]})

    # -- cleaning up ------------------------------------------------------------------

    def housekeeping(self, *, now: bool = False) -> None:
        """Keep, archive or delete the files whose every chunk is merged."""
        clock = time.monotonic()
        if self.spec.clean == "keep" or (
            not now and clock - self.last_housekeeping < HOUSEKEEPING_S
        ):
            return
        self.last_housekeeping = clock
        self._forget_cleaned()
        read = dict(
            SourceFile.objects.filter(run_id=self.run_id, state=SourceFile.State.READ)
            .order_by("index")
            .values_list("index", "path")[:MAX_FILES_PER_SCAN]
        )
        if not read:
            return
        self._check_folders()
        busy = set(
            Segment.objects.filter(run_id=self.run_id, origin_file__in=list(read))
            .exclude(state=Segment.State.DONE)
            .values_list("origin_file", flat=True)
            .distinct()
        )
        for index, path in read.items():
            if index in busy:
                continue
            try:
                where = self._clean(Path(path))
            except OSError as exc:
                self._report_once(path, f"file {path} could not be {self.spec.clean}d: {exc}")
                continue
            SourceFile.objects.filter(run_id=self.run_id, index=index).update(
                state=SourceFile.State.CLEANED, path=where
            )
            # The name is free again: a file landing under it later is new data.
            self.known.pop(path, None)

    def _forget_cleaned(self) -> None:
        """Rows of files cleaned long ago and below the run's merged prefix go: a run
        that goes on for days does not keep one row per file. (Only cleaned files: a
        kept file's row is what stops it being taken again.)"""
        prefix = Run.objects.values_list("merged_prefix", flat=True).get(pk=self.run_id) or {}
        below = int(prefix.get("file", 0))
        cutoff = timezone.now() - dt.timedelta(seconds=settings.BPCONSOLE_SOURCE_FILES_KEEP_S)
        SourceFile.objects.filter(
            run_id=self.run_id,
            state=SourceFile.State.CLEANED,
            index__lt=below,
            discovered_at__lt=cutoff,
        ).delete()

    def _clean(self, path: Path) -> str:
        """Archive or delete ``path`` in the folder held; returns where its data is now
        (the same path once deleted: the row keeps the name it came under)."""
        if self.archive is None:
            with contextlib.suppress(FileNotFoundError):
                self.folder.unlink(path.name)
            return str(path)
        name = path.name
        if _exists(self.archive, name):  # a name used before (a producer restarted its numbering)
            name = f"{path.stem}.run{self.run_id}-{time.time_ns()}{path.suffix}"
        try:
            self.folder.rename(path.name, self.archive, name)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            self._copy_to_archive(path, self.archive, name)
        return str(Path(self.spec.archive) / name)

    def _copy_to_archive(self, path: Path, archive: Folder, name: str) -> None:
        """Move ``path`` to an archive folder on another file system: copied through
        the two folders' descriptors, synced, then deleted from the landing folder."""
        with os.fdopen(self.folder.open_file(path.name, shown=str(path)), "rb") as source:
            created = archive.create(name, os.fstat(source.fileno()).st_mode & 0o777)
            try:
                with os.fdopen(created, "wb") as target:
                    shutil.copyfileobj(source, target)
                    target.flush()
                    os.fsync(target.fileno())
            except BaseException:
                archive.unlink(name)
                raise
        self.folder.unlink(path.name)

    def _catch_up_read_states(self) -> None:
        """Files whose last chunk reached the ledger just before a crash are read."""
        reading = SourceFile.objects.filter(run_id=self.run_id, state=SourceFile.State.READING)
        reading.filter(index__lt=self.emitted_file).update(state=SourceFile.State.READ)
        if self.emitted_offset is not None:
            reading.filter(index=self.emitted_file, size__lte=self.emitted_offset).update(
                state=SourceFile.State.READ
            )

    def close(self) -> None:
        self.current = None
        self.inside.close()  # the landing folder with it
        if self.archive is not None:
            self.archive.close()
        self.roots.close()


def _exists(folder: Folder, name: str) -> bool:
    try:
        folder.stat(name)
    except FileNotFoundError:
        return False
    return True
