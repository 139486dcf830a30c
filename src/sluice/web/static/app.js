// The sluice dashboard. Every figure on every page comes from the JSON API (/v1/...), called
// with the signed-in tenant's token as its bearer token: the dashboard sees exactly what that
// tenant may see, and authorization stays in the control plane. Data is always inserted as
// text (never as HTML): job names, reasons and logs are other people's strings.
"use strict";

const TOKEN_KEY = "sluice.token";
const POLL_MS = 2000;
const PHASES = ["Pending", "Queued", "Starting", "Running", "Stopping", "Suspended", "Succeeded", "Failed", "Cancelled"];
const TERMINAL = new Set(["Succeeded", "Failed", "Cancelled"]);
const main = document.getElementById("main");
let timers = [];

class ApiError extends Error {
  constructor(status, detail) {
    super(`${status}: ${detail}`);
    this.status = status;
  }
}

const token = () => sessionStorage.getItem(TOKEN_KEY);

/** Call the API as the signed-in tenant; JSON or text back, ApiError on a non-2xx answer. */
async function api(path, opts = {}) {
  const headers = { Authorization: `Bearer ${token()}`, ...(opts.headers || {}) };
  const r = await fetch(path, { ...opts, headers });
  if (r.status === 401) {
    signOut();
    throw new ApiError(401, "the token was not accepted");
  }
  if (!r.ok) {
    let detail = r.statusText;
    try {
      const body = await r.json();
      detail = body.detail || body.error || detail;
    } catch (_) { /* not JSON */ }
    throw new ApiError(r.status, typeof detail === "string" ? detail : JSON.stringify(detail));
  }
  return (r.headers.get("content-type") || "").includes("json") ? r.json() : r.text();
}

