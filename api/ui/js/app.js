// The dashboard's shell: sign in and out, the key's role (GET /ui/session),
// tabs, the range and group-by pickers (kept in the URL's fragment so that
// a view can be linked and reloaded), and the page's state for tests and
// benchmarks: document.body.dataset.state is "loading" while a view's
// calls run, then "ready" once everything is drawn (or "error"), and
// data-ready-ms is the time from navigation to the first "ready".

import * as api from "./api.js";
import * as f from "./format.js";
import * as metrics from "./metrics.js";
import * as finance from "./finance.js";
import * as capacity from "./capacity.js";
import { fitValues } from "./cards.js";

const $ = (id) => document.getElementById(id);

const state = {
  key: "",
  session: null, // {name, role, tenant_id}
  tab: "metrics",
  range: "24h",
  start: NaN, // custom range, ms
  end: NaN,
  group: "",
  tenant: "",
  deployment: "", // the metrics tab's deployment; "" is all
  deployments: { key: "", names: [] }, // the picker's choices, for a range
  unit: "", // capacity unit; "" is the fleet
  report: null, // the capacity report drawn
  gen: 0, // the current load; older loads drop their results
  firstReady: true,
};

const isFinance = () => state.session && (state.session.role === "finance" || state.session.role === "admin");

function setState(s) {
  document.body.dataset.state = s;
  if (s === "ready" && state.firstReady) {
    state.firstReady = false;
    document.body.dataset.readyMs = String(Math.round(performance.now()));
  }
}

function showMessage(text) {
  const m = $("message");
  m.textContent = text || "";
  m.hidden = !text;
}

// Fragment: #tab=metrics&range=24h&group=model&tenant=acme&deployment=d&start=..&end=..
function readHash() {
  const h = new URLSearchParams(location.hash.slice(1));
  if (["metrics", "finance", "capacity"].includes(h.get("tab"))) state.tab = h.get("tab");
  if (["1h", "24h", "7d", "30d", "custom"].includes(h.get("range"))) state.range = h.get("range");
  if (["", "tenant_id", "model", "deployment"].includes(h.get("group") || "")) state.group = h.get("group") || "";
  state.tenant = h.get("tenant") || "";
  state.deployment = h.get("deployment") || "";
  state.unit = h.get("unit") || "";
  state.start = api.ts(h.get("start"));
  state.end = api.ts(h.get("end"));
}

function writeHash() {
  const h = new URLSearchParams();
  h.set("tab", state.tab);
  h.set("range", state.range);
  if (state.range === "custom" && !Number.isNaN(state.start) && !Number.isNaN(state.end)) {
    h.set("start", api.iso(state.start));
    h.set("end", api.iso(state.end));
  }
  if (state.group) h.set("group", state.group);
  if (state.tenant) h.set("tenant", state.tenant);
  if (state.deployment) h.set("deployment", state.deployment);
  if (state.unit) h.set("unit", state.unit);
  history.replaceState(null, "", "#" + h.toString());
}

function syncControls() {
  $("range").value = state.range;
  $("custom-range").hidden = state.range !== "custom";
  if (state.range === "custom") {
    if (Number.isNaN(state.start) || Number.isNaN(state.end)) {
      const now = Math.floor(Date.now() / 3600e3) * 3600e3;
      state.start = now - 24 * 3600e3;
      state.end = now;
    }
    $("start").value = f.inputValue(state.start);
    $("end").value = f.inputValue(state.end);
  }
  $("group").value = state.group;
  $("tenant").value = state.tenant;
  fillDeployments();
  // Grouping is the metrics tab's; the capacity report covers every tenant.
  $("group-label").hidden = state.tab !== "metrics";
  $("deployment-label").hidden = state.tab !== "metrics";
  $("tenant-label").hidden = !isFinance() || state.tab === "capacity";
  for (const b of document.querySelectorAll(".tabs [role=tab]")) {
    const on = b.dataset.tab === state.tab;
    b.setAttribute("aria-selected", String(on));
    b.tabIndex = on ? 0 : -1;
    $("panel-" + b.dataset.tab).hidden = !on;
  }
}

// applyRole hides what the key may not read: a tenant key sees its own
// tenant's metrics only (the API enforces it; the page does not offer the
// rest).
function applyRole() {
  const fin = isFinance();
  for (const e of document.querySelectorAll("[data-needs=finance]")) e.hidden = !fin;
  if (!fin) {
    state.tenant = "";
    if (state.tab !== "metrics") state.tab = "metrics";
  }
  const s = state.session;
  $("who-text").textContent = s.role === "tenant" ? `${s.name} · tenant ${s.tenant_id}` : `${s.name} · ${s.role}`;
  $("who").hidden = false;
}

