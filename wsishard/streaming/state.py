"""A loader's saved position (:meth:`~wsishard.streaming.loader.ShardLoader.state_dict`): plain JSON data, checked
field by field before anything is resumed from it, and the resumed epoch's history of stretches on earlier
topologies (:class:`~wsishard.streaming.planner.Segment`). Pure Python: no torch.
"""

from __future__ import annotations

from typing import Any

from wsishard.streaming.planner import Segment

STATE_FORMAT, STATE_VERSION = "wsishard-loader-state", 1
MAX_COUNT = 2**48  # epochs or batches a state may name: more is a damaged state, not a long run


def segments(state: dict[str, Any]) -> tuple[Segment, ...]:
    """The stretches of ``state``'s epoch on earlier topologies (checked by :func:`check_state`)."""
    return tuple(
        Segment(
            tuple(g["topology"]),
            tuple(tuple(b) for b in g["batches"]),
            tuple(tuple(i) for i in g["items"]) if g.get("items") is not None else None,
        )
        for g in state.get("history", [])
    )


def history_entry(segment: Segment) -> dict[str, Any]:
    """``segment`` as a state's history entry (what :func:`segments` reads back)."""
    entry: dict[str, Any] = {"topology": list(segment.topology), "batches": [list(b) for b in segment.batches]}
    if segment.items is not None:
        entry["items"] = [list(i) for i in segment.items]
    return entry


def _positions(value: Any, readers: int, rows: list[int] | None = None) -> bool:
    """``value`` is a state's ``items``: each of ``readers`` workers' place in its plan (an int, or null); with
    ``rows``, a history's: a list of such lists, ``rows[i]`` workers long."""
    if rows is not None:
        return isinstance(value, list) and len(value) == readers and all(map(_positions, value, rows))
    return isinstance(value, list) and len(value) == readers and all(v is None or is_int(v, 0) for v in value)


def is_int(value: Any, low: int, high: int = MAX_COUNT) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def a_type(value: Any) -> str:
    """``value``'s type with its article: "an int", "a list"."""
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def check_state(state: Any) -> None:
    """Raise ``ValueError`` naming the first field of ``state`` that a :meth:`ShardLoader.state_dict` could not have
    written (missing, of another type, out of range), before anything is resumed from it."""
    if not isinstance(state, dict):
        raise ValueError(f"not a wsishard loader state: {a_type(state)}, not a dict")
    if state.get("format") != STATE_FORMAT or state.get("version") != STATE_VERSION:
        raise ValueError("not a wsishard loader state (ShardLoader.state_dict())")
    ints = {"epoch": 0, "batch_size": 1, "rank": 0, "world_size": 1, "num_workers": 0, "seed": 0, "shuffle": 0}
    for key, low in ints.items():
        if not is_int(state.get(key), low, 2**64 - 1 if key == "seed" else MAX_COUNT):
            raise ValueError(f"loader state: {key} must be an integer in [{low}, {MAX_COUNT}], got {state.get(key)!r}")
    if not isinstance(state.get("resampled"), bool):
        raise ValueError(f"loader state: resampled must be true or false, got {state.get('resampled')!r}")
    check_history(state.get("history", []))
    if state["rank"] >= state["world_size"]:
        raise ValueError(f"loader state: rank {state['rank']} is not below world_size {state['world_size']}")
    readers = max(state["num_workers"], 1)
    batches = state.get("batches")
    if not isinstance(batches, list) or len(batches) != readers or not all(is_int(b, 0) for b in batches):
        raise ValueError(f"loader state: batches must be {readers} integer(s) in [0, {MAX_COUNT}], got {batches!r}")
    if "items" in state and not _positions(state["items"], readers):
        raise ValueError(f"loader state: items must be {readers} integer(s) >= 0 or null, got {state['items']!r}")
    last = state.get("last_worker")
    if last is not None and not is_int(last, 0, readers - 1):
        raise ValueError(f"loader state: last_worker must be null or a worker in [0, {readers - 1}], got {last!r}")
    samples = state.get("samples")
    if not isinstance(samples, list) or len(samples) != 2 or not all(is_int(n, 0) for n in samples):
        raise ValueError(f"loader state: samples must be [shards, samples], two integers >= 0, got {samples!r}")


def check_history(history: Any) -> None:
    """Raise ``ValueError`` unless ``history`` is a list of ``{"topology": [workers per rank], "batches": [[per
    worker] per rank]}`` of matching shapes."""
    if not isinstance(history, list) or len(history) > 1024:
        raise ValueError(f"loader state: history must be a list of stretches, got {type(history).__name__}")
    for i, g in enumerate(history):
        topology = g.get("topology") if isinstance(g, dict) else None
        batches = g.get("batches") if isinstance(g, dict) else None
        if (
            not isinstance(topology, list)
            or not 0 < len(topology) <= 2**16
            or not all(is_int(k, 1, 2**16) for k in topology)
            or not isinstance(batches, list)
            or len(batches) != len(topology)
            or not all(
                isinstance(row, list) and len(row) == k and all(is_int(b, 0) for b in row)
                for row, k in zip(batches, topology, strict=False)
            )
            or not (g.get("items") is None or _positions(g["items"], len(topology), topology))
        ):
            raise ValueError(f"loader state: history[{i}] must be {{topology: [workers per rank], batches: [[...]]}}")
