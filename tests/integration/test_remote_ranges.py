"""Slides read in place with latency hidden (:mod:`wsishard.slide.ranges`): a region's tiles come in a few large
ranged GETs, not one per tile; the tiles of planned reads are fetched ahead; the pixels are those of the local
file; a request that fails names the slide. Against the HTTP test server, whose log holds every request."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from wsishard.errors import SlideError
from wsishard.slide import open_slide
from wsishard.slide.ranges import RangePolicy, coalesce
from wsishard.slide.remote_tiff import RemoteTiffReader

if TYPE_CHECKING:
    from servers import HttpServer

pytest_plugins = ("servers",)
pytestmark = pytest.mark.timeout(120)


def _gets(server: HttpServer, name: str) -> list[str]:
    return [header or "" for method, _, header in server.requests_to(name) if method == "GET"]


def _idle(reader: RemoteTiffReader) -> None:
    """Wait until no request of ``reader`` is on its way (the fetches ahead are done)."""
    deadline = time.monotonic() + 20
    while reader._ranges._on_way and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not reader._ranges._on_way


def test_neighbouring_tiles_are_coalesced_within_the_gap_and_size_limits() -> None:
    spans = [(1000, 100), (0, 100), (150, 100), (5000, 10), (5010, 0), (5010, 4000), (100_000, 50)]
    assert coalesce(spans, gap_bytes=1000, max_range_bytes=10_000) == [
        (0, 1100, [0, 150, 1000]),  # gaps of 50 and 750 bytes: one request
        (5000, 9010, [5000, 5010]),  # the empty tile (count 0) is no read
        (100_000, 100_050, [100_000]),
    ]
    assert [r[:2] for r in coalesce(spans, gap_bytes=1000, max_range_bytes=1000)] == [
        (0, 250),
        (1000, 1100),
        (5000, 5010),
        (5010, 9010),  # larger than the limit alone: a request of its own
        (100_000, 100_050),
    ]


def test_a_region_is_read_in_a_few_large_requests_with_the_local_files_pixels(
    http_serve: Any, cohort: Path, tmp_path: Path
) -> None:
    server: HttpServer = http_serve(str(cohort))
    name = next(p.name for p in sorted(cohort.iterdir()) if p.suffix == ".svs")
    with open_slide(str(cohort / name)) as local, RemoteTiffReader(f"{server.url}/{name}", str(tmp_path)) as reader:
        before = len(_gets(server, name))  # the directories
        region = reader.read_level(0, 0, 0, 3072, 3072)
        assert np.array_equal(region, local.read_level(0, 0, 0, 3072, 3072))
        tiles = len(reader._levels[0].offsets)
        made = len(_gets(server, name)) - before
        assert made == reader.requests and tiles >= 100 and made <= 4  # 144 tiles of 256 px: one range (< 8 MB)
        one_by_one = RangePolicy(gap_bytes=-1, max_range_bytes=1)  # no coalescing: a request per tile
    with RemoteTiffReader(f"{server.url}/{name}", str(tmp_path), policy=one_by_one) as single:
        single.read_level(0, 0, 0, 3072, 3072)
        assert single.requests == tiles  # what the in-place read did before


def test_the_tiles_of_planned_reads_are_fetched_while_the_current_one_is_decoded(
    http_serve: Any, cohort: Path, tmp_path: Path
) -> None:
    server: HttpServer = http_serve(str(cohort))
    name = next(p.name for p in sorted(cohort.iterdir()) if p.suffix == ".tif")
    url = f"{server.url}/{name}"
    blocks = [(0, 0), (1024, 1024), (2048, 2048)]  # far apart in the file: requests of their own
    with RemoteTiffReader(url, str(tmp_path), policy=RangePolicy(gap_bytes=0)) as reader:
        for x, y in blocks:
            reader.plan_read(0, x, y, 512, 512, 1, None)
        first = reader.read_level(0, 0, 0, 512, 512)
        _idle(reader)
        asked = len(_gets(server, name))
        rest = [reader.read_level(0, x, y, 512, 512) for x, y in blocks[1:]]
        assert len(_gets(server, name)) == asked  # the planned blocks were fetched before they were read
    with open_slide(str(cohort / name)) as local:
        for got, (x, y) in zip([first, *rest], blocks, strict=True):
            assert np.array_equal(got, local.read_level(0, x, y, 512, 512))


def test_a_failed_range_request_names_the_slide(http_serve: Any, cohort: Path, tmp_path: Path) -> None:
    server: HttpServer = http_serve(str(cohort))
    name = next(p.name for p in sorted(cohort.iterdir()) if p.suffix == ".svs")
    with RemoteTiffReader(f"{server.url}/{name}", str(tmp_path)) as reader:
        server.faults.fail, server.faults.match = 10, name  # every request from now on fails
        with pytest.raises(SlideError, match=f"{name}: a region's tiles cannot be read"):
            reader.read_level(0, 0, 0, 1024, 1024)


def test_a_slide_built_in_place_makes_far_fewer_requests_than_tiles_and_the_local_builds_shards(
    http_serve: Any, cohort: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from buildtools import SMALL_BUILD, read_output

    import wsishard.builder.inputs.staging
    import wsishard.slide.ranges
    from wsishard.builder.run.orchestrate import build

    server: HttpServer = http_serve(str(cohort))
    name = next(p.name for p in sorted(cohort.iterdir()) if p.suffix == ".svs")
    opts = dataclasses.replace(SMALL_BUILD, jobs=1)  # in-process: the policy patched below applies
    # in place even though its patches' tiles are most of the file (which a build copies: test_copy_or_in_place.py)
    monkeypatch.setattr(wsishard.builder.inputs.staging, "COPY_ABOVE_FRACTION", float("inf"))
    remote = build([f"{server.url}/{name}"], str(tmp_path / "remote"), opts)
    local = build([str(cohort / name)], str(tmp_path / "local"), opts)
    (record,) = remote.slides
    assert record.read == "in place"
    assert record.patches > 100 and remote.shards == local.shards  # byte-identical shards (sizes and sha256)
    assert [s.key for s in read_output(str(tmp_path / "remote"))[1]] == [
        s.key for s in read_output(str(tmp_path / "local"))[1]
    ]
    coalesced = len(_gets(server, name))
    server.log.clear()
    monkeypatch.setattr(wsishard.slide.ranges, "RangePolicy", lambda: RangePolicy(gap_bytes=-1, max_range_bytes=1))
    single = build([f"{server.url}/{name}"], str(tmp_path / "single"), opts)  # a request per tile, as before
    assert single.shards == local.shards
    per_tile = len(_gets(server, name))
    assert coalesced * 2.5 < per_tile, (coalesced, per_tile)  # 24 against 72, the same directory reads (~9) in both


def test_a_slide_under_half_a_megabyte_is_copied_and_recorded_so_and_its_shards_equal_the_local_builds(
    http_serve: Any, cohort: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from buildtools import SMALL_BUILD

    import wsishard.builder.inputs.staging

    monkeypatch.setattr(wsishard.builder.inputs.staging, "COPY_ABOVE_FRACTION", float("inf"))  # size alone decides

    from wsishard.builder.run.orchestrate import build
    from wsishard.slide.remote_tiff import COPY_BELOW_BYTES
    from wsishard.testing.synthetic import make_slides

    folder = tmp_path / "slides"
    make_slides(folder, 1, seed=3, width=1024, height=1024, tissue_fraction=0.6)
    tiny = next(folder.iterdir())
    shutil.copy(next(p for p in sorted(cohort.iterdir()) if p.suffix == ".svs"), folder / "big.svs")
    assert tiny.stat().st_size < COPY_BELOW_BYTES < (folder / "big.svs").stat().st_size
    server: HttpServer = http_serve(str(folder))
    opts = dataclasses.replace(SMALL_BUILD, jobs=1)  # in-process: the fraction patched above applies
    remote = build([f"{server.url}/{tiny.name}", f"{server.url}/big.svs"], str(tmp_path / "remote"), opts)
    local = build([str(tiny), str(folder / "big.svs")], str(tmp_path / "local"), opts)
    read = {Path(s.file).name: (s.read, s.bytes_read) for s in remote.slides}
    assert read[tiny.name] == ("copied", tiny.stat().st_size)  # one whole download, read by the direct-tile reader
    assert read["big.svs"][0] == "in place"
    assert {s.read for s in local.slides} == {""}
    assert remote.shards == local.shards and sum(s.patches for s in remote.slides) > 0
