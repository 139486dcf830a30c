"""Listing a dataset source over HTTP: bounded in time and memory. A source's server decides
how many files its index page names (each costs a request for its size), how slowly it
answers, and how long the page is; a listing that never ended held its tenant's
dataset-operation slots (and an API thread) for good, and fsspec read the page whole into the
plane's memory."""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sluice.data.errors import SourceError
from sluice.data.source import ListingTimeout, Source

FILES = 10_000
PAGE_MIB = 96


class Index(BaseHTTPRequestHandler):
    """/many/: an index of FILES files, each of whose sizes takes 50 ms to learn (500 s in
    all); /huge/: an index page of PAGE_MIB MiB; /few/: two files of 3 and 5 bytes."""

    protocol_version = "HTTP/1.1"
    empty_asked = 0

    def do_GET(self) -> None:
        if self.path == "/many/":
            self._send("".join(f'<a href="f{i}.bin">f{i}.bin</a>\n' for i in range(FILES)).encode())
        elif self.path == "/few/":
            self._send(b'<a href="a.bin">a</a> <a href="/few/b.bin">b</a> <a href="../">up</a> <a href="sub/">s</a>')
        elif self.path == "/few/sub/":
            self._send(b'<a href="c.bin">c</a> <a href="/few/">back up</a> <a href="/elsewhere/d.bin">not below</a>')
        elif self.path == "/dots/":
            links = ["ok.bin", "../secret.bin", "a/../../x.bin", "%2e%2e/y.bin", "/dots/../z.bin", "./w.bin"]
            self._send("".join(f'<a href="{link}">l</a>' for link in links).encode())
        elif self.path == "/broken/":
            self._send(b'<a href="gone.bin">gone</a>')
        elif self.path == "/wide/":
            self._send("".join(f'<a href="f{i}">f</a>' for i in range(100)).encode())
        elif self.path.startswith("/deep/"):  # folders without end
            self._send(b'<a href="f.bin">f</a> <a href="d/">d</a>')
        elif self.path in ("/empty", "/empty/"):  # an index page that links nothing, then no answer at all
            Index.empty_asked += 1
            if Index.empty_asked > 1:
                time.sleep(60)
            self._send(b"<p>nothing here</p>")
        elif self.path == "/stall/":  # the headers and a little of the page, then nothing for a minute
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b'<a href="x.bin">x</a>')
            self.wfile.flush()
            time.sleep(60)
        elif self.path == "/huge/":
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(PAGE_MIB << 20))
            self.end_headers()
            chunk = b"<p>" + b"x" * ((1 << 20) - 3)
            try:
                for _ in range(PAGE_MIB):
                    self.wfile.write(chunk)
            except OSError:
                pass
        else:
            self.send_error(404)

    def do_HEAD(self) -> None:
        if self.path.startswith("/many/"):
            time.sleep(0.05)
        sizes = {"/few/a.bin": 3, "/few/b.bin": 5, "/few/sub/c.bin": 7, "/dots/ok.bin": 2}
        if self.path.startswith(("/many/", "/deep/")) or self.path in sizes:
            self.send_response(200)
            self.send_header("Content-Length", str(sizes.get(self.path, 10)))
            self.end_headers()
        else:
            self.send_error(404)

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Index)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.timeout(60)
def test_a_listing_past_its_deadline_stops_naming_the_source_and_the_setting(server: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(ListingTimeout, match=r"listing .*/many took longer than 2s.*dataset_list_timeout_s"):
        Source(f"{server}/many", retries=0).list(timeout_s=2)
    assert time.monotonic() - t0 < 8


def test_an_index_page_is_read_only_up_to_its_bound(server: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(SourceError, match=r"index page .*/huge/ is larger than 64 MiB"):
            Source(f"{server}/huge", retries=0).list(timeout_s=30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 80 << 20, f"{peak >> 20} MiB held to list a {PAGE_MIB} MiB page"


@pytest.mark.timeout(60)
def test_folders_linked_without_end_stop_at_the_deadline(server: str) -> None:
    with pytest.raises(ListingTimeout, match="took longer than 2s"):
        Source(f"{server}/deep", retries=0).list(timeout_s=2)


def test_an_index_lists_the_files_below_it_as_before(server: str, tmp_path: Path) -> None:
    """Relative and absolute links below the source, its sub-folders followed; links to its
    parent or elsewhere are not items."""
    manifest = Source(f"{server}/few", retries=0).list(timeout_s=10)
    assert manifest.keys == ("a.bin", "b.bin", "sub/c.bin") and manifest.sizes == (3, 5, 7)
    (tmp_path / "a.bin").write_bytes(b"12345")
    local = Source(str(tmp_path)).list(timeout_s=5)  # a local folder: not timed, listed as before
    assert local.keys == ("a.bin",) and local.sizes == (5,)


@pytest.mark.timeout(60)
def test_an_index_page_that_stalls_mid_read_stops_at_the_deadline(server: str) -> None:
    """One read of a page that the server stops sending was not given the deadline: the
    listing waited for the server (or aiohttp's 5 minutes), whatever dataset_list_timeout_s said."""
    t0 = time.monotonic()
    with pytest.raises(ListingTimeout, match="took longer than 2s"):
        Source(f"{server}/stall", retries=0).list(timeout_s=2)
    assert time.monotonic() - t0 < 8


@pytest.mark.timeout(60)
def test_an_empty_index_whose_server_then_stalls_stops_at_the_deadline(server: str) -> None:
    """Saying why a listing is empty asks the server again whether the source exists: that
    request was not given the deadline either."""
    Index.empty_asked = 0
    t0 = time.monotonic()
    with pytest.raises(ListingTimeout, match="took longer than 2s"):
        Source(f"{server}/empty", retries=0).list(timeout_s=2)
    assert time.monotonic() - t0 < 8


def test_links_that_step_out_of_the_folder_are_not_followed(server: str) -> None:
    """`..` and `.` steps, plain or %-encoded, in relative or absolute links: not below the
    source, whatever their text begins with."""
    manifest = Source(f"{server}/dots", retries=0).list(timeout_s=10)
    assert manifest.keys == ("ok.bin",)


def test_an_index_page_links_at_most_what_a_listing_follows(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Links are gathered one by one up to the bound (a 64 MiB page of short links held
    ~700 MB as one list before the item bound was checked)."""
    import sluice.data.source as source

    monkeypatch.setattr(source, "MAX_ITEMS", 10)
    monkeypatch.setattr(source, "MAX_INDEX_FOLDERS", 5)
    with pytest.raises(SourceError, match="links more than 15 files and folders"):
        Source(f"{server}/wide", retries=0).list(timeout_s=10)


def test_a_linked_file_that_is_not_there_is_a_source_error_naming_it(server: str) -> None:
    with pytest.raises(SourceError, match=r"the size of gone\.bin"):
        Source(f"{server}/broken", retries=0).list(timeout_s=10)
