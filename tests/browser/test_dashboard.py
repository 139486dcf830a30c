"""The dashboard in a real browser against a real sluice: sign in with a tenant token, watch
a real job's loss chart grow, cancel it from its page, and see only one's own jobs."""

from __future__ import annotations

import time
from typing import Any

import pytest
from selenium.common.exceptions import NoAlertPresentException, NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.integration.conftest import wait_for

from .conftest import Live

pytestmark = pytest.mark.integration


def sign_in(page: Any, live: Live, tenant: str) -> None:
    page.get(live.url + "/")  # redirects to /ui/, which asks for a token
    box = wait(page, 20).until(lambda d: d.find_element(By.ID, "token"))
    box.send_keys(live.tokens[tenant])
    page.find_element(By.ID, "signin-button").click()
    wait(page, 20).until(lambda d: not d.find_elements(By.ID, "signin"))


def wait(page: Any, timeout: float) -> WebDriverWait:  # type: ignore[type-arg]
    """WebDriverWait that looks again when the page re-rendered (it polls the API) under it."""
    return WebDriverWait(page, timeout, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException))


def job_rows(page: Any) -> list[str]:
    """The job ids the list shows now, read in one go (the table is replaced on each poll)."""
    script = "return [...document.querySelectorAll('tr[data-job]')].map(r => r.dataset.job)"
    ids: list[str] = page.execute_script(script)
    return ids


def click(page: Any, by: str, what: str) -> None:
    """Click the element once it exists; the page re-renders as it polls, so an element found
    just before a refresh is looked up again."""

    def clicked(d: Any) -> bool:
        try:
            d.find_element(by, what).click()
            return True
        except (StaleElementReferenceException, NoSuchElementException):
            return False

    wait(page, 20).until(clicked)


def points(page: Any, chart: str) -> int:
    return int(page.find_element(By.ID, chart).get_attribute("data-points") or 0)


def test_sign_in_watch_the_loss_chart_grow_and_cancel_the_job(page: Any, live: Live) -> None:
    job = live.submit("alice", "dash-loop")
    sign_in(page, live, "alice")

    page.get(f"{live.url}/ui/jobs")
    link = f'tr[data-job="{job["id"]}"] a'
    wait(page, 30).until(lambda d: d.find_element(By.CSS_SELECTOR, link).text == "dash-loop")
    click(page, By.CSS_SELECTOR, link)

    wait(page, 60).until(lambda d: points(d, "loss-chart") >= 2)
    before = points(page, "loss-chart")
    wait(page, 30).until(lambda d: points(d, "loss-chart") > before)  # live: it keeps growing
    wait(page, 10).until(lambda d: d.find_element(By.ID, "job-phase").text == "Running")
    assert page.find_elements(By.CSS_SELECTOR, "#timeline tr"), "no decision timeline"
    fields = page.find_element(By.ID, "job-fields").text
    assert "Replicas 1 running (spec: 1)" in fields, fields
    assert "Latest checkpoint none yet" in fields  # sdk_loop saves only when asked to stop
    wait(page, 30).until(lambda d: "fresh start" in d.find_element(By.ID, "log").text)

    click(page, By.ID, "cancel-button")
    wait(page, 10).until(lambda d: _alert(d)).accept()  # "Cancel job dash-loop?"
    assert wait_for(lambda: live.job("alice", job["id"])["phase"] == "Cancelled", 30), live.job("alice", job["id"])
    wait(page, 20).until(lambda d: d.find_element(By.ID, "job-phase").text == "Cancelled")
    assert not page.find_elements(By.ID, "cancel-button")
    # the cancel asked it to stop: it saved a checkpoint, which the page now shows
    wait(page, 20).until(lambda d: "Latest checkpoint none yet" not in d.find_element(By.ID, "job-fields").text)


def _alert(driver: Any) -> Any:
    try:
        return driver.switch_to.alert
    except NoAlertPresentException:
        return False


