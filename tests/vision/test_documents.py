"""PDFs as pages: opening and checking, choosing pages, rendering at a reading scale."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image, ImageDraw

from edgevlm.errors import ConfigError, ImageError
from edgevlm.vision.documents import DocumentPage, choose_pages, open_document, parse_pages
from edgevlm.vision.images import PAGE_PIXELS_FLOOR
from edgevlm.vision.pdf import MAX_SCALE, MIN_SCALE, page_scale
from edgevlm.vision.sources import load_source, source_fields

LETTER, A4_LANDSCAPE, SQUARE = (612, 792), (842, 595), (300, 300)


def write_pdf(path: Path, sizes: list[tuple[int, int]], *, text: str = "Page {n}") -> Path:
    """A PDF with one page per size (in points), each page's number written on it."""
    pages = []
    for n, size in enumerate(sizes, start=1):
        page = Image.new("RGB", size, "white")
        ImageDraw.Draw(page).text((20, 20), text.format(n=n), fill="black")
        pages.append(page)
    pages[0].save(path, save_all=True, append_images=pages[1:], resolution=72)
    return path


def encrypted_pdf(path: Path) -> Path:
    """A one-page PDF behind the standard security handler, whose empty password does not open it."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 100 100] >>",
               b"<< /Filter /Standard /V 1 /R 2 /O <" + b"11" * 32 + b"> /U <" + b"22" * 32 + b"> /P -4 >>"]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += (b"trailer\n<< /Size %d /Root 1 0 R /Encrypt 4 0 R /ID [<%s> <%s>] >>\nstartxref\n%d\n%%%%EOF\n"
            % (len(objects) + 1, b"ab" * 16, b"ab" * 16, xref))
    path.write_bytes(bytes(out))
    return path


def test_pages_come_in_order_with_their_own_sizes(tmp_path: Path) -> None:
    pdf = write_pdf(tmp_path / "mixed.pdf", [LETTER, A4_LANDSCAPE, SQUARE])
    document = open_document(pdf)
    assert document.n_pages == 3 and [p.number for p in document.pages] == [1, 2, 3]
    shapes = [load_source(page, useful_pixels=2_000_000).image.size for page in document.pages]
    assert shapes[0][1] > shapes[0][0] and shapes[1][0] > shapes[1][1] and shapes[2][0] == shapes[2][1]
    for (width_pt, _h), (width_px, _) in zip([LETTER, A4_LANDSCAPE, SQUARE], shapes, strict=True):
        assert MIN_SCALE * width_pt - 1 <= width_px <= MAX_SCALE * width_pt + 1


def test_a_page_is_named_by_its_file_and_number(tmp_path: Path) -> None:
    page = open_document(write_pdf(tmp_path / "r.pdf", [SQUARE] * 3)).pages[1]
    image = load_source(page)
    assert (page.name, page.key, str(page)) == ("r.pdf, page 2", f"{tmp_path}/r.pdf#page=2",
                                                f"{tmp_path}/r.pdf, page 2")
    assert (image.name, image.key, image.page) == ("r.pdf, page 2", page.key, 2)
    assert source_fields(page) == {"image": str(tmp_path / "r.pdf"), "page": 2}
    assert source_fields(tmp_path / "a.jpg") == {"image": str(tmp_path / "a.jpg")}


def test_pages_chooses_and_orders_without_repeats(tmp_path: Path) -> None:
    pdf = write_pdf(tmp_path / "ten.pdf", [SQUARE] * 10)
    chosen = open_document(pdf, pages=parse_pages("9, 1-3,2,8-"))
    assert [p.number for p in chosen.pages] == [9, 1, 2, 3, 8, 10]
    with pytest.raises(ImageError, match="none of the chosen page numbers is in it .it has 10"):
        open_document(pdf, pages=parse_pages("11-"))


@pytest.mark.parametrize("spec", ["", "0", "3-1", "a", "1-2-3", "-4", "1,,2"])
def test_a_bad_pages_spec_is_one_line_naming_the_setting(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"^pages .*not a page number or a range") as caught:
        parse_pages(spec)
    assert caught.value.settings == ("pages",)


@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 40)), min_size=1, max_size=6),
       st.integers(1, 30))
def test_chosen_pages_exist_and_never_repeat(ranges: list[tuple[int, int]], n_pages: int) -> None:
    ranges = [(first, last if last == 0 or last >= first else first) for first, last in ranges]
    spec = ",".join(f"{a}-{b or ''}" for a, b in ranges)
    chosen = choose_pages(parse_pages(spec), n_pages)
    assert len(chosen) == len(set(chosen)) and all(1 <= n <= n_pages for n in chosen)
    expected = {n for a, b in ranges for n in range(a, (b or n_pages) + 1) if n <= n_pages}
    assert set(chosen) == expected


@given(st.floats(1, 20_000), st.floats(1, 20_000), st.integers(1, 100_000_000))
def test_the_render_scale_stays_within_reading_scales_and_what_the_view_uses(width: float, height: float,
                                                                           pixels: int) -> None:
    scale = page_scale(width, height, pixels)
    most = max(pixels, PAGE_PIXELS_FLOOR)
    assert scale <= MAX_SCALE and width * height * scale**2 <= most * 1.0001
    if width * height * MIN_SCALE**2 <= most:  # a reading scale where the pixels allow one
        assert scale >= MIN_SCALE * 0.9999


def test_bad_pdfs_are_one_line_each(tmp_path: Path) -> None:
    pdf = write_pdf(tmp_path / "ok.pdf", [SQUARE, SQUARE])
    (tmp_path / "cut.pdf").write_bytes(pdf.read_bytes()[:150])
    (tmp_path / "empty.pdf").write_bytes(b"")
    (tmp_path / "text.pdf").write_text("not a pdf")
    cases = {encrypted_pdf(tmp_path / "locked.pdf"): "password-protected",
             tmp_path / "cut.pdf": "not a readable PDF (damaged",
             tmp_path / "empty.pdf": "file is empty",
             tmp_path / "text.pdf": "not a readable PDF",
             tmp_path / "none.pdf": "no such file"}
    for path, why in cases.items():
        with pytest.raises(ImageError) as caught:
            open_document(path)
        message = str(caught.value)
        assert message.startswith(f"{path}: ") and why in message and "\n" not in message


def test_the_page_count_and_page_pixels_are_capped_with_settings_to_raise_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pdf = write_pdf(tmp_path / "long.pdf", [SQUARE] * 6)
    monkeypatch.setenv("EDGEVLM_MAX_PAGES", "5")
    with pytest.raises(ImageError, match="6 pages to read, more than the limit of 5.*EDGEVLM_MAX_PAGES=6"):
        open_document(pdf)
    assert len(open_document(pdf, pages=parse_pages("1-5")).pages) == 5  # choosing fewer is the other fix
    monkeypatch.setenv("EDGEVLM_MAX_PAGES", "many")
    with pytest.raises(ConfigError, match="EDGEVLM_MAX_PAGES=many is not a positive"):
        open_document(pdf)
    monkeypatch.delenv("EDGEVLM_MAX_PAGES")
    monkeypatch.setenv("EDGEVLM_MAX_PIXELS", "10000")
    with pytest.raises(ImageError, match=r"long.pdf, page 1: 300x300 pt is .* EDGEVLM_MAX_PIXELS="):
        load_source(DocumentPage(pdf, 1, 6))


def test_a_pdf_without_pages_says_so(tmp_path: Path) -> None:
    """Issue 49.17: a PDF with an empty page list said "(PDFium: Success)"."""
    from ..server.test_documents_cost import blank_pdf

    (tmp_path / "none.pdf").write_bytes(blank_pdf(0, (612, 792)))
    with pytest.raises(ImageError) as caught:
        open_document(tmp_path / "none.pdf")
    assert "with no pages" in str(caught.value) and "Success" not in str(caught.value)


def test_a_pdf_without_pages_after_a_protected_one_is_not_called_protected(tmp_path: Path) -> None:
    """PDFium's last error outlives its document: after a protected PDF, an empty one was said to
    be password-protected (seen when the suite's order put the two together)."""
    from ..server.test_documents_cost import blank_pdf

    with pytest.raises(ImageError, match="password-protected"):
        open_document(encrypted_pdf(tmp_path / "locked.pdf"))
    (tmp_path / "none.pdf").write_bytes(blank_pdf(0, (612, 792)))
    with pytest.raises(ImageError) as caught:
        open_document(tmp_path / "none.pdf")
    assert "with no pages" in str(caught.value) and "password" not in str(caught.value)


def write_tiff(path: Path, sizes: list[tuple[int, int]]) -> Path:
    """A multi-page TIFF (a scan), one page per size in pixels, each page a different grey."""
    pages = [Image.new("L", size, 40 * (n + 1)) for n, size in enumerate(sizes)]
    pages[0].save(path, save_all=True, append_images=pages[1:], compression="tiff_lzw")
    return path


def test_a_multi_page_tiff_is_read_page_by_page_and_a_single_page_one_is_a_photo(tmp_path: Path) -> None:
    """The reader registry (vision/readers.py) holds a TIFF reader beside the PDF one: describe,
    /doc and serve's file parts read a scan's pages as they read a PDF's."""
    from edgevlm.vision.documents import count_pages, is_document, render_document_bytes

    scan = write_tiff(tmp_path / "scan.tiff", [(850, 1100), (3000, 4000), (400, 300)])
    photo = write_tiff(tmp_path / "photo.tif", [(640, 480)])
    assert is_document(scan) and not is_document(photo)
    document = open_document(scan, pages=parse_pages("2-"))
    assert [p.number for p in document.pages] == [2, 3] and document.n_pages == 3
    big = load_source(document.pages[0], useful_pixels=1_000_000)
    assert big.page == 2 and big.image.mode == "RGB"
    assert big.image.width * big.image.height <= max(1_000_000, PAGE_PIXELS_FLOOR) * 1.01  # scaled down
    assert big.image.getpixel((10, 10)) == (80, 80, 80)  # the second page, not the first
    small = load_source(document.pages[1], useful_pixels=1_000_000)
    assert small.image.size == (400, 300)  # never scaled up
    raw = scan.read_bytes()
    assert count_pages(raw, "upload") == 3
    pages = render_document_bytes(raw, "upload", useful_pixels=500_000)
    assert [p.page for p in pages] == [1, 2, 3]
    with pytest.raises(ImageError, match="the TIFF has no pages|not a readable TIFF"):
        count_pages(b"II*\x00" + b"\x00" * 20, "broken")
