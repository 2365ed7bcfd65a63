"""What the steps of one build share (:class:`BuildContext`), and the record of its failed slides (:class:`Failures`).

:func:`wsishard.builder.run.orchestrate.build` makes one context and hands it to each step (scan, stage, extract); a
step that finds a slide failed adds it to :attr:`BuildContext.failures`, which saves it in the build's state.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from wsishard.builder.inputs.staging import Scratch
from wsishard.builder.options.buildopts import BuildOptions, BuildProgress
from wsishard.builder.run.pool import WorkerPool
from wsishard.builder.run.state import BuildState
from wsishard.progress import ProgressCallback
from wsishard.storage.output import Destination


class Failures:
    """The slides that failed after their scan (staging or extraction), by slide index, with their reasons.

    Loaded from the build's state (a resumed build knows the failures of the runs before it) and saved there
    whenever one is added.
    """

    def __init__(self, state: BuildState) -> None:
        self._state = state
        self._reasons = state.load_failed()

    def add(self, reasons: Mapping[int, str]) -> None:
        """Record these slides' failures (a slide recorded already keeps its reason); saved once if any is new."""
        new = {slide: reason for slide, reason in reasons.items() if slide not in self._reasons}
        if new:
            self._reasons.update(new)
            self._state.save_failed(self._reasons)

    def reason(self, slide: int) -> str | None:
        """Why ``slide`` failed (None: it has not)."""
        return self._reasons.get(slide)

    def among(self, slides: Iterable[int]) -> frozenset[int]:
        """Those of ``slides`` that failed."""
        return frozenset(s for s in slides if s in self._reasons)

    @property
    def slides(self) -> frozenset[int]:
        """Every slide failed so far."""
        return frozenset(self._reasons)


@dataclass(frozen=True, kw_only=True)
class BuildContext:
    """What the steps of one build share.

    Attributes:
        options: the build's options.
        dest: the output.
        state: the output's resume state (saved scans, finished shards) and its lock.
        scratch: where slides given as URLs are copied and staged, and the options to fetch them.
        pool: the worker processes.
        paths: every slide's location as read (a URL with its query string; records hold its public location).
        progress: told of each slide scanned and each shard written.
        names: the names of the slides not named by their file (a DICOM series), by public location.
    """

    options: BuildOptions
    dest: Destination
    state: BuildState
    scratch: Scratch
    pool: WorkerPool
    paths: list[str]
    progress: ProgressCallback[BuildProgress]
    names: Mapping[str, str] = field(default_factory=dict)

    @functools.cached_property
    def failures(self) -> Failures:
        """The slides that failed after their scan (loaded from the state when first asked for, by the extract step)."""
        return Failures(self.state)
