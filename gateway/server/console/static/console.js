// The agent-gateway console: approvals inbox (live through server-sent events), audit timeline,
// a call's page, the chain's verify status. Everything shown goes in through textContent or
// attributes set one by one, never HTML: an agent's command is text, whatever it holds.
"use strict";

// The session's key: handed to this page in the sign-in's redirect (#key=...), kept in this tab's
// storage (this origin's alone: another port of the host cannot read it, unlike the cookie) and
// sent with every request; without it the cookie opens nothing.
function sessionKey() {
  const found = /^#key=([A-Za-z0-9_-]+)$/.exec(window.location.hash);
  if (found) {
    sessionStorage.setItem("agw_console_key", found[1]);
    history.replaceState(null, "", window.location.pathname);
  }
  return sessionStorage.getItem("agw_console_key") || "";
}
let csrf = sessionKey();
const byId = (id) => document.getElementById(id);

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

async function api(path, options) {
  const opts = Object.assign({ credentials: "same-origin", headers: {} }, options || {});
  opts.headers["X-CSRF-Token"] = csrf;
  if (opts.method && opts.method !== "GET") opts.headers["Content-Type"] = "application/json";
  const response = await fetch("/console/api/" + path, opts);
  if (response.status === 401) {
    window.location.assign("/console/login");
    throw new Error("signed out");
  }
  const body = await response.json().catch(() => ({ error: "the answer was not JSON" }));
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

// --- approvals ---------------------------------------------------------------------------------
let shown = [];

function fact(list, name, value) {
  list.append(el("dt", { text: name }), el("dd", { text: value }));
}

function card(item) {
  const left = el("span", { class: "left", "data-expires": String(item.expires) });
  const facts = el("dl", { class: "facts" });
  fact(facts, "cwd", item.cwd);
  if (item.env.length === 0) fact(facts, "env", "(none besides the sandbox's own)");
  for (const v of item.env) {
    const origin = v.from === "call" ? (v.overrides ? "this call, overrides the stored value" : "this call") : "stored (env tool)";
    fact(facts, "env " + v.name, v.value + "    (" + origin + ")");
  }
  for (const a of item.asking) fact(facts, "rule " + (a.rule || "(a stage)"), a.justification || "(no justification)");
  fact(facts, "why", item.reason);
  const files = [];
  if (item.files) for (const f of item.files) {
    const state = f.error ? "cannot be bound (" + f.error + "): an approval of this call is void"
      : f.absent ? "absent (bound as absent: planting it voids the approval)"
      : f.bytes + " bytes, sha256 " + f.sha256;
    fact(facts, "runs " + f.path, state + "    (" + f.why + ")");
    if (f.head) files.push(el("pre", { class: "file-head", text: f.path + ":\n" + f.head.join("\n")
      + (f.head_complete ? "" : "\n... (first lines only: gateway approvals show " + item.call_id + ")") }));
  }
  fact(facts, "digest", item.digest);
  const reason = el("input", { class: "reason", type: "text", placeholder: "reason for a denial (reaches the agent and the audit log)", maxLength: 4000 });
  const status = el("span", { class: "error" });
  const answer = (verb, body) => async () => {
    status.textContent = "";
    try {
      await api("approvals/" + encodeURIComponent(item.call_id) + "/" + verb, { method: "POST", body: JSON.stringify(body()) });
      await loadApprovals();
      loadAudit();
    } catch (err) {
      status.textContent = String(err.message || err);
    }
  };
  const actions = el("div", { class: "actions" },
    el("button", { class: "approve", type: "button", text: "Approve", onclick: answer("approve", () => ({})) }),
    el("button", { class: "approve-session", type: "button", text: "Approve for the session", onclick: answer("approve", () => ({ scope: "session" })) }),
    reason,
    el("button", { class: "deny", type: "button", text: "Deny", onclick: answer("deny", () => ({ reason: reason.value })) }),
    status);
  return el("li", { class: "approval", "data-call-id": item.call_id },
    el("div", { class: "head", text: item.principal + " · " + item.tool + " · call " + item.call_id }, left),
    el("pre", { class: "command", text: item.command }),
    el("div", { class: "note", text: item.command_chars + " characters, shown whole (escapes: \\n line break, \\u{...} invisible)" }),
    facts, ...files, actions);
}

async function loadApprovals() {
  let body;
  try {
    body = await api("approvals");
    byId("inbox-error").hidden = true;
  } catch (err) {
    byId("inbox-error").textContent = "could not load the approvals: " + (err.message || err);
    byId("inbox-error").hidden = false;
    return;
  }
  const list = byId("approvals");
  const typed = {};
  for (const li of list.children) typed[li.dataset.callId] = li.querySelector("input.reason").value;
  list.replaceChildren(...body.approvals.map((item) => {
    const li = card(item);
    if (typed[item.call_id]) li.querySelector("input.reason").value = typed[item.call_id];
    return li;
  }));
  shown = body.approvals;
  byId("count").textContent = String(shown.length);
  byId("inbox-empty").hidden = shown.length > 0;
  tick();
}

function tick() {
  const now = Date.now() / 1000;
  for (const span of document.querySelectorAll("span.left")) {
    const left = Math.max(0, Math.round(Number(span.dataset.expires) - now));
    span.textContent = left + " s left";
  }
}

function listen() {
  const source = new EventSource("/console/api/events?csrf=" + encodeURIComponent(csrf));
  const live = byId("live");
  source.addEventListener("hello", () => {
    live.textContent = "live";
    live.className = "live on";
    loadApprovals();
  });
  for (const kind of ["added", "answered", "withdrawn"]) {
    source.addEventListener(kind, () => {
      loadApprovals();
      loadAudit();
    });
  }
  source.onerror = () => {
    live.textContent = "live: reconnecting";
    live.className = "live off";
    fetch("/console/api/session", { credentials: "same-origin", headers: { "X-CSRF-Token": csrf } }).then((r) => {
      if (r.status === 401) window.location.assign("/console/login");
    });
  };
}

// --- audit -------------------------------------------------------------------------------------
function filters() {
  const params = new URLSearchParams();
  for (const [key, value] of new FormData(byId("filters"))) if (value) params.set(key, value);
  return params;
}

async function loadAudit() {
  let body;
  try {
    body = await api("audit?" + filters().toString());
  } catch (err) {
    byId("matched").textContent = "could not load the log: " + (err.message || err);
    return;
  }
  byId("matched").textContent = body.matched + " records match" + (body.truncated ? ", newest " + body.items.length + " shown" : "");
  byId("records").tBodies[0].replaceChildren(...body.items.map(({ record: r, summary }) => {
    const call = r.call_id ? el("button", { type: "button", class: "call-link", text: r.call_id, onclick: () => openCall(r.call_id) }) : "";
    return el("tr", { class: r.decision || "" },
      el("td", { text: String(r.ts || "").slice(0, 23) }), el("td", { text: String(r.seq ?? "") }),
      el("td", { text: r.event || "" }), el("td", { text: r.principal || "" }), el("td", { text: r.tool || "" }),
      el("td", { class: "decision", text: r.decision || "" }), el("td", { text: r.rule || "" }),
      el("td", {}, call), el("td", { class: "what", text: summary }));
  }));
}

async function openCall(callId) {
  const body = await api("audit/" + encodeURIComponent(callId));
  byId("call-id").textContent = callId;
  const parts = [];
  const section = (title, records) => {
    parts.push(el("h3", { text: title }));
    if (records.length === 0) parts.push(el("p", { class: "note", text: "none" }));
    for (const r of records) parts.push(el("pre", { class: "record", text: JSON.stringify(r, null, 1) }));
  };
  section("Decision", body.decision ? [body.decision] : []);
  section("Approval", body.approvals);
  section("Result", body.result ? [body.result] : []);
  section("Every record of the call", body.records);
  byId("call-body").replaceChildren(...parts);
  byId("call").hidden = false;
  byId("call").scrollIntoView();
}

// --- what-if replay ---------------------------------------------------------------------------
async function runReplay(event) {
  event.preventDefault();
  const form = new FormData(byId("replay-form"));
  const summary = byId("replay-summary");
  const body = {};
  const file = form.get("file");
  if (file && file.size) body.policy = await file.text();
  else if (form.get("policy_file")) body.policy_file = form.get("policy_file");
  for (const key of ["since", "until"]) if (form.get(key)) body[key] = form.get(key);
  summary.textContent = "replaying...";
  byId("replay-result").replaceChildren();
  let report;
  try {
    report = await api("replay", { method: "POST", body: JSON.stringify(body) });
  } catch (err) {
    summary.textContent = "replay refused: " + (err.message || err);
    return;
  }
  const skipped = Object.values(report.not_replayed);
  summary.textContent = report.draft + ": " + report.replayed + " calls replayed, " + report.changed + " would change, "
    + report.unchanged + " unchanged" + (skipped.length ? ", " + skipped.reduce((n, s) => n + s.count, 0) + " not replayed" : "");
  const parts = [];
  for (const g of report.groups) {
    parts.push(el("h3", { text: g.count + " × " + g.from.decision + " (" + (g.from.rule || "no rule") + ") → " + g.to.decision + " (" + (g.to.rule || "no rule") + ")" }));
    const rows = g.calls.map((c) => el("tr", {}, el("td", { text: String(c.ts).slice(0, 23) }), el("td", { text: c.principal }),
      el("td", { text: c.tool }), el("td", { class: "what", text: c.command }), el("td", { text: c.reason || "" })));
    parts.push(el("table", { class: "replay" }, el("tbody", {}, ...rows)));
    if (g.shown < g.count) parts.push(el("p", { class: "note", text: (g.count - g.shown) + " more not shown" }));
  }
  for (const s of skipped) parts.push(el("p", { class: "note", text: "not replayed (" + s.why + "): " + s.count }));
  byId("replay-result").replaceChildren(...parts);
}

// --- verify ------------------------------------------------------------------------------------
async function loadVerify() {
  const badge = byId("verify");
  try {
    const v = await api("verify");
    badge.className = "verify " + v.state;
    badge.textContent = v.state === "ok" ? "audit log: verified (" + v.records + " records)"
      : v.state === "checking" ? "audit log: checking..." : "audit log: BROKEN";
    badge.title = v.describe || "";
  } catch (err) {
    badge.className = "verify broken";
    badge.textContent = "audit log: status unknown";
  }
}

// --- start -------------------------------------------------------------------------------------
async function start() {
  const session = await api("session");
  byId("who").textContent = "signed in as " + session.supervisor;
  byId("logout").onclick = async () => {
    await fetch("/console/logout", { method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": csrf } });
    sessionStorage.removeItem("agw_console_key");
    window.location.assign("/console/login");
  };
  byId("filters").onsubmit = (event) => {
    event.preventDefault();
    loadAudit();
  };
  byId("refresh").onclick = () => loadAudit();
  byId("replay-form").onsubmit = runReplay;
  byId("call-close").onclick = () => { byId("call").hidden = true; };
  listen();
  await loadApprovals();
  loadAudit();
  loadVerify();
  setInterval(tick, 1000);
  setInterval(loadVerify, 5000);
}

document.addEventListener("DOMContentLoaded", start);