// load draws the current tab for the current controls.
async function load() {
  const gen = ++state.gen;
  setState("loading");
  showMessage("");
  writeHash();
  let range;
  try {
    range = api.resolveRange(state.range, state.start, state.end);
  } catch (e) {
    showMessage(e.message);
    setState("error");
    return;
  }
  $("range-text").textContent =
    `${f.rangeText(range.start, range.end)}, step ${range.step}` + (state.session.role === "tenant" ? ` · tenant ${state.session.tenant_id}` : "");
  document.body.dataset.start = api.iso(range.start);
  document.body.dataset.end = api.iso(range.end);
  document.body.dataset.hourStart = api.iso(range.hourStart);
  document.body.dataset.hourEnd = api.iso(range.hourEnd);
  document.body.dataset.step = range.step;
  document.body.dataset.now = String(range.now); // ms: the partial step's clock
  const ctx = { key: state.key, range, group: state.group, tenant: state.tenant, deployment: state.deployment, finance: isFinance() };
  try {
    if (state.tab === "metrics") {
      await metrics.load(ctx, $("metric-cards"), $("metric-charts"));
      if (gen === state.gen) suggestDeployments(ctx);
    } else if (state.tab === "finance") {
      const tenants = await finance.load(ctx, $("finance-cards"), $("finance-charts"));
      if (gen === state.gen) fillTenants(tenants);
    } else {
      await loadCapacity(ctx, gen);
    }
    if (gen === state.gen) setState("ready");
  } catch (e) {
    if (gen !== state.gen) return;
    if (e instanceof api.ApiError && e.status === 401) {
      // The key is no longer accepted: back to the sign-in form.
      signOut(e.explain());
      return;
    }
    if (!(e instanceof api.ApiError)) showMessage(`The page failed: ${e.message || e}`);
    setState("error");
  }
}

async function loadCapacity(ctx, gen) {
  const els = {
    cards: $("capacity-cards"), findings: $("findings"), charts: $("capacity-charts"), units: $("capacity-units"), note: $("capacity-note"),
  };
  let report;
  try {
    report = await capacity.fetchReport(ctx);
  } catch (e) {
    if (gen !== state.gen) return;
    for (const el of [els.cards, els.findings, els.charts, els.units]) el.replaceChildren();
    capacity.panelError(els.cards, e instanceof api.ApiError ? e.explain() : String(e.message || e));
    throw e;
  }
  if (gen !== state.gen) return;
  state.report = report;
  const sel = $("unit");
  const options = capacity.pickerOptions(report);
  sel.replaceChildren(...options.map(([label, value]) => new Option(label, value)));
  if (!options.some(([, value]) => value === state.unit)) state.unit = "";
  sel.value = state.unit;
  capacity.draw(report, state.unit, els);
}

function fillTenants(tenants) {
  const dl = $("tenants");
  dl.replaceChildren(...tenants.map((t) => new Option(t)));
}

// suggestTenants fills the tenant filter's list after the first page is
// drawn; a failure only leaves the list empty.
async function suggestTenants(range) {
  try {
    const r = api.resolveRange(range, state.start, state.end);
    const cost = await api.series(state.key, "/v1/cost", { start: api.iso(r.hourStart), end: api.iso(r.hourEnd), step: "total", group_by: "tenant_id" });
    fillTenants(cost.series.map((s) => (s.group || {}).tenant_id).filter((t) => t && t !== finance.IDLE));
  } catch {
    // Suggestions only.
  }
}

// fillDeployments sets the deployment picker's options: the range's
// deployments, and the one picked even when the range has none of it.
function fillDeployments() {
  const names = [...state.deployments.names];
  if (state.deployment && !names.includes(state.deployment)) names.push(state.deployment);
  names.sort();
  const sel = $("deployment");
  sel.replaceChildren(new Option("all deployments", ""), ...names.map((d) => new Option(d, d)));
  sel.value = state.deployment;
}

// suggestDeployments fills the deployment picker with the deployments
// that served requests in the range (of the tenant, where one is chosen),
// once per range and tenant, after the page is drawn: it is not one of
// the first page's calls. A failure only leaves the list as it was.
async function suggestDeployments(ctx) {
  const q = { start: api.iso(ctx.range.hourStart), end: api.iso(ctx.range.hourEnd), tenant_id: ctx.tenant, step: "total", group_by: "deployment" };
  const key = api.query(q);
  if (state.deployments.key === key) return;
  try {
    const traffic = await api.series(state.key, "/v1/traffic", q);
    state.deployments = { key, names: traffic.series.map((s) => (s.group || {}).deployment).filter(Boolean) };
    fillDeployments();
  } catch {
    // Suggestions only.
  }
}

