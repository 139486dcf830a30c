"""The pure confinement rules: checkpoint locations (control/confine.py) and the source guard's
address and path checks (data/guard.py), over random paths with `..`, symlinks and absolute
parts."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.control.confine import checkpoint_dir, confine_checkpoint
from sluice.data.guard import SourceGuard, SourceRefused, address_refusal
from sluice.model.runfolder import plane_name
from sluice.spec import SpecError

segment = st.sampled_from(
    ["..", ".", "a", "b", "escape", "", "ckpt", "attempt-1", "job.log", "job.log.attempts", "work"]
)
paths = st.lists(segment, min_size=1, max_size=8).map("/".join)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("confine")
    (base / "root" / "a").mkdir(parents=True)
    (base / "root" / "escape").symlink_to("/etc")
    (base / "outside").mkdir()
    return base


@settings(max_examples=300, deadline=None)
@given(rel=paths, absolute=st.booleans())
def test_an_accepted_location_always_stays_in_a_root_or_the_run_folder(tree: Path, rel: str, absolute: bool) -> None:
    root = str(tree / "root")
    location = f"{root}/{rel}" if absolute else rel
    try:
        kept = confine_checkpoint(location, [root])
    except SpecError as err:
        assert err.problems[0].field == "checkpoint.location"
        return
    assert kept is not None
    folder = checkpoint_dir(kept, "/runs", "job-1")
    if absolute:
        assert _inside(os.path.realpath(folder), os.path.realpath(root))
    else:  # strictly below the run folder, and never in a folder of the plane's there
        rel_kept = os.path.relpath(os.path.normpath(folder), "/runs/job-1")
        assert rel_kept != "." and not rel_kept.startswith("..")
        assert plane_name(rel_kept.split("/")[0]) is None


def test_symlink_and_dotdot_examples(tree: Path) -> None:
    root = str(tree / "root")
    with pytest.raises(SpecError):
        confine_checkpoint(f"{root}/escape/cron.d", [root])
    with pytest.raises(SpecError):
        confine_checkpoint(f"{root}/../outside", [root])
    assert confine_checkpoint(f"{root}/a/../a", [root]) == os.path.realpath(f"{root}/a")
    assert checkpoint_dir(None, "/runs/", "j") == "/runs/j/checkpoints"
    assert checkpoint_dir("s3://b/ck", "/runs", "j") == "s3://b/ck/j/checkpoints"


@pytest.mark.parametrize(
    ("location", "why"),
    [
        (".", "run folder itself"),
        ("./", "run folder itself"),
        ("a/..", "run folder itself"),
        ("file://", "run folder itself"),
        ("attempt-1", "attempt folder"),
        ("./attempt-1/", "attempt folder"),
        ("attempt-7/x", "attempt folder"),
        ("attempt-x", "attempt folder"),  # the agent adopts any attempt-*/state.json
        ("a/../attempt-1", "attempt folder"),
        ("file://attempt-2", "attempt folder"),
        ("job.log", "job's log"),
        ("job.log/x", "job's log"),
        ("job.log.attempts", "index of the job's log"),  # the agent writes it beside job.log
        ("./job.log.attempts/x", "index of the job's log"),
        ("work", "working folder"),
        ("work/ckpt", "working folder"),
    ],
)
def test_a_relative_location_on_a_plane_folder_is_refused(location: str, why: str) -> None:
    """The checkpoint folder is handed to the job's uid: the run folder itself and the
    plane's names in it (attempt-<n>, job.log, job.log.attempts, work) would hand it plane files."""
    with pytest.raises(SpecError) as err:
        confine_checkpoint(location, [])
    (problem,) = err.value.problems
    assert problem.field == "checkpoint.location" and why in problem.problem, problem.problem


@pytest.mark.parametrize(
    ("location", "kept"),
    [("ckpt", "ckpt"), ("checkpoints", "checkpoints"), ("./ckpt/latest/", "ckpt/latest"), ("attempts", "attempts")],
)
def test_a_relative_location_below_the_run_folder_is_kept(location: str, kept: str) -> None:
    assert confine_checkpoint(location, []) == kept
    assert checkpoint_dir(kept, "/runs", "j") == f"/runs/j/{kept}"


@given(rel=paths)
def test_local_sources_accepted_only_inside_the_roots(tree: Path, rel: str) -> None:
    root = str(tree / "root")
    guard = SourceGuard.of([root], [])
    try:
        guard.check(f"{root}/{rel}")
    except SourceRefused as err:
        assert err.field == "source"
        return
    assert _inside(os.path.realpath(f"{root}/{rel}"), os.path.realpath(root))


