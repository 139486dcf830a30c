"""Dataset sources as a user meets them (docs/data.md, "Sources"): a source that vanished is an
error naming the dataset, never an empty dataset; an unreachable S3 source is a clean 422;
storage options take booleans and numbers but stay scalars; a spec file's relative source is
taken from the file's folder (the API refuses one); a refused scheme's message lists exactly
the schemes that are accepted.

The server is the real API and ControlPlane over SqlStore on a loopback port, with the
FakeEngine (a fake: it has no node agents, so `warm` warms the plane's own node cache, through
the same `warm_node` an agent runs). No test needs the network: S3 is reached either with no
credentials at all or through an endpoint on a closed loopback port.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sluice.control.plane import ControlPlane
from sluice.data.errors import SourceError
from sluice.data.guard import SCHEMES, SourceGuard, SourceRefused, normalized_options
from sluice.data.source import Source
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.spec import DatasetSpec, SpecError
from sluice.spec.loading import parse_model
from sluice.store.sql import SqlStore

from ..live_api import run_cli, serve_for_cli, serving
from .fake_engine import FakeEngine


@dataclass
class Live:
    plane: ControlPlane
    data: Path
    """The admin's dataset root (setting dataset_roots)."""
    home: Path


@pytest.fixture
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Live]:
    home, data = tmp_path / "home", tmp_path / "data"
    home.mkdir()
    data.mkdir()
    # isolation off: warming runs in this process, not a helper as a tenant's uid (the per-uid
    # caches are another test's business); the source checks are the same either way.
    settings = Settings(home=home, dataset_roots=[str(data)], allow_source_hosts=["127.0.0.1"], isolation="off")
    plane = ControlPlane(settings, SqlStore(settings.db_url), FakeEngine(), make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    try:
        with serve_for_cli(plane, home, tokens, monkeypatch):
            yield Live(plane, data, home)
    finally:
        plane.store.close()


sluice = run_cli


def folder(path: Path, files: int) -> Path:
    path.mkdir(parents=True)
    for i in range(files):
        (path / f"{i:02d}.bin").write_bytes(bytes([i]) * 10)
    return path


def create(spec: dict[str, Any], tmp_path: Path, probe: bool = True) -> tuple[int, str, str]:
    f = tmp_path / f"{spec['name']}.json"
    f.write_text(json.dumps(spec))
    return sluice("dataset", "create", str(f), *(() if probe else ("--no-probe",)))


def post(live: Live, body: dict[str, Any], probe: bool = True) -> Any:
    import httpx

    url = json.loads((live.home / "server.json").read_text())["url"]
    token = (live.home / "token").read_text().strip()
    return httpx.post(
        f"{url}/v1/datasets?probe={str(probe).lower()}",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No AWS credentials from anywhere, no metadata service, and one attempt per request (so an
    unreachable endpoint fails in well under a second instead of botocore's back-off)."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- 1. a vanished source is an error, not an empty dataset -------------------------------------


def test_listing_tells_a_missing_or_empty_source_from_an_empty_dataset(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        Source(str(tmp_path / "gone")).list()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="holds no files"):
        Source(str(tmp_path / "empty")).list()
    assert len(Source(str(folder(tmp_path / "full", 3))).list()) == 3


def test_warming_or_reading_a_dataset_whose_source_vanished_fails_naming_both(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = folder(live.data / "tmpds", 20)
    code, out, err = create({"name": "tmpds", "source": str(src)}, tmp_path)
    assert code == 0 and "20 files" in out, err
    shutil.rmtree(src)

    code, out, err = sluice("dataset", "warm", "tmpds")
    assert code == 1, out + err
    assert "warming tmpds failed" in out and "SourceError" in out
    assert "dataset 'default/tmpds'" in out and f"{src} does not exist" in out
    code, out, _ = sluice("dataset", "list", "-o", "json")
    [listed] = json.loads(out)
    assert listed["cached_fraction"] != 1.0  # not "100% cached"

    # A job mounting it: the SDK opens it the way a job's process does, from the launch env.
    for k, v in live.plane.datasets.launch_env("default", ["tmpds"]).items():
        monkeypatch.setenv(k, v)
    from sluice.sdk.dataset import dataset

    ds = dataset("tmpds")
    with pytest.raises(SourceError, match=r"dataset 'default/tmpds': source .*tmpds does not exist"):
        len(ds)


# -- 2. an unreachable S3 source is a clean 422 --------------------------------------------------


@pytest.mark.usefixtures("no_aws")
def test_an_s3_source_without_credentials_or_endpoint_is_a_422_naming_it(live: Live, tmp_path: Path) -> None:
    r = post(live, {"name": "x", "source": "s3://b/x"})
    assert r.status_code == 422, r.text
    [problem] = r.json()["problems"]
    assert problem["field"] == "source"
    assert "s3://b/x" in problem["problem"] and "credentials" in problem["problem"]

    code, out, err = create({"name": "pub", "source": "s3://some-public-bucket/x"}, tmp_path)
    assert code == 2, out + err
    assert "500" not in err and "s3://some-public-bucket/x" in err


@pytest.mark.usefixtures("no_aws")
def test_an_s3_endpoint_that_does_not_answer_is_a_422_naming_it(live: Live) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    r = post(live, {"name": "x", "source": "s3://b/x", "storage_options": {"anon": True, "endpoint_url": endpoint}})
    assert r.status_code == 422, r.text
    [problem] = r.json()["problems"]
    assert problem["field"] == "source"
    assert problem["problem"].startswith("cannot list s3://b/x") and endpoint in problem["problem"]


# -- 3. storage options: booleans and numbers, still only scalars ------------------------------


def spec(**opts: Any) -> DatasetSpec:
    return parse_model(DatasetSpec, {"name": "d", "source": "s3://b/x", "storage_options": opts})


def test_storage_options_take_booleans_and_numbers_but_only_scalars() -> None:
    assert spec(anon=True, n=3, f=0.5, key="k").storage_options == {"anon": True, "n": 3, "f": 0.5, "key": "k"}
    for bad, says in (
        ({"a": 1}, "not a mapping"),
        ([1], "not a list"),
        (None, "not null"),
        ("x" * 5000, "longer than 4096"),
        (2**60, "at most"),
    ):
        with pytest.raises(SpecError) as err:
            spec(o=bad)
        assert [p.field for p in err.value.problems] == ["storage_options.o"] and says in str(err.value)
    with pytest.raises(SpecError, match="1 to 64 characters"):
        spec(**{"x" * 65: "v"})


def test_boolean_options_mean_what_they_say_and_refuse_other_types() -> None:
    assert normalized_options("s3://b/x", {"anon": "false", "requester_pays": "True"}) == {
        "anon": False,
        "requester_pays": True,
    }
    guard = SourceGuard()
    guard.check("s3://b/x", {"anon": True, "version_aware": False})
    for opts, field in (
        ({"anon": "maybe"}, "storage_options.anon"),
        ({"endpoint_url": 5}, "storage_options.endpoint_url"),
    ):
        with pytest.raises(SourceRefused) as err:
            guard.check("s3://b/x", opts)
        assert err.value.field == field


def test_anon_true_is_accepted_by_the_api(live: Live) -> None:
    r = post(live, {"name": "pub", "source": "s3://b/x", "storage_options": {"anon": True}}, probe=False)
    assert r.status_code == 201, r.text
    assert r.json()["storage_option_names"] == ["anon"]
    rec = live.plane.store.get_dataset("default", "pub")
    assert rec is not None and rec.spec.storage_options == {"anon": True}  # stored as a boolean


# -- 4. a relative source: from the spec file's folder; the API refuses it ---------------------


def test_a_relative_source_is_taken_from_the_spec_files_folder(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder(live.data / "digits", 4)
    (live.data / "specs").mkdir()
    (live.data / "specs" / "ds.yaml").write_text("name: digits\nsource: ../digits\n")
    monkeypatch.chdir(tmp_path)  # the caller's folder is not the spec's
    code, out, err = sluice("dataset", "create", str(live.data / "specs" / "ds.yaml"), "-o", "json")
    assert code == 0, out + err
    assert json.loads(out)["source"] == str(live.data / "digits") and json.loads(out)["items"] == 4


def test_the_api_refuses_a_relative_local_source(live: Live) -> None:
    for source in ("digits", "./data/x", "file://digits"):
        r = post(live, {"name": "d", "source": source})
        assert r.status_code == 422, r.text
        [problem] = r.json()["problems"]
        assert problem["field"] == "source" and "relative" in problem["problem"] and "absolute" in problem["problem"]


# -- 5. the schemes a refusal lists are the schemes accepted -------------------------------------


def test_a_refused_scheme_lists_exactly_the_accepted_ones() -> None:
    with pytest.raises(SpecError) as err:
        parse_model(DatasetSpec, {"name": "d", "source": "ftp://h/x"})
    listed = str(err.value).rsplit("use one of ", 1)[1].split(", ")
    assert "memory" not in listed and tuple(listed) == SCHEMES
    with pytest.raises(SpecError):
        parse_model(DatasetSpec, {"name": "d", "source": "memory://x"})
    for scheme in listed:  # each listed scheme passes the spec and the guard's scheme check
        parse_model(DatasetSpec, {"name": "d", "source": f"{scheme}://h/x"})
        try:
            SourceGuard().check(f"{scheme}://h/x", resolve=False)
        except SourceRefused as refused:
            assert "scheme" not in refused.problem


def test_an_admin_names_another_tenants_dataset_with_tenant_in_get_warm_and_rm(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API and the client took `tenant`; `dataset get/warm/rm` had no --tenant, so an
    admin could not reach a tenant's unpublished dataset from the CLI (walk5 D13)."""
    src = folder(live.data / "dd", 2)
    code, _, err = create({"name": "dd", "source": str(src)}, tmp_path)
    assert code == 0, err
    monkeypatch.setenv("SLUICE_TOKEN", (live.home / "admin.token").read_text().strip())
    code, _, err = sluice("dataset", "get", "dd")
    assert code != 0 and "dd" in err  # the admin's own: there is none
    code, out, err = sluice("dataset", "get", "dd", "--tenant", "default", "-o", "json")
    assert code == 0 and json.loads(out)["tenant"] == "default", err
    code, out, err = sluice("dataset", "warm", "dd", "--tenant", "default")
    assert code == 0 and "100% cached" in out, out + err
    code, out, err = sluice("dataset", "rm", "dd", "--tenant", "default")
    assert code == 0 and "deleted dataset dd" in out, err
    assert live.plane.store.get_dataset("default", "dd") is None


# -- a source's word about sizes and its manifest's length is bounded ----------------------------


def test_a_manifest_claiming_sizes_past_the_store_integer_is_a_422_naming_source(live: Live) -> None:
    """Sizes are the source's word: two items of 2**62 bytes summed past 2**63, what the store's
    integer column holds, and `dataset create` answered 500 (OverflowError)."""
    for i, sizes in enumerate(([2**62, 2**62], [2**64], [2**40 + 1])):  # 2**40: the most an item may claim
        src = live.data / f"huge{i}"
        src.mkdir()
        items = [[f"{n}.bin", s] for n, s in enumerate(sizes)]
        (src / "_sluice_manifest.json").write_text(json.dumps({"items": items}))
        r = post(live, {"name": f"huge{i}", "source": str(src)})
        assert r.status_code == 422, r.text
        [problem] = r.json()["problems"]
        assert problem["field"] == "source" and "1 TiB" in problem["problem"], problem
    assert post(live, {"name": "huge0", "source": str(live.data / "huge0")}).status_code == 422  # not a 409: none kept


@pytest.mark.parametrize("over_http", [False, True])
def test_a_source_manifest_is_read_only_up_to_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, over_http: bool
) -> None:
    """The plane read a source's `_sluice_manifest.json` whole into memory, however long the
    source's server made it: now it reads at most MAX_MANIFEST_BYTES and says so."""
    from sluice.data import manifest, source
    from sluice.data.httpserve import DataServer

    monkeypatch.setattr(source, "MAX_MANIFEST_BYTES", 1 << 20, raising=False)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x")
    padded = json.dumps({"items": [["a.bin", 1]]}) + " " * (3 << 20)
    (src / manifest.MANIFEST_NAME).write_text(padded)
    if not over_http:
        with pytest.raises(SourceError, match=r"larger than 1 MiB"):
            Source(str(src)).list()
        return
    with DataServer(src) as srv, pytest.raises(SourceError, match=r"larger than 1 MiB"):
        Source(srv.url, guard=SourceGuard(allow_hosts=("127.0.0.1",))).list()
    (src / manifest.MANIFEST_NAME).write_text(json.dumps({"items": [["a.bin", 1]]}))
    with DataServer(src) as srv:
        assert Source(srv.url, guard=SourceGuard(allow_hosts=("127.0.0.1",))).list().keys == ("a.bin",)


def _refused_within_16_mib(src: Source) -> None:
    """Fetching a 10-byte item whose server sends far more fails, without holding what it sent."""
    tracemalloc.start()
    try:
        with pytest.raises(SourceError, match="more than the 10 bytes"):
            src.fetch("item.bin", 10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"fetching a 10-byte item held {peak >> 20} MiB"


def test_an_item_is_read_over_http_only_to_one_byte_past_its_manifest_size(tmp_path: Path) -> None:
    """A source's server decides how much it sends: an item whose manifest says 10 bytes, served
    as 64 MiB, was read whole into the fetching process (the plane's own on the local engine)
    before its size was checked. Now the read stops one byte past the size and says so."""
    import http.server

    body = 64 << 20

    class Flood(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(body))
            self.end_headers()
            chunk = b"\0" * (1 << 20)
            try:
                for _ in range(body >> 20):
                    self.wfile.write(chunk)
            except OSError:
                pass  # the reader stopped early: what it should do

        def log_message(self, *args: object) -> None:
            pass

    with serving(Flood) as server:
        src = Source(
            f"http://127.0.0.1:{server.server_port}/ds", retries=0, guard=SourceGuard(allow_hosts=("127.0.0.1",))
        )
        _refused_within_16_mib(src)


def test_one_tenants_requests_to_a_slow_source_hold_at_most_its_share_of_the_api(live: Live, tmp_path: Path) -> None:
    """`dataset create` lists the source and `dataset warm` fetches it inside the request, on an
    API worker thread, for as long as the tenant's source takes. 45 parallel creates against a
    source that answers after 100 s held all 40 of them: every tenant's requests (and
    /healthz) hung. Now a tenant has at most `dataset_source_ops_per_tenant` (2) under way; one
    more is a 429 naming the setting, and other requests go on."""
    import http.server
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    release = threading.Event()
    arrived: list[str] = []

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            arrived.append(self.path)
            release.wait(30)
            self.send_response(404)
            self.end_headers()

        do_GET = do_HEAD

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    src = f"http://127.0.0.1:{server.server_port}/ds"
    url = json.loads((live.home / "server.json").read_text())["url"]
    admin = {"Authorization": f"Bearer {(live.home / 'admin.token').read_text().strip()}"}
    (live.data / "ok").mkdir()
    (live.data / "ok" / "a.bin").write_bytes(b"a")
    assert post(live, {"name": "ok", "source": str(live.data / "ok")}).status_code == 201
    token = {"Authorization": f"Bearer {(live.home / 'token').read_text().strip()}"}
    try:
        with ThreadPoolExecutor(4) as pool:
            held = [pool.submit(post, live, {"name": f"slow{i}", "source": src}) for i in range(2)]
            for _ in range(200):  # both creates are inside the source now
                if len(arrived) >= 2:
                    break
                threading.Event().wait(0.05)
            third = post(live, {"name": "slow2", "source": src})
            assert third.status_code == 429, third.text
            assert "dataset_source_ops_per_tenant" in third.text
            warm = httpx.post(f"{url}/v1/datasets/ok/warm", headers=token, timeout=10)
            assert warm.status_code == 429 and "dataset_source_ops_per_tenant" in warm.text, warm.text
            # another tenant's requests are answered meanwhile
            assert httpx.get(f"{url}/v1/jobs", headers=admin, timeout=10).status_code == 200
            release.set()
            assert [f.result().status_code for f in held] == [422, 422]  # the slow source then said 404
    finally:
        release.set()
        server.shutdown()
        server.server_close()
    assert httpx.post(f"{url}/v1/datasets/ok/warm", headers=token, timeout=30).status_code == 200  # slots given back


def test_an_http_source_with_a_query_or_fragment_is_a_422_not_items_that_are_its_page(live: Live) -> None:
    """`source: http://host/set1/?a=1` (or `#frag`) was created as '10 files, 3.0 KiB': sluice
    asks for `<source>/<item>`, which after a query or fragment is the folder's page again, so
    every item read back as the index page. Now the source is refused, naming it (data walk s31)."""
    import http.server

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'<a href="a.bin">a.bin</a> <a href="b.bin">b.bin</a>'
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

        def log_message(self, *args: object) -> None:
            pass

    with serving(Index) as server:
        base = f"http://127.0.0.1:{server.server_port}/set1/"
        for name, source in (("query", base + "?a=1"), ("frag", base + "#x"), ("bare", base + "?")):
            r = post(live, {"name": name, "source": source})
            assert r.status_code == 422, r.text
            [problem] = r.json()["problems"]
            assert problem["field"] == "source" and "query ('?...') or fragment" in problem["problem"], problem


def test_a_fifo_in_a_local_source_is_refused_not_waited_on_for_ever(tmp_path: Path) -> None:
    """A FIFO in a tenant's own folder under dataset_roots was listed as a 0-byte file, and
    `dataset warm` then opened it and waited for a writer for ever: the helper never exited and
    the request held its API thread and its tenant's source slot (data walk s31). Now a listing
    names it, and a fetch of one (a file swapped for a FIFO after the listing) fails at once; a
    file that grew after its listing is read only to one byte past its size."""
    import threading

    src_dir = folder(tmp_path / "src", 2)
    os.mkfifo(src_dir / "p.bin")
    with pytest.raises(SourceError, match=r"p\.bin is not a regular file"):
        Source(str(src_dir), guard=SourceGuard.of([tmp_path], [])).list()
    src = Source(str(src_dir), retries=0)
    outcome: list[BaseException | bytes] = []

    def fetch() -> None:
        try:
            outcome.append(src.fetch("p.bin", 0))
        except BaseException as err:  # what the fetch ended with is the result
            outcome.append(err)

    worker = threading.Thread(target=fetch, daemon=True)
    worker.start()
    worker.join(timeout=10)
    if worker.is_alive():  # release it, so the test process can end
        with open(src_dir / "p.bin", "wb"):
            pass
        pytest.fail("fetching a FIFO waited for a writer")
    [err] = outcome
    assert isinstance(err, SourceError) and "is not a regular file" in str(err), err
    (src_dir / "00.bin").write_bytes(b"\0" * (32 << 20))  # listed as 10 bytes
    with pytest.raises(SourceError, match="more than the 10 bytes"):
        src.fetch("00.bin", 10)


def test_an_s3_item_is_read_only_to_one_byte_past_its_manifest_size(tmp_path: Path, no_aws: None) -> None:
    """The same as over HTTP, for S3: a tenant may name any public host as its `endpoint_url`,
    and s3fs's `cat_file` read a 10-byte item's whole body — 300 MiB from such an endpoint took
    the fetching process to 676 MiB RSS (data walk s31). Now the body is read to one byte past
    the size, and the item refused."""
    import http.server

    body = 64 << 20

    class FakeS3(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "10")
            self.send_header("ETag", '"e"')
            self.end_headers()

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(body))
            self.send_header("ETag", '"e"')
            self.end_headers()
            chunk = b"\0" * (1 << 20)
            try:
                for _ in range(body >> 20):
                    self.wfile.write(chunk)
            except OSError:
                pass  # the reader stopped early: what it should do

        def log_message(self, *args: object) -> None:
            pass

    with serving(FakeS3) as server:
        endpoint = f"http://127.0.0.1:{server.server_port}"
        src = Source(
            "s3://bkt/ds",
            {"endpoint_url": endpoint, "key": "k", "secret": "s"},
            retries=0,
            guard=SourceGuard(allow_hosts=("127.0.0.1",)),
        )
        _refused_within_16_mib(src)


def test_an_apache_index_pages_sort_links_are_not_items(tmp_path: Path) -> None:
    """Apache's index pages link `?C=N;O=D` and the like (sort by name, date, size): each was
    listed as an item of the dataset, which read back as the index page (data walk s31)."""
    import http.server

    page = (
        b'<a href="?C=N;O=D">Name</a> <a href="?C=M;O=A">Last modified</a> <a href="#top">top</a> '
        b'<a href="/">Parent Directory</a> <a href="a.bin">a.bin</a> <a href="b%3Fc.bin">b?c.bin</a>'
    )

    class Apache(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page if self.path.endswith("/") else b"0123456789"
            self.send_response(200 if self.path.endswith(("/", ".bin")) else 404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

        def log_message(self, *args: object) -> None:
            pass

    with serving(Apache) as server:
        src = Source(f"http://127.0.0.1:{server.server_port}/set1/", retries=0)
        manifest = src.list(timeout_s=30)
        assert list(manifest.keys) == ["a.bin", "b%3Fc.bin"], manifest.keys