def test_a_tenant_sees_only_its_own_jobs(page: Any, live: Live) -> None:
    mine = live.submit("alice", "alice-job")
    theirs = live.submit("bob", "bob-job")
    page.get(live.url + "/")
    wait(page, 20).until(lambda d: d.find_element(By.ID, "token")).send_keys("slc_not-a-token")
    page.find_element(By.ID, "signin-button").click()
    wait(page, 20).until(lambda d: "not accepted" in d.find_element(By.ID, "signin").text)
    sign_in(page, live, "alice")

    page.get(f"{live.url}/ui/jobs")
    wait(page, 30).until(lambda d: mine["id"] in job_rows(d))
    later = live.submit("alice", "alice-later")  # the open list picks it up by polling
    wait(page, 30).until(lambda d: later["id"] in job_rows(d))
    time.sleep(2.5)  # at least one more poll of the list
    assert sorted(job_rows(page)) == sorted([mine["id"], later["id"]])
    assert theirs["id"] not in page.page_source and "bob-job" not in page.page_source

    page.get(f"{live.url}/ui/jobs/{theirs['id']}")  # bob's job page, by URL
    error = wait(page, 20).until(lambda d: d.find_element(By.ID, "error"))
    assert "not found" in error.text
    assert "bob-job" not in page.page_source

    page.get(f"{live.url}/ui/nodes")  # a tenant sees the nodes, but has no cordon button
    wait(page, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-node]"))
    assert not page.find_elements(By.XPATH, "//button[text()='Cordon']")
    assert theirs["id"] not in page.page_source


def test_an_admin_cordons_and_uncordons_a_node_from_the_nodes_page(page: Any, live: Live) -> None:
    sign_in(page, live, "admin")
    page.get(f"{live.url}/ui/nodes")
    node = wait(page, 20).until(lambda d: d.find_element(By.CSS_SELECTOR, "tr[data-node]").get_attribute("data-node"))
    click(page, By.XPATH, f"//tr[@data-node='{node}']//button[text()='Cordon']")
    prompt = wait(page, 10).until(lambda d: _alert(d))
    prompt.send_keys("disk check")
    prompt.accept()

    def health() -> str:
        with live.api("admin") as c:
            return str(next(n for n in c.get("/v1/nodes").json()["items"] if n["name"] == node)["health"])

    assert wait_for(lambda: health() == "Cordoned", 20), health()
    click(page, By.XPATH, f"//tr[@data-node='{node}']//button[text()='Uncordon']")
    assert wait_for(lambda: health() == "Healthy", 20), health()


@pytest.mark.parametrize(
    ("path", "shown"),
    [("/ui/", "Jobs by phase"), ("/ui/queues", "default"), ("/ui/datasets", "No datasets."), ("/ui/jobs", "No jobs.")],
)
def test_the_other_pages_render_without_errors(page: Any, live: Live, path: str, shown: str) -> None:
    sign_in(page, live, "alice")
    page.get_log("browser")  # drop what earlier pages logged (the 404 of another tenant's job, say)
    page.get(live.url + path)
    wait(page, 20).until(lambda d: shown in d.find_element(By.ID, "main").text)
    assert not page.find_elements(By.ID, "error")
    assert [e for e in page.get_log("browser") if e["level"] == "SEVERE"] == []


def test_suspend_and_resume_from_the_job_page(page: Any, live: Live) -> None:
    job = live.submit("alice", "pausable")
    sign_in(page, live, "alice")
    page.get(f"{live.url}/ui/jobs/{job['id']}")
    wait(page, 60).until(lambda d: d.find_element(By.ID, "job-phase").text == "Running")

    click(page, By.ID, "suspend-button")
    assert wait_for(lambda: live.job("alice", job["id"])["phase"] == "Suspended", 30), live.job("alice", job["id"])
    click(page, By.ID, "resume-button")
    assert wait_for(lambda: live.job("alice", job["id"])["phase"] == "Running", 60), live.job("alice", job["id"])
    wait(page, 20).until(lambda d: d.find_element(By.ID, "job-phase").text == "Running")


