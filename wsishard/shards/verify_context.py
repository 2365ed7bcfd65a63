"""``verify``'s checks of a sample's context patches (``--context-mpp``): one ``ctx<i>.<format>`` member per scale
the manifest records, each an image of the format and the context size (read from its header only), and none
beyond them."""

from __future__ import annotations

from wsishard.format import context_ext, context_scale, image_header


def context_problems(members: dict[str, bytes], image_format: str, scales: int, size_px: int) -> list[tuple[str, str]]:
    """``(problem, detail)`` for each way the sample's context members break the manifest's ``context_mpp``
    (``scales`` of them) and ``context_size`` (``size_px``); empty: they match."""
    problems = []
    extra = sorted(ext for ext in members if (i := context_scale(ext)) is not None and i >= scales)
    if extra:
        problems.append((f"samples have context members beyond the manifest's {scales} context_mpp", extra[0]))
    for i in range(scales):
        ext = context_ext(i, image_format)
        if ext not in members:
            problems.append((f"samples lack their .{ext} context member", ""))
            continue
        header = image_header(members[ext])
        if header is None or header[0] != image_format:
            problems.append((f"context members are not {image_format} images", f"a .{ext} member"))
        elif header[1:] != (size_px, size_px):
            wrong = f"context members are not {size_px}x{size_px} px as the manifest's context_size says"
            problems.append((wrong, f"{header[1]}x{header[2]} px"))
    return problems
