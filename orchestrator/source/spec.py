"""What a run reads: bounded files, a landing folder or a Redis stream, checked once.

A run's ``input_spec`` (stored on the run) says which; this module turns what an
operator asked for into a checked spec, and a stored spec back into one. Everything is
bounded: paths stay inside the input roots when a run comes from the console, a
stream's server is the embedded Redis unless an administrator listed another
(``BPCONSOLE_STREAM_URLS``), and every number has its range.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from orchestrator.pipeline.inputs import (
    FORMATS,
    MAX_PATH_CHARS,
    InputError,
    check_suffix,
    own_folder,
    through_link,
)
from orchestrator.pipeline.layout import console_folder
from orchestrator.pipeline.streams import MAX_PARTITIONS, name_problem, stream_keys

CleanMode = Literal["keep", "archive", "delete"]
CLEAN_MODES: tuple[CleanMode, ...] = ("keep", "archive", "delete")
StartAt = Literal["earliest", "latest"]
START_AT: tuple[StartAt, ...] = ("earliest", "latest")

STABLE_S = (0.0, 600.0)
LINGER_S = (0.0, 10.0)
PARTITIONS = (1, MAX_PARTITIONS)
IDLE_S = (0.0, 3600.0)
MAX_PATTERN_CHARS = 200
NAME = re.compile(r"[A-Za-z0-9:._-]{1,200}")  # a checkpoint's, or a group's on a listed server
# A consumer group on the console's Redis: a plain name. The console's own groups,
# ``bpconsole.run.<id>``, are never named by an operator: that would be joining a run.
GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
OWN_GROUPS = "bpconsole."
RUN_GROUP = re.compile(r"bpconsole\.run\.(\d+)")


@dataclass(frozen=True)
class LandingSpec:
    """A folder files land in: each complete file matching ``pattern`` is read once,
    in arrival order; ``clean`` says what becomes of a file once it is merged."""

    folder: str
    pattern: str = "*.jsonl"
    format: str = "jsonl"
    stable_s: float = 1.0
    clean: CleanMode = "keep"
    archive: str = ""
    # A named checkpoint: a run goes on after the files the checkpoint's earlier runs
    # read over this folder (Structured Streaming's checkpoint location, a name here).
    # Needed only with clean: keep, where the read files stay in the folder.
    checkpoint: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "folder",
            "folder": self.folder,
            "pattern": self.pattern,
            "format": self.format,
            "stable_s": self.stable_s,
            "clean": self.clean,
            "archive": self.archive,
            "checkpoint": self.checkpoint,
        }


@dataclass(frozen=True)
class StreamSpec:
    """A Redis stream read with a consumer group; ``url`` empty means the console's own
    Redis (so no address, and no password in it, is stored with the run), where the
    stream is the key ``bpconsole:stream:<stream>`` (orchestrator.pipeline.streams).

    With ``partitions`` above 1 the source is the streams ``<stream>:0`` to
    ``<stream>:<partitions - 1>`` (under the prefix on the console's Redis), read side by
    side as Kafka's partitions are, each with its own watermark
    (orchestrator.pipeline.watermark); a partition that gives nothing for ``idle_s``
    seconds stops holding the watermark back (0: never)."""

    stream: str
    url: str = ""
    group: str = ""
    start: StartAt = "earliest"
    linger_s: float = 0.5
    format: str = "jsonl"
    partitions: int = 1
    idle_s: float = 30.0

    @property
    def streams(self) -> list[str]:
        """The Redis key of each partition's stream, in partition order."""
        return stream_keys(self.stream, self.partitions, own=not self.url)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "stream",
            "stream": self.stream,
            "url": self.url,
            "group": self.group,
            "start": self.start,
            "linger_s": self.linger_s,
            "format": self.format,
            "partitions": self.partitions,
            "idle_s": self.idle_s,
        }


UnboundedSpec = LandingSpec | StreamSpec


def unbounded_spec(input_spec: Mapping[str, Any]) -> UnboundedSpec | None:
    """The unbounded source a stored run reads, or None for files and the generator."""
    kind = input_spec.get("kind")
    if kind == "folder":
        return LandingSpec(
            folder=str(input_spec["folder"]),
            pattern=str(input_spec.get("pattern", "*.jsonl")),
            format=str(input_spec.get("format", "jsonl")),
            stable_s=float(input_spec.get("stable_s", 1.0)),
            clean=_choice(input_spec.get("clean", "keep"), CLEAN_MODES, "clean"),
            archive=str(input_spec.get("archive", "")),
            checkpoint=str(input_spec.get("checkpoint", "")),
        )
    if kind == "stream":
        return StreamSpec(
            stream=str(input_spec["stream"]),
            url=str(input_spec.get("url", "")),
            group=str(input_spec.get("group", "")),
            start=_choice(input_spec.get("start", "earliest"), START_AT, "start"),
            linger_s=float(input_spec.get("linger_s", 0.5)),
            partitions=int(input_spec.get("partitions", 1)),
            idle_s=float(input_spec.get("idle_s", 30.0)),
        )
    return None


def is_unbounded(input_spec: Mapping[str, Any]) -> bool:
    return input_spec.get("kind") in ("folder", "stream")


