"""The QC page: every slide with its numbers and picture, failed slides first, manifest text escaped."""

from __future__ import annotations

import re

from wsishard.manifest import Manifest, SlideRecord
from wsishard.qc_html import qc_index


def _manifest() -> Manifest:
    slides = [
        SlideRecord(
            slide_id="b-ok",
            file="/s/b.svs",
            status="ok",
            width=4096,
            height=3072,
            slide_mpp=0.25,
            mpp_source="openslide",
            tissue_mm2=12.5,
            ink_mm2=1.25,
            artefact_mm2=0.5,
            candidates=900,
            patches=800,
            filtered={"artefact": 12, "roi": 3},
            roi="annotated: b.geojson",
        ),
        SlideRecord(slide_id="a-ok", file="/s/a.svs", status="ok", patches=5),
        SlideRecord(
            slide_id="z-bad",
            file="/s/<script>z.svs",
            status="failed",
            reason='malformed annotation GeoJSON (<img src=x onerror="alert(1)">)',
        ),
    ]
    return Manifest(options={}, shards=[], slides=slides)


def test_failed_slides_come_first_then_the_rest_by_name() -> None:
    page = qc_index(_manifest(), "pics/")
    ids = re.findall(r'<div class="slide \w+" id="([^"]+)">', page)
    assert ids == ["z-bad", "a-ok", "b-ok"]
    assert '<img src="pics/b-ok.png" loading="lazy"' in page and "3 slides (2 ok, 1 failed)" in page


def test_numbers_of_each_slide_are_shown() -> None:
    page = qc_index(_manifest())
    card = page[page.index('id="b-ok"') :]
    for text in (
        "12.50 mm2",
        "ink 1.25 mm2, dark artefacts 0.50 mm2",
        "800 kept of 900",
        "artefact 12, roi 3",
        "annotated: b.geojson",
        "4096 x 3072 px at 0.2500 mpp",
    ):
        assert text in card


def test_manifest_text_is_escaped() -> None:
    page = qc_index(_manifest())
    assert "<script>" not in page and "<img src=x" not in page
    assert "&lt;script&gt;z.svs" in page and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page


def test_a_slide_without_a_picture_shows_a_line_of_text_not_a_broken_image() -> None:
    """Issue 29: a failed slide has no QC picture; its card's image falls back to a line naming the slide (the page
    cannot know which pictures exist: it may be read from object storage)."""
    page = qc_index(_manifest(), "pics/")
    card = page[page.index('id="z-bad"') : page.index('id="a-ok"')]
    img = re.search(r"<img [^>]*>", card)
    assert img is not None and 'src="pics/z-bad.png"' in img.group(0)
    assert 'alt="no QC picture for z-bad"' in img.group(0)
    assert 'onerror="this.parentNode.replaceWith(this.alt)"' in img.group(0)