@given(n=st.integers(min_value=0, max_value=2**32 - 1))
def test_every_ipv4_refusal_matches_the_standard_classes(n: int) -> None:
    ip = ipaddress.IPv4Address(n)
    refused = address_refusal(ip) is not None
    assert refused == (not ip.is_global or ip.is_multicast)
    mapped = ipaddress.IPv6Address(f"::ffff:{ip}")
    assert (address_refusal(mapped) is not None) == refused


def test_allow_list_by_network_and_by_name() -> None:
    guard = SourceGuard.of([], ["10.0.0.0/8", "Objects.Internal"])
    assert guard.address_problem(ipaddress.ip_address("10.2.3.4")) is None
    assert guard.address_problem(ipaddress.ip_address("192.168.1.1")) == "a private address"
    guard.check_host("objects.internal")  # allowed by name, never resolved
    with pytest.raises(SourceRefused):
        guard.check_host("127.0.0.1")


def test_an_allow_entry_with_a_port_allows_that_port_only() -> None:
    """Allowing an object store at 10.0.0.5 allowed every port on it (its admin console, a
    database beside it): an entry may now name the one port."""
    guard = SourceGuard.of([], ["10.0.0.0/8:9000", "objects.internal:9000", "[fd00::/8]:443", "store.lan"])
    ip = ipaddress.ip_address("10.2.3.4")
    assert guard.address_problem(ip, 9000) is None
    assert guard.address_problem(ip, 22) == "a private address"
    assert guard.address_problem(ip) == "a private address"  # "any port" needs an entry without one
    assert guard.address_problem(ipaddress.ip_address("fd00::1"), 443) is None
    assert guard.address_problem(ipaddress.ip_address("fd00::1"), 80) is not None
    guard.check_host("objects.internal", port=9000)
    with pytest.raises(SourceRefused, match="allow-lists the host on port 8080"):
        guard.check_host("10.9.9.9", port=8080)
    assert not guard.host_named("objects.internal", 8080)
    guard.check_host("store.lan", port=1234)  # no port: every port, as before
    guard.check("http://10.1.1.1:9000/data/")
    with pytest.raises(SourceRefused, match="on port 80 "):
        guard.check("http://10.1.1.1/data/")  # the scheme's default port is the port checked
    guard.check("s3://b/d", {"endpoint_url": "http://10.1.1.1:9000"})
    with pytest.raises(SourceRefused) as err:
        guard.check("s3://b/d", {"endpoint_url": "https://10.1.1.1"})
    assert err.value.field == "storage_options.endpoint_url" and "port 443" in err.value.problem
    with pytest.raises(SourceRefused, match="not a number from 0 to 65535"):
        guard.check("http://10.1.1.1:99999/data/")


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("10.0.0.0/33", "not a host name, an IP address or a network"),
        ("store:http", "the port must be a number from 1 to 65535"),
        ("store:0", "the port must be a number from 1 to 65535"),
        ("fd00::zz", "with a port, write it in brackets"),
        ("[fd00::1", "[ADDRESS or NETWORK]"),
        ("bad host", "not a host name"),
        ("", "an empty entry"),
        # redteam32, s32: these were read as something they did not say.
        ("store:\u00b2", "the port must be a number from 1 to 65535"),  # int() failed: a bare int() message
        ("store:\uff19\uff10\uff10\uff10", "the port must be a number from 1 to 65535"),  # was port 9000
        ("010.0.0.1", "not an IP address"),  # a name to the guard; 8.0.0.1 to the resolver
        ("10.0.0.256:9000", "not an IP address"),
        ("0x7f.1", "not an IP address"),
        ("[::ffff:10.0.0.1]:9000", "IPv4-mapped IPv6 entry allows nothing"),  # compared as 10.0.0.1: never matched
    ],
)
def test_an_allow_entry_the_guard_cannot_read_is_refused_in_settings(entry: str, says: str) -> None:
    """Such an entry allowed nothing and said nothing: the admin's store stayed refused."""
    from pydantic import ValidationError

    from sluice.settings import Settings

    with pytest.raises(ValidationError) as err:
        Settings(allow_source_hosts=[entry])
    assert "allow_source_hosts" in str(err.value) and says in str(err.value)
    Settings(allow_source_hosts=["10.0.0.0/8", "[fd00::/8]:9000", "objects.internal:9000", "127.0.0.1", "fd00::/8"])
    assert SourceGuard.of([], ["fd00::/8"]).address_problem(ipaddress.ip_address("fd00::5"), 22) is None
