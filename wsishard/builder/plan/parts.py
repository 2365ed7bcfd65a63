"""Which part of a cluster build this process is, from the array-job engine that started it.

Each engine's own convention, read from a mapping the caller passes (the CLI passes ``os.environ``; the library
reads no environment itself):

- Slurm job arrays: ``SLURM_ARRAY_TASK_ID``, ``SLURM_ARRAY_TASK_COUNT`` (and ``SLURM_ARRAY_TASK_MIN``, ``_MAX``,
  ``_STEP``): an evenly spaced range of task ids (``--array=0-9``, ``--array=1-19:2``).
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
    """The part of a Slurm array task (1-based), from ``SLURM_ARRAY_TASK_ID``/``_COUNT``/``_MIN`` (and ``_STEP``,
    ``_MAX`` where set), or None outside a Slurm array job.

    Raises:
        OptionError: a variable that is not an integer, a task id that is not one of the array's ``COUNT``
            evenly spaced ids from ``MIN``, or an array that is not such a range (``--array=0,5,7``): each task
            must know which part it is, or parts would be built twice or never.
    """
    if "SLURM_ARRAY_TASK_ID" not in environ:
        return None
    names = (
        "SLURM_ARRAY_TASK_ID",
        "SLURM_ARRAY_TASK_COUNT",
        "SLURM_ARRAY_TASK_MIN",
        "SLURM_ARRAY_TASK_MAX",
        "SLURM_ARRAY_TASK_STEP",
    )
    values: dict[str, int] = {}
    for name in names:
        text = environ.get(name, "").strip()
        if text and not text.lstrip("-").isdigit():
            raise OptionError(f"a Slurm array job: {name}={text!r} is not an integer")
        if text:
            values[name] = int(text)
    task, count = values.get("SLURM_ARRAY_TASK_ID"), values.get("SLURM_ARRAY_TASK_COUNT")
    if task is None or count is None or count < 1:
        given = ", ".join(f"{name}={environ.get(name)!r}" for name in names[:2])
        raise OptionError(f"a Slurm array job without its task id and count ({given}): pass --part I/N")
    first, step = values.get("SLURM_ARRAY_TASK_MIN", 0), max(1, values.get("SLURM_ARRAY_TASK_STEP", 1))
    last = values.get("SLURM_ARRAY_TASK_MAX", first + (count - 1) * step)
    if last != first + (count - 1) * step:
        raise OptionError(
            f"a Slurm array job of {count} tasks from {first} to {last} (SLURM_ARRAY_TASK_COUNT, _MIN, "
            "_MAX) is not an evenly spaced range "
            "(--array=0,5,7?): its task ids cannot be numbered as parts; use --array=0-N or "
            "--part I/N"
        )
    index, off = divmod(task - first, step)
    if off or not 0 <= index < count:
        ids = f"{first}..{last}" + (f" step {step}" if step > 1 else "")
        raise OptionError(f"a Slurm array job: SLURM_ARRAY_TASK_ID={task} is not one of its {count} task ids ({ids})")
    return index + 1, count


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
