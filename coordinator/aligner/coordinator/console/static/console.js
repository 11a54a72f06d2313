// The console page: renders the state the server pushes (/api/events); no framework, nothing to build.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const SVG = "http://www.w3.org/2000/svg";

function h(tag, attrs = {}, ...children) {
  const el = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const fmtTime = (ms) => new Date(ms).toLocaleTimeString();
const fmtSecs = (s) => (s === null || s === undefined ? "–" : s < 90 ? `${s.toFixed(1)} s` : `${(s / 60).toFixed(1)} min`);
const dash = (v) => (v === null || v === undefined ? "–" : v);

let current = null;
let actionsAllowed = false;
let selected = null;

// ---- theme ---------------------------------------------------------------------------------------

function applyTheme(theme) {
  if (theme) document.documentElement.dataset.theme = theme;
  else delete document.documentElement.dataset.theme;
}
applyTheme(localStorage.getItem("aligner-theme"));
$("#theme").addEventListener("click", () => {
  const dark = document.documentElement.dataset.theme
    ? document.documentElement.dataset.theme === "dark"
    : matchMedia("(prefers-color-scheme: dark)").matches;
  const next = dark ? "light" : "dark";
  localStorage.setItem("aligner-theme", next);
  applyTheme(next);
});

// ---- the stream --------------------------------------------------------------------------------------

function connect() {
  const events = new EventSource("/api/events");
  events.addEventListener("state", (e) => render(JSON.parse(e.data)));
  events.addEventListener("error", () => {
    const badge = $("#zk-status");
    badge.className = "badge bad";
    badge.textContent = "console unreachable: retrying";
  });
}

fetch("/api/settings").then((r) => r.json()).then((s) => { actionsAllowed = s.actions; if (current) render(current); });
connect();

function render(state) {
  current = state;
  const zk = state.zookeeper;
  const badge = $("#zk-status");
  if (zk.connected) {
    badge.className = "badge ok";
    badge.textContent = "ZooKeeper connected";
  } else {
    badge.className = "badge bad";
    badge.textContent = zk.down_since ? `ZooKeeper unreachable since ${fmtTime(zk.down_since)}` : "connecting to ZooKeeper…";
  }
  const error = $("#error");
  error.hidden = !state.error;
  error.textContent = state.error ? `The ledger could not be read: ${state.error}` : "";
  renderAction(state.action);
  $("#retention").hidden = !actionsAllowed;
  const p = state.picture;
  if (!p) return;
  $("#updated").textContent = `as of ${fmtTime(p.taken_at)}`;
  $("#acl").textContent = p.acl && p.acl.line ? `ZooKeeper ACLs: ${p.acl.line}` : "";
  const warnings = $("#warnings");
  warnings.replaceChildren(...p.warnings.map((w) => h("li", {}, w)));
  warnings.hidden = p.warnings.length === 0;
  renderGraph(p);
  renderSwaps(p);
  renderJobs(p);
  renderSubjects(p);
  renderQueries(p);
  renderLineageChoices(p);
}

// ---- the graph ---------------------------------------------------------------------------------------

const W = 170, H = 40, DX = 230, DY = 58, PAD = 16;

function jobState(job) {
  const states = [...new Set(job.sources.map((s) => s.state))];
  return states.length === 1 ? states[0] : states.join(" / ");
}

function renderGraph(p) {
  const svg = $("#graph");
  const jobs = Object.fromEntries(p.jobs.map((j) => [j.job, j]));
  const swapping = new Set(p.swaps.filter((s) => s.phase === "precommit" || s.phase === "commit").flatMap((s) => [s.old, s.new]));
  const pos = {};
  let width = 0, height = 0;
  for (const n of p.graph.nodes) {
    const x = PAD + n.layer * DX, y = PAD + n.row * DY;
    pos[n.id] = { x, y };
    width = Math.max(width, x + W + PAD);
    height = Math.max(height, y + H + PAD);
  }
  const defs = h("svg:defs", {}, h("svg:marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
    h("svg:path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "currentColor" })));
  const edges = p.graph.edges.filter(([a, b]) => pos[a] && pos[b]).map(([a, b]) => {
    const s = pos[a], t = pos[b];
    const x1 = s.x + W, y1 = s.y + H / 2, x2 = t.x, y2 = t.y + H / 2, mx = (x1 + x2) / 2;
    return h("svg:path", { class: "edge", d: `M ${x1} ${y1} C ${mx} ${y1}, ${mx} ${y2}, ${x2 - 2} ${y2}` });
  });
  const nodes = p.graph.nodes.map((n) => {
    const { x, y } = pos[n.id];
    const job = n.kind === "job" ? jobs[n.label] : null;
    const state = job ? jobState(job) : "";
    const sub = job ? `${job.engine} · ${state}${job.follows ? ` · follows ${job.follows}` : ""}` : subjectLine(p, n.label);
    const cls = ["node", n.kind, state.replace(/[^a-z_]/g, ""), job && swapping.has(job.job) ? "swapping" : ""].join(" ");
    const g = h("svg:g", { class: cls, tabindex: 0, role: "button", "data-id": n.id, "aria-label": `${n.kind} ${n.label}: ${sub}`,
      transform: `translate(${x},${y})`, onclick: () => select(n), onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); select(n); } } },
      h("svg:rect", { width: W, height: H, rx: n.kind === "job" ? 12 : 2 }),
      h("svg:text", { x: 10, y: 16 }, n.label.length > 24 ? n.label.slice(0, 23) + "…" : n.label),
      h("svg:text", { x: 10, y: 31, class: "sub" }, sub.length > 30 ? sub.slice(0, 29) + "…" : sub),
      h("svg:title", {}, `${n.label}\n${sub}`));
    return g;
  });
  svg.setAttribute("viewBox", `0 0 ${Math.max(width, 200)} ${Math.max(height, 60)}`);
  svg.setAttribute("width", Math.max(width, 200));
  svg.setAttribute("height", Math.max(height, 60));
  svg.style.color = "var(--muted)";
  const focused = document.activeElement && document.activeElement.closest && document.activeElement.closest("#graph .node");
  const refocus = focused ? focused.dataset.id : null;
  svg.replaceChildren(defs, ...edges, ...nodes);
  if (refocus) { const again = svg.querySelector(`[data-id="${CSS.escape(refocus)}"]`); if (again) again.focus(); }
}

function subjectLine(p, name) {
  const s = p.subjects.find((x) => x.name === name);
  if (!s) return "subject";
  return s.frontier === null ? `${s.partitions} partitions · no epoch yet` : `epoch ${s.frontier} · ${s.partitions} partitions`;
}

function select(n) {
  selected = n.id;
  const row = document.getElementById((n.kind === "job" ? "job-" : "subject-") + n.label);
  if (row) { row.scrollIntoView({ block: "center", behavior: "smooth" }); row.querySelector("button, [tabindex]")?.focus({ preventScroll: true }); }
  if (n.kind === "subject") {
    const s = current.picture.subjects.find((x) => x.name === n.label);
    if (s && s.frontier !== null) showLineage(s.name, s.frontier);
  }
  renderJobs(current.picture);
  renderSubjects(current.picture);
}

// ---- tables ------------------------------------------------------------------------------------------

function renderSwaps(p) {
  const box = $("#swaps");
  if (p.swaps.length === 0) { box.replaceChildren(h("p", { class: "muted" }, "No hot-swap in the ledger.")); return; }
  box.replaceChildren(...p.swaps.map((s) => {
    const acks = Object.entries(s.acks);
    const history = s.history.length ? s.history : [[s.phase, s.updated_at]];
    return h("div", { class: "swap", id: `swap-${s.old}`, "data-phase": s.phase },
      h("strong", {}, `${s.old} → ${s.new}`), ` on ${s.target}: `,
      h("span", { class: "state" }, s.phase), ` at S = ${s.epoch}`,
      s.accepted !== null ? h("span", { class: "muted" }, ` (furthest committed epoch when chosen: ${s.accepted})`) : null,
      h("ol", { class: "timeline", "aria-label": "phases seen" },
        history.map(([phase, at]) => h("li", { class: phase, "data-phase": phase }, `${phase} ${fmtTime(at)}`))),
      acks.length ? h("div", {}, "Acknowledged S: ", acks.map(([w, ok]) => h("span", { class: ok ? "badge ok" : "badge bad" }, `${w} ${ok ? "✓" : "…"}`))) : null);
  }));
}

function actionButton(label, action) {
  if (!actionsAllowed) return null;
  return h("button", { type: "button", "data-action": action.kind, onclick: () => confirmAction(action) }, label);
}

function renderJobs(p) {
  const rows = p.jobs.map((j) => {
    const state = jobState(j);
    const src = j.sources;
    const lag = src.map((s) => `${s.lag_epochs} ep · ${fmtSecs(s.lag_seconds)}`).join(", ");
    const workers = j.producers.map((w) => `${w.producer}: ${dash(w.committed_epoch)} (#${w.incarnation})`).join(", ");
    const buttons = j.follows
      ? [actionButton("Swap in", { kind: "hotswap", old: j.follows, new: j.job, subject: j.output })]
      : [actionButton("Align", { kind: "align", job: j.job }), actionButton("Abort", { kind: "abort", job: j.job })];
    return h("tr", { id: `job-${j.job}`, class: selected === `j:${j.job}` ? "selected" : null },
      h("td", {}, h("strong", {}, j.job), j.swapped_to ? h("span", { class: "muted" }, ` (swapped to ${j.swapped_to})`) : null),
      h("td", {}, j.engine), h("td", {}, j.version), h("td", {}, j.mode),
      h("td", { "data-field": "state" }, h("span", { class: `state ${state}` }, state),
        j.decision ? h("span", { class: "muted" }, ` (${j.decision})`) : null),
      h("td", {}, src.map((s) => dash(s.job_epoch)).join(", ")),
      h("td", {}, src.map((s) => `${s.subject}: ${dash(s.subject_epoch)}`).join(", ")),
      h("td", {}, lag), h("td", {}, workers || "–"), h("td", {}, buttons));
  });
  keepFocus($("#jobs tbody"), rows);
}

// Replace a table's rows, keeping the keyboard's place: the focused control of a row is focused again.
function keepFocus(tbody, rows) {
  const active = document.activeElement;
  const row = active && tbody.contains(active) ? active.closest("tr") : null;
  const key = row ? [row.id, active.dataset.action || active.textContent] : null;
  tbody.replaceChildren(...rows);
  if (!key) return;
  const again = [...tbody.querySelectorAll(`[id="${CSS.escape(key[0])}"] button`)]
    .find((b) => (b.dataset.action || b.textContent) === key[1]);
  if (again) again.focus({ preventScroll: true });
}

function renderSubjects(p) {
  const rows = p.subjects.map((s) => h("tr", { id: `subject-${s.name}`, class: selected === `s:${s.name}` ? "selected" : null },
    h("td", {}, h("strong", {}, s.name)), h("td", {}, s.partitions),
    h("td", {}, s.frontier === null ? "–" : h("button", { type: "button", class: "link", onclick: () => showLineage(s.name, s.frontier) }, s.frontier)),
    h("td", {}, dash(s.epochs_per_minute)), h("td", {}, s.last_commit_age === null ? "–" : `${fmtSecs(s.last_commit_age)} ago`),
    h("td", {}, s.first_retained), h("td", {}, s.epochs_held),
    h("td", {}, s.writers.map((w) => w.writer + (w.finished_after !== null ? ` (finished after ${w.finished_after})` : "")).join(", ") || "–")));
  keepFocus($("#subjects tbody"), rows);
}

function renderQueries(p) {
  $("#queries-box").hidden = p.queries.length === 0;
  $("#queries tbody").replaceChildren(...p.queries.map((q) => h("tr", {},
    h("td", {}, q.query), h("td", {}, dash(q.batch)),
    h("td", {}, Object.entries(q.subjects).map(([s, r]) => `${s}: ${r.behind_epochs} ep · ${fmtSecs(r.behind_seconds)}`).join(", ")))));
}

// ---- lineage -----------------------------------------------------------------------------------------

function renderLineageChoices(p) {
  const select = $("#lineage-subject");
  const names = p.subjects.map((s) => s.name);
  const have = [...select.options].map((o) => o.value);
  if (names.join("\n") === have.join("\n")) return;
  const keep = select.value;
  select.replaceChildren(...names.map((n) => h("option", { value: n }, n)));
  if (names.includes(keep)) select.value = keep;
}

$("#lineage-form").addEventListener("submit", (e) => {
  e.preventDefault();
  showLineage($("#lineage-subject").value, Number($("#lineage-epoch").value));
});

async function showLineage(subject, epoch) {
  $("#lineage-subject").value = subject;
  $("#lineage-epoch").value = epoch;
  const box = $("#lineage");
  box.replaceChildren(h("p", { class: "muted" }, `Reading the lineage of ${subject} epoch ${epoch}…`));
  let r, body;
  try {
    r = await fetch(`/api/lineage/${encodeURIComponent(subject)}/${epoch}`);
    body = await r.json();
  } catch (e) {
    box.replaceChildren(h("p", { class: "bad" }, `The lineage could not be read: ${e}`));
    return;
  }
  if (!r.ok) { box.replaceChildren(h("p", { class: "bad" }, body.error)); return; }
  const cut = Object.entries(body.cut).filter(([s]) => s !== subject).map(([s, es]) => `${s}: ${span(es)}`).join("; ");
  box.replaceChildren(
    h("p", {}, h("strong", {}, `${subject} epoch ${epoch}`), " derives from ", cut || "no upstream epochs (written by a plain producer)"),
    h("ul", { "data-testid": "lineage-tree" }, subjectItem(body.lineage, true)));
}

function span(epochs) {
  if (epochs.length === 0) return "none";
  const first = epochs[0], last = epochs[epochs.length - 1];
  return last - first + 1 === epochs.length ? (first === last ? `${first}` : `${first}..${last}`) : epochs.join(", ");
}

function subjectItem(tree, top = false) {
  const label = `${tree.subject} epoch ${tree.epoch}`;
  const head = top ? h("strong", {}, label)
    : h("button", { type: "button", class: "link lineage-link", "data-subject": tree.subject, "data-epoch": tree.epoch,
      onclick: () => showLineage(tree.subject, tree.epoch) }, label);
  const producers = (tree.producers || []).map((p) => {
    if (!p.job) return h("li", {}, `written by ${p.sink} (no job: a plain producer or the epoch marker)`);
    const how = p.aligned === true ? "aligned" : p.aligned === false ? "not aligned: input offsets, no whole epochs" : p.inputs_collected || "";
    return h("li", {}, `by ${p.spark ? "Spark sink" : "job"} ${p.job} (${how})`,
      h("ul", {}, (p.inputs || []).map((i) => subjectItem(i))));
  });
  return h("li", {}, head, tree.collected ? h("span", { class: "muted" }, " (out of retention)") : null,
    producers.length ? h("ul", {}, producers) : null);
}

// ---- actions -----------------------------------------------------------------------------------------

$("#retention").addEventListener("click", () => confirmAction({ kind: "gc" }));

async function confirmAction(action) {
  const verify = $("#confirm-verify");
  verify.hidden = action.kind !== "hotswap";
  $("#confirm-verify-epochs").value = "";
  const r = await fetch("/api/actions/describe", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(action) });
  const body = await r.json();
  const dialog = $("#confirm");
  $("#confirm-what").textContent = r.ok ? body.what : body.error;
  const refused = $("#confirm-refused");
  refused.hidden = !body.refused;
  refused.textContent = body.refused || "";
  $("#confirm-ok").disabled = !r.ok || !!body.refused;
  dialog.returnValue = "";
  dialog.onclose = async () => {
    if (dialog.returnValue !== "ok") return;
    const epochs = Number($("#confirm-verify-epochs").value);
    if (action.kind === "hotswap" && epochs > 0) action = { ...action, verify_epochs: epochs };
    const started = await fetch("/api/actions", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(action) });
    if (!started.ok) renderAction({ state: "refused", what: action.kind, line: (await started.json()).error });
  };
  dialog.showModal();
}

function renderAction(a) {
  const box = $("#action-box");
  if (!a) { box.hidden = true; return; }
  box.hidden = false;
  const cls = a.state === "done" ? "badge ok" : a.state === "running" ? "badge" : "badge bad";
  $("#action").replaceChildren(h("span", { class: cls, "data-state": a.state }, a.state), " ", a.what || "",
    a.command ? h("div", { class: "muted" }, h("code", {}, a.command)) : null,
    a.line ? h("div", { class: "bad", "data-testid": "action-line" }, a.line) : null);
}
