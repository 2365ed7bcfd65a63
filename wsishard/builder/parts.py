"""Which part of a cluster build this process is, from the array-job engine that started it.

Each engine's own convention, read from a mapping the caller passes (the CLI passes ``os.environ``; the library
reads no environment itself):

- Slurm job arrays: ``SLURM_ARRAY_TASK_ID``, ``SLURM_ARRAY_TASK_COUNT`` (and ``SLURM_ARRAY_TASK_MIN``).
- Kubernetes Indexed Jobs: ``JOB_COMPLETION_INDEX`` (0-based); the part count is the Job's ``completions``,
  which Kubernetes does not put in the environment: it is given as ``--part-count N``.
- AWS Batch array jobs: ``AWS_BATCH_JOB_ARRAY_INDEX`` (0-based), with ``AWS_BATCH_JOB_ARRAY_SIZE`` where set,
  else ``--part-count N``.
"""

from __future__ import annotations

from collections.abc import Mapping

from wsishard.errors import OptionError

# engine, its 0-based index variable, the variable that holds the part count where it has one
_INDEXED = (
    ("a Kubernetes Indexed Job", "JOB_COMPLETION_INDEX", None),
    ("an AWS Batch array job", "AWS_BATCH_JOB_ARRAY_INDEX", "AWS_BATCH_JOB_ARRAY_SIZE"),
)


def slurm_part(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """The part of a Slurm array task (1-based), from ``SLURM_ARRAY_TASK_ID``/``_COUNT``/``_MIN``, or None."""
    try:
        task = int(environ["SLURM_ARRAY_TASK_ID"]) - int(environ.get("SLURM_ARRAY_TASK_MIN", "0"))
        count = int(environ["SLURM_ARRAY_TASK_COUNT"])
    except (KeyError, ValueError):
        return None
    return (task + 1, count) if 0 <= task < count else None


def array_part(environ: Mapping[str, str], parts: int | None = None) -> tuple[int, int] | None:
    """The part ``(i, n)`` (1-based) of this array-job task, or None outside an array job.

    Args:
        environ: the process environment.
        parts: the part count when the engine does not say it (``--part-count N``); it must agree where it does.

    Raises:
        OptionError: an index but no part count, an index outside the count, or a count that disagrees.
    """
    found = slurm_part(environ)
    if found is not None:
        return _checked(found, parts, "a Slurm array job")
    for engine, index_name, size_name in _INDEXED:
        if index_name not in environ:
            continue
        try:
            index = int(environ[index_name])
            size = int(environ[size_name]) if size_name and environ.get(size_name) else None
        except ValueError as exc:
            raise OptionError(f"{engine}: {index_name} is not an integer") from exc
        count = size or parts
        if count is None:
            raise OptionError(f"running in {engine} ({index_name}={index}): pass --part-count N, the number of tasks")
        if not 0 <= index < count:
            raise OptionError(f"{engine}: {index_name}={index} is not a task of {count} (--part-count {count})")
        return _checked((index + 1, count), parts, engine)
    return None


def _checked(part: tuple[int, int], parts: int | None, engine: str) -> tuple[int, int]:
    if parts is not None and parts != part[1]:
        raise OptionError(f"--part-count {parts}, but {engine} has {part[1]} tasks")
    return part