async function signIn(key) {
  setState("loading");
  let session;
  try {
    session = await api.get(key, "/ui/session");
  } catch (e) {
    api.keyStore.clear();
    showSignIn(e instanceof api.ApiError ? e.explain() : String(e.message || e));
    return;
  }
  if (!["tenant", "finance", "admin"].includes(session.role)) {
    api.keyStore.clear();
    showSignIn(`The key "${session.name}" has role ${session.role}: it may publish events but not read them. Use a tenant, finance or admin key.`);
    return;
  }
  api.keyStore.set(key);
  state.key = key;
  state.session = session;
  $("sign-in").hidden = true;
  $("app").hidden = false;
  applyRole();
  syncControls();
  await load();
  if (isFinance()) suggestTenants(state.range);
}

function showSignIn(message) {
  $("app").hidden = true;
  $("who").hidden = true;
  $("sign-in").hidden = false;
  showMessage(message || "");
  $("key").value = "";
  $("key").focus();
  setState("signed-out");
}

function signOut(message) {
  api.keyStore.clear();
  state.key = "";
  state.session = null;
  state.deployments = { key: "", names: [] };
  state.gen++;
  for (const id of ["metric-cards", "metric-charts", "finance-cards", "finance-charts", "capacity-cards", "findings", "capacity-charts", "capacity-units"]) {
    $(id).replaceChildren();
  }
  showSignIn(message);
}

function selectTab(tab) {
  if (tab === state.tab) return;
  state.tab = tab;
  syncControls();
  load();
}

function wire() {
  $("sign-in-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const key = $("key").value.trim();
    if (key) signIn(key);
  });
  $("sign-out").addEventListener("click", () => signOut(""));
  $("range").addEventListener("change", () => {
    state.range = $("range").value;
    syncControls();
    if (state.range !== "custom") load();
  });
  $("group").addEventListener("change", () => {
    state.group = $("group").value;
    load();
  });
  $("deployment").addEventListener("change", () => {
    state.deployment = $("deployment").value;
    load();
  });
  $("controls").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.range = $("range").value;
    state.group = $("group").value;
    state.deployment = $("deployment").value;
    state.tenant = isFinance() ? $("tenant").value.trim() : "";
    if (state.range === "custom") {
      state.start = Date.parse($("start").value + ":00Z");
      state.end = Date.parse($("end").value + ":00Z");
    }
    load();
  });
  const tabs = [...document.querySelectorAll(".tabs [role=tab]")];
  for (const b of tabs) {
    b.addEventListener("click", () => selectTab(b.dataset.tab));
    b.addEventListener("keydown", (ev) => {
      if (ev.key !== "ArrowRight" && ev.key !== "ArrowLeft") return;
      const shown = tabs.filter((t) => !t.hidden);
      const i = shown.indexOf(b) + (ev.key === "ArrowRight" ? 1 : -1);
      const next = shown[(i + shown.length) % shown.length];
      next.focus();
      selectTab(next.dataset.tab);
    });
  }
  $("unit").addEventListener("change", () => {
    state.unit = $("unit").value;
    writeHash();
    if (state.report) {
      capacity.draw(state.report, state.unit, {
        cards: $("capacity-cards"), findings: $("findings"), charts: $("capacity-charts"), units: $("capacity-units"), note: $("capacity-note"),
      });
    }
  });
  for (const b of [$("download-html"), $("download-csv")]) {
    b.addEventListener("click", async () => {
      showMessage("");
      try {
        const range = api.resolveRange(state.range, state.start, state.end);
        await capacity.download({ key: state.key, range }, b.dataset.format);
      } catch (e) {
        showMessage(e instanceof api.ApiError ? `Download failed. ${e.explain()}` : `Download failed: ${e.message || e}`);
      }
    });
  }
}

// refit fits the shown cards' values again once the window's width has
// changed (cards.fitValues).
function refit() {
  let width = window.innerWidth;
  window.addEventListener("resize", () => {
    if (window.innerWidth === width) return;
    width = window.innerWidth;
    for (const id of ["metric-cards", "finance-cards", "capacity-cards"]) fitValues($(id));
  });
}

function start() {
  readHash();
  wire();
  refit();
  const key = api.keyStore.get();
  if (key) signIn(key);
  else showSignIn("");
}

start();