/** Every page of a list endpoint (the API pages with ?cursor=). */
async function all(path) {
  const items = [];
  let cursor = null;
  for (let i = 0; i < 20; i++) {
    const sep = path.includes("?") ? "&" : "?";
    const page = await api(`${path}${sep}limit=1000${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
    items.push(...page.items);
    if (!page.next_cursor) break;
    cursor = page.next_cursor;
  }
  return items;
}

/** Build an element: h("td", {class: "x"}, "text", child). Strings become text nodes. */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  // Flattened all the way down: a cell of several links is a list of [separator, link] pairs.
  for (const c of children.flat(Infinity)) el.append(c instanceof Node ? c : document.createTextNode(String(c ?? "")));
  return el;
}

const fmtTime = (t) => (t ? new Date(t * 1000).toLocaleString() : "");
const fmtNum = (x, d = 3) => (x === null || x === undefined ? "" : Number(x).toPrecision(d));
const cpuOf = (alloc) => (alloc || []).reduce((s, a) => s + a.cpu_request, 0);
const phaseCell = (p) => h("span", { class: `phase phase-${p}` }, p);
const jobLink = (j) => h("a", { href: `/ui/jobs/${encodeURIComponent(j.id)}` }, j.name || j.id);

function every(ms, fn) {
  fn();
  timers.push(setInterval(fn, ms));
}

function showError(where, err) {
  where.replaceChildren(h("p", { class: "error", id: "error" }, String(err.message || err)));
}

function table(headers, rows, attrs = {}) {
  return h("table", attrs, h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))), h("tbody", {}, rows));
}

/** Is the caller an admin? Asked of the API (only admins may list tenants), never assumed. */
let adminCache = null;
async function isAdmin() {
  if (adminCache === null) {
    try {
      await api("/v1/tenants?limit=1");
      adminCache = true;
    } catch (e) {
      if (e.status !== 403) throw e;
      adminCache = false;
    }
  }
  return adminCache;
}

// ---- sign in ------------------------------------------------------------------------------

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  adminCache = null;
  route();
}

function signIn(message) {
  const input = h("input", { id: "token", type: "password", autocomplete: "off", placeholder: "tenant token" });
  const form = h(
    "form",
    { class: "signin", id: "signin" },
    h("h2", {}, "Sign in"),
    h("p", {}, "Paste your tenant's API token (", h("code", {}, "sluice tenant create"), " prints it; ",
      h("code", {}, "$SLUICE_HOME/token"), " holds the default tenant's). It stays in this browser tab only."),
    message ? h("p", { class: "error" }, message) : "",
    input,
    h("button", { type: "submit", id: "signin-button" }, "Sign in"),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    try {
      await api("/v1/jobs?limit=1");
      route();
    } catch (e) {
      sessionStorage.removeItem(TOKEN_KEY);
      signIn(e.status === 401 ? "That token was not accepted." : e.message);
    }
  });
  main.replaceChildren(form);
  input.focus();
}

// ---- overview -----------------------------------------------------------------------------

async function overviewPage() {
  const body = h("div", {});
  const depth = h("div", {});
  const charts = h("div", { class: "charts" });
  main.replaceChildren(h("h1", {}, "Cluster overview"), body, h("h2", {}, "Queue depth"), depth, charts);
  // The allocation timeline is the server's bounded history (GET /v1/cluster/stats: a sample
  // every 2 s, the last ten minutes), so it is full as soon as the page opens.
  const allocChart = chart(charts, "CPU cores: requested vs cluster (last 10 minutes)", ["requested", "cluster cores"], { id: "allocation-chart" });
  every(POLL_MS * 2, async () => {
    try {
      const [jobs, nodes, queues, stats] = await Promise.all([all("/v1/jobs"), all("/v1/nodes"), all("/v1/queues"), api("/v1/cluster/stats")]);
      const count = (xs, f) => xs.filter(f).length;
      const cores = nodes.reduce((s, n) => s + n.cpu, 0);
      const requested = nodes.reduce((s, n) => s + n.cpu_requested, 0);
      const ms = (x) => (x === null || x === undefined ? "–" : `${fmtNum(x * 1000)} ms`);
      const r = stats.rounds;
      const card = (label, value, sub, id) => h("div", { class: "card", id }, h("div", {}, label), h("div", { class: "big" }, value), h("div", { class: "muted" }, sub || ""));
      body.replaceChildren(
        h("div", { class: "cards" },
          card("Running jobs", count(jobs, (j) => j.phase === "Running"), `${jobs.length} visible to you`),
          card("Waiting jobs", count(jobs, (j) => ["Pending", "Queued"].includes(j.phase)), ""),
          card("Nodes", nodes.length, `${count(nodes, (n) => n.health !== "Healthy")} not healthy`),
          card("CPU requested", `${fmtNum(requested)} / ${fmtNum(cores)}`, "cores, whole cluster"),
          card("Round latency", `p50 ${ms(r.p50)}`, `p95 ${ms(r.p95)}, max ${ms(r.max)}, last ${r.count} rounds`, "round-latency"),
          card("Queues", queues.length, "you may use")),
        h("h2", {}, "Jobs by phase"),
        table(PHASES, [h("tr", {}, PHASES.map((p) => h("td", {}, h("a", { href: `/ui/jobs?phase=${p}` }, count(jobs, (j) => j.phase === p)))))]),
      );
      depth.replaceChildren(table(["Queue", "Pending", "Admitted"], queues.map((q) => h("tr", { "data-queue": q.name },
        h("td", {}, h("a", { href: `/ui/jobs?queue=${encodeURIComponent(q.name)}` }, q.name)), h("td", {}, q.pending), h("td", {}, q.admitted))), { id: "queue-depth" }));
      const a = stats.allocation;
      allocChart([a.map((x) => x[0]), a.map((x) => x[1]), a.map((x) => x[2])]);
    } catch (e) {
      showError(body, e);
    }
  });
}

// ---- jobs list ----------------------------------------------------------------------------

async function jobsPage() {
  const params = new URLSearchParams(location.search);
  const phase = params.get("phase") || "";
  const queue = params.get("queue") || "";
  const tenant = params.get("tenant") || "";
  const phaseSel = h("select", { name: "phase", id: "filter-phase" }, h("option", { value: "" }, "any phase"),
    PHASES.map((p) => h("option", { value: p, selected: p === phase }, p)));
  const queueSel = h("select", { name: "queue", id: "filter-queue" }, h("option", { value: "" }, "any queue"));
  if (queue) queueSel.append(h("option", { value: queue, selected: true }, queue));
  // Tenants: those whose jobs the caller sees (an admin sees every tenant's; a tenant, its own).
  const tenantSel = h("select", { name: "tenant", id: "filter-tenant" }, h("option", { value: "" }, "any tenant"));
  if (tenant) tenantSel.append(h("option", { value: tenant, selected: true }, tenant));
  const seenTenants = new Set(tenant ? [tenant] : []);
  const form = h("form", { class: "filters", method: "get", action: "/ui/jobs" }, "Phase", phaseSel, "Queue", queueSel,
    "Tenant", tenantSel, h("button", { type: "submit" }, "Filter"));
  for (const sel of [phaseSel, queueSel, tenantSel]) sel.addEventListener("change", () => form.submit());
  const body = h("div", {});
  main.replaceChildren(h("h1", {}, "Jobs"), form, body);
  all("/v1/queues").then((qs) => qs.forEach((q) => q.name !== queue && queueSel.append(h("option", { value: q.name }, q.name)))).catch(() => {});
  every(POLL_MS, async () => {
    try {
      let jobs = await all(`/v1/jobs${phase ? `?phase=${encodeURIComponent(phase)}` : ""}`);
      for (const j of jobs) {
        if (!seenTenants.has(j.tenant)) {
          seenTenants.add(j.tenant);
          tenantSel.append(h("option", { value: j.tenant }, j.tenant));
        }
      }
      if (queue) jobs = jobs.filter((j) => (j.spec.queue || "default") === queue);
      if (tenant) jobs = jobs.filter((j) => j.tenant === tenant);
      jobs.reverse(); // newest first
      const rows = jobs.map((j) => h("tr", { "data-job": j.id },
        h("td", {}, jobLink(j)), h("td", {}, j.tenant), h("td", {}, j.spec.queue || "default"), h("td", {}, phaseCell(j.phase)),
        h("td", {}, j.step), h("td", {}, fmtNum(j.loss)), h("td", {}, fmtNum(cpuOf(j.allocation))),
        h("td", {}, fmtTime(j.submitted_at)), h("td", { class: "muted" }, j.reason)));
      body.replaceChildren(jobs.length ? table(["Job", "Tenant", "Queue", "Phase", "Step", "Loss", "CPU", "Submitted", "Reason"], rows, { id: "jobs" })
        : h("p", { class: "muted", id: "jobs" }, "No jobs."));
    } catch (e) {
      showError(body, e);
    }
  });
}

// ---- job page -----------------------------------------------------------------------------

/** A uPlot line chart in `box`; returns a function taking uPlot data ([xs, ys...]). The
 * number of x values is kept on the box (data-points) so tests and users can see it grow. */
function chart(box, title, series, opts = {}) {
  const holder = h("div", {});
  box.append(h("div", { class: "chart", id: opts.id }, h("h3", {}, title), holder));
  const colors = ["#1d3557", "#e63946", "#2a9d8f"];
  const plot = new uPlot({
    width: 520, height: 220,
    scales: { x: { time: true } },
    series: [{}, ...series.map((label, i) => ({ label, stroke: colors[i], width: 2, ...(opts.stepped && i === 0 ? { paths: uPlot.paths.stepped({ align: 1 }) } : {}) }))],
  }, [[], ...series.map(() => [])], holder);
  return (data) => {
    holder.parentElement.dataset.points = data[0].length;
    plot.setData(data);
  };
}

/** A small uPlot line (no axes, no legend) for a table cell; returns {el, set(data)}. The
 * number of points is kept on the element (data-points), as chart() does. */
function sparkline(label, series, { min = 0, max = 100 } = {}) {
  const el = h("span", { class: "spark", title: label, "data-points": 0 });
  const colors = ["#1d3557", "#e63946"];
  const plot = new uPlot({
    width: 120, height: 32, legend: { show: false }, cursor: { show: false }, axes: [{ show: false }, { show: false }],
    scales: { x: { time: false }, y: { range: (_u, lo, hi) => [Math.min(min, lo), Math.max(max, hi)] } },
    series: [{}, ...series.map((s, i) => ({ label: s, stroke: colors[i], width: 1.5 }))],
  }, [[], ...series.map(() => [])], el);
  return { el, set(data) { el.dataset.points = data[0].length; plot.setData(data); } };
}

/** CPU cores allocated at each time: a step function from the launch/resize events, which
 * carry the allocation they made, ending when the job ended. */
function allocationAt(events, job) {
  const steps = events.filter((e) => e.data && Array.isArray(e.data.allocation)).map((e) => [e.time, cpuOf(e.data.allocation)]);
  return (t) => {
    if (job.finished_at && t >= job.finished_at) return 0;
    let v = null;
    for (const [when, cores] of steps) if (when <= t) v = cores;
    return v;
  };
}

async function jobPage(id) {
  let job;
  try {
    job = await api(`/v1/jobs/${encodeURIComponent(id)}`);
  } catch (e) {
    main.replaceChildren(h("h1", {}, "Job"), h("p", { class: "error", id: "error" },
      e.status === 404 ? `Job ${id} not found (it does not exist, or it is not yours).` : e.message));
    return;
  }
  const head = h("div", {});
  const buttons = h("div", { class: "buttons" });
  const charts = h("div", { class: "charts" });
  const events = h("div", {});
  const follow = h("input", { type: "checkbox", id: "follow", checked: true });
  const log = h("pre", { class: "log", id: "log" });
  const msg = h("div", {});
  main.replaceChildren(h("h1", {}, `Job ${job.name}`), msg, head, buttons, charts, h("h2", {}, "Decision timeline"), events,
    h("h2", {}, "Log ", h("label", { class: "muted" }, follow, " follow")), log);
  const lossChart = chart(charts, "Loss (normalised to the largest so far)", ["loss"], { id: "loss-chart" });
  const rateChart = chart(charts, "Throughput (steps/s, sampled while this page is open)", ["steps/s"], { id: "throughput-chart" });
  const cpuChart = chart(charts, "CPU cores: allocated vs used", ["allocated", "used"], { id: "cpu-chart", stepped: true });
  const rate = [[], []];

  const act = (verb, label, cls) => h("button", { type: "button", id: `${verb}-button`, class: cls, onclick: async () => {
    if (verb === "cancel" && !confirm(`Cancel job ${job.name}?`)) return;
    try {
      job = await api(`/v1/jobs/${encodeURIComponent(id)}/${verb}`, { method: "POST" });
      msg.replaceChildren(h("p", { class: "muted", id: "action-result" }, `${label}: job is now ${job.phase}`));
      render();
    } catch (e) {
      msg.replaceChildren(h("p", { class: "error", id: "error" }, `${label} failed: ${e.message}`));
    }
  } }, label);

  /** Replicas running now, and the range the spec allows (elastic jobs move within it). */
  function replicasOf(j) {
    const r = (j.spec.resources || {}).replicas || {};
    const now = (j.allocation || []).length;
    const range = r.max == null || r.min === r.max ? `${r.min ?? 1}` : `${r.min}–${r.max}`;
    return `${now} running (spec: ${range})`;
  }

  /** Links to the jobs (or arrays) this one starts after: ids only, the spec names no more. */
  const idLinks = (ids) => ids.map((id, k) => [k ? ", " : "", h("a", { href: `/ui/jobs/${encodeURIComponent(id)}` }, id)]);

  /** The rows only some jobs have: what it starts after, its array, its run time and disk. */
  function optionalRows(row) {
    const s = job.spec, out = [];
    if ((s.after || []).length) out.push(row("Starts after (each succeeded)", idLinks(s.after)));
    if ((s.after_any || []).length) out.push(row("Starts after (each ended)", idLinks(s.after_any)));
    if (s.array) out.push(row("Array", `${s.array.index} of ${s.array.count} in ${s.array.id}`));
    const limit = job.time_limit_s == null ? "" : ` of ${fmtNum(job.time_limit_s)} s (${job.time_limit_of})`;
    if (job.run_s || job.time_limit_s != null) out.push(row("Ran", `${fmtNum(job.run_s)} s${limit}`));
    if (job.disk_mb != null) out.push(row("Disk", `${fmtNum(job.disk_mb)} MiB`));
    return out;
  }

  function render() {
    const alloc = (job.allocation || []).map((a) => `${a.node}: ${fmtNum(a.cpu_request)} CPU${a.gpus ? `, ${a.gpus} GPU` : ""}`).join("; ");
    const row = (k, v) => h("tr", {}, h("th", {}, k), h("td", {}, v));
    head.replaceChildren(h("table", { id: "job-fields" }, h("tbody", {}, [
      row("Id", job.id), row("Tenant", job.tenant), row("Queue", job.spec.queue || "default"),
      row("Phase", h("span", { id: "job-phase", class: `phase phase-${job.phase}` }, job.phase)), row("Reason", job.reason),
      row("Step", job.step), row("Loss", fmtNum(job.loss)), row("Allocation", alloc || "none"),
      row("Replicas", replicasOf(job)), row("Latest checkpoint", job.checkpoint || "none yet"),
      row("Attempt / restarts", `${job.attempt} / ${job.restarts}`), row("Submitted", fmtTime(job.submitted_at)),
      row("Started", fmtTime(job.started_at)), row("Finished", fmtTime(job.finished_at)),
      row("Exit code", job.exit_code ?? ""), row("Command", (job.spec.command || []).join(" ")),
      ...optionalRows(row),
    ])));
    if (buttons.dataset.phase === job.phase) return; // same buttons: keep them (no flicker, no lost click)
    buttons.dataset.phase = job.phase;
    const b = [];
    if (!TERMINAL.has(job.phase)) b.push(act("cancel", "Cancel", "danger"));
    if (!TERMINAL.has(job.phase) && !["Suspended", "Stopping"].includes(job.phase)) b.push(act("suspend", "Suspend"));
    if (job.phase === "Suspended") b.push(act("resume", "Resume"));
    buttons.replaceChildren(...b);
  }

  every(POLL_MS, async () => {
    try {
      const [j, p, why] = await Promise.all([
        api(`/v1/jobs/${encodeURIComponent(id)}`), api(`/v1/jobs/${encodeURIComponent(id)}/progress`), all(`/v1/jobs/${encodeURIComponent(id)}/why`),
      ]);
      job = j;
      render();
      const loss = p.loss_history || [];
      lossChart([loss.map((x) => x[0]), loss.map((x) => x[1])]);
      if (p.last_report && (!rate[0].length || rate[0][rate[0].length - 1] < p.last_report)) {
        rate[0].push(p.last_report);
        rate[1].push(p.throughput || 0);
      }
      rateChart(rate);
      const use = p.usage_history || [];
      const at = allocationAt(why, job);
      cpuChart([use.map((x) => x[0]), use.map((x) => at(x[0])), use.map((x) => x[1])]);
      events.replaceChildren(table(["Time", "Kind", "What happened and why"],
        why.map((e) => h("tr", {}, h("td", {}, fmtTime(e.time)), h("td", {}, e.kind), h("td", {}, e.message))), { id: "timeline" }));
      if (follow.checked) {
        const text = await api(`/v1/jobs/${encodeURIComponent(id)}/logs?tail=500`);
        if (log.textContent !== text) {
          log.textContent = text;
          log.scrollTop = log.scrollHeight;
        }
      }
    } catch (e) {
      msg.replaceChildren(h("p", { class: "error", id: "error" }, e.message));
    }
  });
}

// ---- nodes --------------------------------------------------------------------------------

async function nodesPage() {
  const body = h("div", {});
  const msg = h("div", {});
  main.replaceChildren(h("h1", {}, "Nodes"), msg, body);
  const admin = await isAdmin().catch(() => false);
  const nodeAction = (n, verb) => h("button", { type: "button", class: verb === "cordon" ? "danger" : "", onclick: async () => {
    let init = { method: "POST" };
    if (verb === "cordon") {
      const reason = prompt(`Why cordon ${n.name}? Its jobs move off through their checkpoints.`);
      if (!reason) return;
      init = { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ reason }) };
    }
    try {
      await api(`/v1/nodes/${encodeURIComponent(n.name)}/${verb}`, init);
      msg.replaceChildren(h("p", { class: "muted" }, `${n.name}: ${verb} done`));
    } catch (e) {
      msg.replaceChildren(h("p", { class: "error" }, `${verb} ${n.name} failed: ${e.message}`));
    }
  } }, verb === "cordon" ? "Cordon" : "Uncordon");
  // One set of sparklines per node, made once and moved into each new row (the table is
  // rebuilt on every poll; the charts keep their uPlot instances).
  const sparks = new Map();
  const sparksOf = (name) => {
    if (!sparks.has(name)) {
      sparks.set(name, { cpu: sparkline(`${name}: CPU busy %`, ["cpu busy %"]), mem: sparkline(`${name}: memory used %`, ["mem used %"]),
        excess: sparkline(`${name}: kernel / iowait share above the machine's other cores (%)`, ["kernel", "iowait"], { max: 10 }) });
    }
    return sparks.get(name);
  };
  const kpiCells = (n, k) => {
    const sp = sparksOf(n.name);
    const xs = k.samples.map((s) => s.time);
    const col = (key) => k.samples.map((s) => s.values[key] ?? null);
    sp.cpu.set([xs, col("cpu_busy_pct")]);
    sp.mem.set([xs, col("mem_used_pct")]);
    const last = k.samples.length ? k.samples[k.samples.length - 1].values : {};
    const hasExcess = "peer_excess_cpu_system_pct" in last || "peer_excess_cpu_iowait_pct" in last;
    if (hasExcess) sp.excess.set([xs, col("peer_excess_cpu_system_pct"), col("peer_excess_cpu_iowait_pct")]);
    const pct = (key) => (key in last ? ` ${fmtNum(last[key], 2)}%` : "");
    const m = k.monitor;
    const anomaly = !m ? h("span", { class: "muted" }, "no monitor")
      : m.score === null || m.threshold === null ? h("span", { class: "muted" }, m.model ? "no score yet" : "learning")
        : h("span", { class: m.score > m.threshold ? "alarm" : "" }, `${fmtNum(m.score)} / ${fmtNum(m.threshold)}`,
          h("meter", { min: 0, max: m.threshold, value: Math.min(m.score, m.threshold), high: m.threshold * 0.8 }),
          m.alarms ? h("span", { class: "muted" }, ` ${m.alarms} alarms`) : "");
    return [h("td", { class: "kpi-cpu" }, sp.cpu.el, pct("cpu_busy_pct")), h("td", { class: "kpi-mem" }, sp.mem.el, pct("mem_used_pct")),
      h("td", {}, hasExcess ? sp.excess.el : h("span", { class: "muted" }, "–")), h("td", { class: "anomaly" }, anomaly)];
  };
  every(POLL_MS, async () => {
    try {
      const [nodes, jobs] = await Promise.all([all("/v1/nodes"), all("/v1/jobs")]);
      const kpis = await Promise.all(nodes.map((n) => api(`/v1/nodes/${encodeURIComponent(n.name)}/kpis`)));
      const on = (name) => jobs.filter((j) => !TERMINAL.has(j.phase) && (j.allocation || []).some((a) => a.node === name));
      const rows = nodes.map((n, i) => h("tr", { "data-node": n.name },
        h("td", {}, n.name), h("td", { class: `health-${n.health}` }, n.health), h("td", { class: "muted" }, n.reason),
        h("td", {}, fmtNum(n.cpu)), h("td", {}, n.gpus), h("td", {}, `${fmtNum(n.cpu_requested)}${n.cpu_limits === null ? "" : ` (limits ${fmtNum(n.cpu_limits)})`}`),
        h("td", {}, n.jobs), h("td", {}, on(n.name).map((j, k) => [k ? ", " : "", jobLink(j)])), kpiCells(n, kpis[i]),
        admin ? h("td", {}, n.health === "Cordoned" ? nodeAction(n, "uncordon") : nodeAction(n, "cordon")) : ""));
      body.replaceChildren(table(["Node", "Health", "Why", "CPU", "GPUs", "CPU requested", "Jobs", "Your jobs there", "CPU busy", "Memory used", "Kernel / iowait excess", "Anomaly score / threshold", ...(admin ? ["Action"] : [])], rows, { id: "nodes" }));
    } catch (e) {
      showError(body, e);
    }
  });
}

