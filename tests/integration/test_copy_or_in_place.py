"""Copy or in place, per slide (:func:`wsishard.builder.inputs.staging.in_place_pays`): a slide given as a URL whose
kept patches, read in place, would take most of its bytes is scanned in place, then copied once and staged from the
copy; a large slide mostly glass is read in place; each record's ``read`` says which. The shards equal a local
build's either way. Against the HTTP test server, whose log holds every request (a GET without a Range header is a
whole-file copy, or fsspec asking the size of a slide the build stamps: once per slide, before its scan)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from buildtools import SMALL_BUILD

from wsishard.builder.inputs.staging import Scratch, StageTask, stage_slide
from wsishard.builder.run.orchestrate import build
from wsishard.builder.scan.scan import ScanTask, scan_slide
from wsishard.storage.output import Destination
from wsishard.testing.synthetic import make_slide

if TYPE_CHECKING:
    from servers import HttpServer

pytest_plugins = ("servers",)
pytestmark = pytest.mark.timeout(300)
OPTS = dataclasses.replace(SMALL_BUILD, jobs=1)


@pytest.fixture(scope="module")
def slides(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tissue.svs (3072 px, 90% tissue: its patches' tiles are about the whole file) and glass.svs (8192 px, 5%
    tissue: its patches' tiles a small part of it)."""
    folder = tmp_path_factory.mktemp("copy-or-in-place")
    make_slide(folder / "tissue.svs", seed=11, width=3072, height=3072, tissue_fraction=0.9)
    make_slide(folder / "glass.svs", seed=12, width=8192, height=8192, tissue_fraction=0.05)
    return folder


def _whole_gets(server: HttpServer, name: str) -> int:
    return sum(method == "GET" and not header for method, _, header in server.requests_to(name))


def _range_gets(server: HttpServer, name: str) -> int:
    return sum(method == "GET" and bool(header) for method, _, header in server.requests_to(name))


def test_a_slide_mostly_tissue_is_copied_a_slide_mostly_glass_read_in_place_and_the_shards_are_the_local_ones(
    http_serve: Any, slides: Path, tmp_path: Path
) -> None:
    server: HttpServer = http_serve(str(slides))
    names = ("glass.svs", "tissue.svs")
    remote = build([f"{server.url}/{n}" for n in names], str(tmp_path / "remote"), OPTS)
    local = build([str(slides / n) for n in names], str(tmp_path / "local"), OPTS)
    read = {Path(s.file).name: s for s in remote.slides}
    size = {n: (slides / n).stat().st_size for n in names}
    stamped = _whole_gets(server, "glass.svs")  # fsspec's size query (the body not read); no copy of glass.svs
    assert read["tissue.svs"].read == "copied" and _whole_gets(server, "tissue.svs") == stamped + 1  # one copy
    # its scan read the directories and the low-resolution view in place, then the copy the whole file
    assert size["tissue.svs"] < read["tissue.svs"].bytes_read < 1.5 * size["tissue.svs"]
    assert read["glass.svs"].read == "in place" and stamped <= 1
    assert read["glass.svs"].bytes_read < size["glass.svs"] / 2
    assert remote.shards == local.shards and all(s.patches > 0 for s in remote.slides)


def test_staging_again_follows_the_scans_choice(http_serve: Any, slides: Path, tmp_path: Path) -> None:
    """A slide staged after its scan (a resumed build; staging that failed at scan time) is read as its scan chose."""
    server: HttpServer = http_serve(str(slides))
    scratch = Scratch(str(tmp_path / "scratch"), {}, True)
    for name, chosen in (("tissue.svs", "copied"), ("glass.svs", "in place")):
        url = f"{server.url}/{name}"
        task = ScanTask(index=0, path=url, slide_id=name[:-4], options=OPTS, dest=Destination(str(tmp_path)))
        scanned = scan_slide(dataclasses.replace(task, scratch=scratch))
        assert scanned.record.read == chosen and scanned.work is not None
        server.log.clear()
        copy = scanned.record.read == "copied"
        staged = stage_slide(
            StageTask(index=0, url=url, work=scanned.work, scratch=scratch, encode=OPTS.encode, copy=copy)
        )
        assert staged.staged is not None and staged.reason == ""
        assert (_whole_gets(server, name), _range_gets(server, name) > 0) == ((1, False) if copy else (0, True))
        if scanned.staged is not None:  # the copy staged at scan time holds the same samples
            first = scanned.staged.read(0)
            assert staged.staged.read(0) == first and first