def check_landing(raw: Mapping[str, Any], *, fmt: str, roots: Sequence[Path] | None) -> LandingSpec:
    """A landing-folder spec from what an operator sent; raises :class:`InputError`.

    ``roots``: the folders a console-started run may touch (None: the command line,
    which is not limited). The folder and the archive folder must lie inside them, and
    neither may be reached through a symbolic link.
    """
    if fmt not in FORMATS:
        raise InputError(f"unknown input format {fmt!r}; use one of {', '.join(FORMATS)}")
    folder = _folder(raw.get("folder"), "folder", roots, must_exist=True)
    pattern = str(raw.get("pattern") or "*." + ("jsonl" if fmt == "jsonl" else fmt))
    if len(pattern) > MAX_PATTERN_CHARS or "/" in pattern or "\x00" in pattern:
        raise InputError(
            f"a file pattern is one name pattern (no '/') of at most {MAX_PATTERN_CHARS} "
            "characters, such as *.jsonl"
        )
    fnmatch.translate(pattern)  # any text is a valid pattern; this only documents it
    check_suffix(pattern, fmt)
    stable_s = _number(raw.get("stable_s", 1.0), "stable_s", STABLE_S)
    clean = _choice(raw.get("clean", "keep"), CLEAN_MODES, "clean")
    archive = ""
    if clean == "archive":
        archive = _folder(raw.get("archive"), "archive folder", roots, must_exist=False)
        if Path(archive) == Path(folder) or Path(folder) in Path(archive).parents:
            raise InputError("the archive folder must not be the landing folder or inside it")
    elif raw.get("archive"):
        raise InputError("an archive folder is given only with clean: archive")
    checkpoint = str(raw.get("checkpoint") or "")
    if checkpoint and not NAME.fullmatch(checkpoint):
        raise InputError("a checkpoint name is 1 to 200 characters of letters, digits and ':._-'")
    return LandingSpec(folder, pattern, fmt, stable_s, clean, archive, checkpoint)


def check_stream(
    raw: Mapping[str, Any], *, default_url: str, allowed_urls: Sequence[str]
) -> StreamSpec:
    """A Redis Streams spec from what an operator sent; raises :class:`InputError`.

    The stream's server is the console's Redis unless the URL is one an administrator
    listed: a run must not become a way to make the server connect anywhere. On the
    console's Redis the name is a plain one, read under the streams' prefix, and the
    group is not one of the console's own: the broker's keys and another run's default
    group are out of reach.
    """
    url = str(raw.get("url") or "")
    if url and url != default_url and url not in allowed_urls:
        raise InputError(
            "that stream URL is not one the administrator allowed (BPCONSOLE_STREAM_URLS); "
            "leave it empty to read from the console's own Redis"
        )
    if url == default_url:
        url = ""
    stream = raw.get("stream")
    problem = name_problem(stream, own=not url)
    if problem or not isinstance(stream, str):
        raise InputError(problem)
    group = str(raw.get("group") or "")
    if group and not (NAME if url else GROUP_NAME).fullmatch(group):
        raise InputError(
            "a consumer group name is 1 to 200 characters of letters, digits and "
            + ("':._-'" if url else "'._-', starting with a letter or a digit")
        )
    if group.startswith(OWN_GROUPS):
        run = RUN_GROUP.fullmatch(group)
        whose = f"run {run[1]}'s own consumer group" if run else "the console's own"
        raise InputError(
            f"{group!r} is {whose} (groups named {OWN_GROUPS}... are the console's: a run's "
            "own group is bpconsole.run.<id>); name another, or leave it empty for the "
            "run's own"
        )
    start = _choice(raw.get("start", "earliest"), START_AT, "start")
    linger_s = _number(raw.get("linger_s", 0.5), "linger_s", LINGER_S)
    partitions = _number(raw.get("partitions", 1), "partitions", PARTITIONS)
    if partitions != int(partitions):
        raise InputError(f"partitions must be a whole number, not {partitions:g}")
    idle_s = _number(raw.get("idle_s", 30.0), "idle_s", IDLE_S)
    if partitions > 1 and len(f"{stream}:{int(partitions) - 1}") > 200:
        raise InputError("a partitioned stream's name leaves room for ':<partition>' (200)")
    return StreamSpec(
        stream, url, group, start, linger_s, partitions=int(partitions), idle_s=idle_s
    )


def _folder(raw: object, what: str, roots: Sequence[Path] | None, *, must_exist: bool) -> str:
    if not isinstance(raw, str) or not raw.strip() or "\x00" in raw or len(raw) > MAX_PATH_CHARS:
        raise InputError(f"the {what} is a path of at most {MAX_PATH_CHARS} characters")
    path = Path(raw.strip())
    if not path.is_absolute():
        path = Path(os.path.realpath(roots[0])) / path if roots else path.resolve()
    elif roots is None:
        # Recorded resolved, as a console path is: the source walks it following no link.
        path = path.resolve()
    if roots is not None:
        real_roots = [Path(os.path.realpath(r)) for r in roots]
        real = Path(os.path.realpath(path))
        if not any(real == r or r in real.parents for r in real_roots):
            allowed = ", ".join(str(r) for r in real_roots)
            raise InputError(f"the {what} {raw!r} must lie under an input folder ({allowed})")
        if through_link(path, real_roots):
            raise InputError(f"the {what} {raw!r} is reached through a symbolic link")
        owner = console_folder(real)
        if owner:
            raise InputError(f"the {what} {raw!r} is in {own_folder(owner)}")
        path = real
    if must_exist and not path.is_dir():
        raise InputError(f"the {what} {raw!r} does not exist or is not a folder")
    if must_exist and not os.access(path, os.R_OK | os.X_OK):
        raise InputError(f"the {what} {raw!r} is not readable")
    return str(path)


def _number(raw: object, what: str, bounds: tuple[float, float]) -> float:
    low, high = bounds
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(f"{what} must be a number from {low:g} to {high:g}") from None
    if not low <= value <= high:
        raise InputError(f"{what} must be from {low:g} to {high:g}, not {value:g}")
    return value


def _choice(raw: object, allowed: tuple[Any, ...], what: str) -> Any:
    if raw not in allowed:
        raise InputError(f"{what} must be one of {', '.join(allowed)}, not {str(raw)[:40]!r}")
    return raw