// ---- queues and datasets ------------------------------------------------------------------

function usageCell(used, quota) {
  const keys = [...new Set([...Object.keys(quota || {}), ...Object.keys(used || {})])];
  return keys.map((k) => {
    const u = (used || {})[k] || 0;
    const q = (quota || {})[k];
    return h("div", {}, `${k}: ${fmtNum(u)} / ${q === undefined ? "∞" : fmtNum(q)} `,
      q ? h("meter", { min: 0, max: q, value: Math.min(u, q), high: q * 0.9 }) : "");
  });
}

async function queuesPage() {
  const body = h("div", {});
  main.replaceChildren(h("h1", {}, "Queues"), body);
  every(POLL_MS, async () => {
    try {
      const qs = await all("/v1/queues");
      body.replaceChildren(table(["Queue", "Cohort", "Usage / nominal quota", "Borrowed", "Admitted", "Pending", "Summary"],
        qs.map((q) => h("tr", {}, h("td", {}, h("a", { href: `/ui/jobs?queue=${encodeURIComponent(q.name)}` }, q.name)), h("td", {}, q.cohort || ""),
          h("td", {}, usageCell(q.usage, q.nominal)), h("td", {}, Object.entries(q.borrowed).map(([k, v]) => `${k}: ${fmtNum(v)}`).join(", ")),
          h("td", {}, q.admitted), h("td", {}, q.pending), h("td", { class: "muted" }, q.summary))), { id: "queues" }));
    } catch (e) {
      showError(body, e);
    }
  });
}