def test_nodes_show_kpi_sparklines_and_the_other_pages_the_new_fields(page: Any, live: Live) -> None:
    with live.api("alice") as c:
        r = c.post("/v1/datasets?probe=false", json={"name": "imgs", "source": "s3://bucket/imgs"})
    assert r.status_code == 201, r.text
    sign_in(page, live, "alice")

    page.get(f"{live.url}/ui/nodes")  # the agents sample KPIs every second: the sparkline fills
    spark = "tr[data-node] td.kpi-cpu .spark"
    wait(page, 30).until(lambda d: int(d.find_element(By.CSS_SELECTOR, spark).get_attribute("data-points")) >= 2)
    assert page.find_element(By.CSS_SELECTOR, f"{spark} canvas")
    assert "Anomaly score / threshold" in page.find_element(By.ID, "nodes").text
    assert page.find_element(By.CSS_SELECTOR, "td.anomaly").text == "no monitor"  # health monitor off here
    page.get_log("browser")  # drop the nodes page's admin probe (GET /v1/tenants is a 403 for alice)

    page.get(f"{live.url}/ui/datasets")
    wait(page, 20).until(lambda d: d.find_element(By.CSS_SELECTOR, "#datasets td.hit-rate").text == "no reads yet")
    assert page.find_element(By.CSS_SELECTOR, "#datasets td.hits").text == "0 / 0"

    page.get(f"{live.url}/ui/")
    wait(page, 20).until(lambda d: "ms" in d.find_element(By.ID, "round-latency").text)
    assert page.find_element(By.CSS_SELECTOR, '#queue-depth tr[data-queue="default"]')
    wait(page, 20).until(lambda d: points(d, "allocation-chart") >= 1)
    assert not page.find_elements(By.ID, "error")
    assert [e for e in page.get_log("browser") if e["level"] == "SEVERE"] == []


def test_an_admin_filters_the_job_list_by_tenant(page: Any, live: Live) -> None:
    a, b = live.submit("alice", "alice-job"), live.submit("bob", "bob-job")
    sign_in(page, live, "admin")
    page.get(f"{live.url}/ui/jobs")
    wait(page, 30).until(lambda d: {a["id"], b["id"]} <= set(job_rows(d)))  # an admin sees every tenant's
    options = page.execute_script("return [...document.querySelectorAll('#filter-tenant option')].map(o => o.value)")
    assert {live.names["alice"], live.names["bob"]} <= set(options)
    page.get(f"{live.url}/ui/jobs?tenant={live.names['bob']}")
    wait(page, 30).until(lambda d: job_rows(d) == [b["id"]])
    time.sleep(2.5)  # still only bob's after another poll
    assert job_rows(page) == [b["id"]]


def test_a_job_page_links_what_it_starts_after_and_a_node_links_its_jobs(page: Any, live: Live) -> None:
    """The job page shows what a job starts after (each a link to that job's page), its array,
    run time and disk; the nodes page links the caller's jobs running on each node. Both list
    several links in one cell, which came out as "[object HTMLAnchorElement]" text: the page's
    element builder flattened its children one level only."""
    first = live.submit("alice", "first")
    second = live.submit("alice", "second")
    waiter = live.submit("alice", "waiter", after=[first["id"]], after_any=[second["id"]])
    sign_in(page, live, "alice")
    page.get(f"{live.url}/ui/jobs/{waiter['id']}")
    wait(page, 30).until(lambda d: "Starts after (each ended)" in d.find_element(By.ID, "job-fields").text)
    fields = page.find_element(By.ID, "job-fields")
    assert f"Starts after (each succeeded) {first['id']}" in fields.text
    assert f"Starts after (each ended) {second['id']}" in fields.text
    assert "object" not in fields.text
    links = [a.get_attribute("href") for a in fields.find_elements(By.CSS_SELECTOR, "a")]
    assert links == [f"{live.url}/ui/jobs/{first['id']}", f"{live.url}/ui/jobs/{second['id']}"]

    assert wait_for(lambda: all(live.job("alice", j["id"])["phase"] == "Running" for j in (first, second)), 60)
    page.get(f"{live.url}/ui/nodes")
    wait(page, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-node] td a"))
    table = page.find_element(By.ID, "nodes")
    assert "object" not in table.text
    shown = {a.text for a in table.find_elements(By.CSS_SELECTOR, "tr[data-node] td a")}
    assert {"first", "second"} <= shown, table.text