async function datasetsPage() {
  const body = h("div", {});
  main.replaceChildren(h("h1", {}, "Datasets"), body);
  every(POLL_MS * 2, async () => {
    try {
      const ds = await all("/v1/datasets");
      const pct = (x) => (x === null || x === undefined ? "" : `${(100 * x).toFixed(0)}%`);
      body.replaceChildren(ds.length ? table(["Dataset", "Owner", "Source", "Format", "Items", "Size (bytes)", "Cached here", "Cached on nodes", "Hits (memory / disk)", "Misses", "Hit rate", "Published"],
        ds.map((d) => h("tr", {}, h("td", {}, d.name), h("td", {}, d.tenant), h("td", {}, d.source), h("td", {}, d.format),
          h("td", {}, d.items ?? ""), h("td", {}, d.total_bytes ?? ""), h("td", {}, d.cache ? pct(d.cached_fraction) : "not cached"),
          h("td", {}, Object.entries(d.cached_on).map(([n, f]) => `${n} ${pct(f)}`).join(", ")),
          h("td", { class: "hits" }, d.cache_hits ? `${d.cache_hits.memory} / ${d.cache_hits.disk}` : ""), h("td", { class: "misses" }, d.cache_misses ?? ""),
          h("td", { class: "hit-rate" }, d.cache_hits ? (d.hit_rate === null ? "no reads yet" : pct(d.hit_rate)) : ""),
          h("td", {}, d.published ? "yes" : ""))), { id: "datasets" })
        : h("p", { class: "muted", id: "datasets" }, "No datasets."));
    } catch (e) {
      showError(body, e);
    }
  });
}

// ---- routing ------------------------------------------------------------------------------

/** Pick the page from location.pathname (every /ui/... URL serves this same shell). */
function route() {
  timers.forEach(clearInterval);
  timers = [];
  const signout = document.getElementById("signout");
  if (!token()) {
    signout.hidden = true;
    return signIn();
  }
  signout.hidden = false;
  const path = location.pathname.replace(/^\/ui\/?/, "").replace(/\/$/, "");
  const parts = path.split("/").map(decodeURIComponent);
  if (!path) return overviewPage();
  if (parts[0] === "jobs" && parts.length === 2) return jobPage(parts[1]);
  const pages = { jobs: jobsPage, nodes: nodesPage, queues: queuesPage, datasets: datasetsPage };
  if (parts.length === 1 && pages[parts[0]]) return pages[parts[0]]();
  main.replaceChildren(h("p", { class: "error", id: "error" }, `No such page: ${location.pathname}`));
}

document.getElementById("signout").addEventListener("click", signOut);
route();
