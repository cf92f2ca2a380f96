// The live page of a run (orchestrator/service/dashboard.py): polls v1/stats and v1/policy,
// keeps the history since the page was opened in memory, draws it with uPlot, and changes one
// policy field with PATCH v1/policy. The bearer token is read from its field for that one
// request and never stored (no cookie, no local or session storage, not in the URL).
"use strict";

(function () {
  const params = new URLSearchParams(window.location.search);
  const REFRESH_MS = Math.max(500, 1000 * (Number(params.get("refresh")) || 2));
  const WINDOW_S = 10;        // the windowed keep rate: groups classified in the last WINDOW_S seconds
  const MAX_POINTS = 5000;    // history kept in memory (about 2.8 h at the default refresh)
  const COLOURS = ["#2a9d8f", "#e63946", "#457b9d", "#f4a261", "#6a4c93", "#8d99ae", "#b5838d", "#264653", "#a8dadc"];

  const hist = { t: [], rows: [] };   // t: Unix seconds; rows: the stats of each poll
  const marks = [];                   // policy revision changes: {t, revision}
  let charts = null;                  // built at the first poll (the drop reasons come from the stats)
  let policy = null;                  // the last GET v1/policy body
  let refreshes = 0;

  // ------------------------------------------------------------------ formatting
  function fmt(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "boolean") return v ? "yes" : "no";
    if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(3);
    return typeof v === "object" ? JSON.stringify(v) : String(v);
  }
  function get(obj, dotted) {
    return dotted.split(".").reduce((o, k) => (o === null || o === undefined ? undefined : o[k]), obj);
  }
  function sum(obj) { return Object.values(obj || {}).reduce((a, b) => a + b, 0); }
  function setStatus(state, text) {
    const el = document.getElementById("status");
    el.dataset.state = state;
    el.textContent = text;
  }

  // ------------------------------------------------------------------ charts
  function revisionMarks() {  // a uPlot plugin: a dashed vertical line and "rev N" at each policy change
    return { hooks: { draw: [(u) => {
      const ctx = u.ctx, { left, top, width, height } = u.bbox, dpr = window.devicePixelRatio || 1;
      ctx.save();
      ctx.strokeStyle = "#e76f00"; ctx.fillStyle = "#e76f00"; ctx.lineWidth = dpr; ctx.setLineDash([5 * dpr, 4 * dpr]);
      ctx.font = `${11 * dpr}px system-ui, sans-serif`;
      for (const m of marks) {
        const x = Math.round(u.valToPos(m.t, "x", true));
        if (x < left || x > left + width) continue;
        ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
        ctx.fillText(`rev ${m.revision}`, x + 3 * dpr, top + 12 * dpr);
      }
      ctx.restore();
    }] } };
  }

  function chart(id, series) {  // series: [{label, value(row, i) -> number|null, stepped?}]
    const el = document.getElementById(id);
    const opts = {
      width: Math.max(300, el.clientWidth), height: 220, plugins: [revisionMarks()],
      scales: { x: { time: true } }, legend: { live: false },
      series: [{}, ...series.map((s, k) => ({
        label: s.label, stroke: COLOURS[k % COLOURS.length], width: 1.5, spanGaps: true,
        ...(s.stepped ? { paths: uPlot.paths.stepped({ align: 1 }) } : {}),
      }))],
    };
    const u = new uPlot(opts, [[], ...series.map(() => [])], el);
    return { el, u, series };
  }

  function windowedKeepRate(row, i) {  // kept / classified over the last WINDOW_S seconds
    let j = i;
    while (j > 0 && hist.t[i] - hist.t[j - 1] <= WINDOW_S) j--;
    if (j === i) return null;
    const base = hist.rows[j];
    const classified = sum(row.classified_by_reason) - sum(base.classified_by_reason);
    return classified > 0 ? (row.groups_kept_classified - base.groups_kept_classified) / classified : null;
  }

  function buildCharts(stats) {
    const reasons = Object.keys(stats.dropped_by_reason).sort();
    return [
      chart("chart-groups", [
        { label: "kept", value: (r) => r.groups_kept_classified },
        ...reasons.map((reason) => ({ label: `dropped: ${reason}`, value: (r) => r.dropped_by_reason[reason] ?? null })),
      ]),
      chart("chart-keep", [
        { label: "keep rate (cumulative)", value: (r) => r.keep_ratio },
        { label: `keep rate (last ${WINDOW_S} s)`, value: windowedKeepRate },
        { label: "predicted", value: (r) => r.predicted_keep_rate },
      ]),
      chart("chart-cost", [
        { label: "rollouts per emitted group", value: (r) => r.rollouts_per_emitted_group },
        { label: "share of rollouts on dropped groups", value: (r) => r.rollouts_dropped_share },
      ]),
      chart("chart-screens", [
        { label: "screens", value: (r) => r.screens },
        { label: "screens stopped", value: (r) => r.screens_stopped },
        { label: "answers scored", value: (r) => r.answers_scored },
        { label: "answer skips", value: (r) => r.answer_skips },
        { label: "answers reused", value: (r) => r.answers_reused },
      ]),
      chart("chart-versions", [
        { label: "batches emitted", value: (r) => r.batches_emitted, stepped: true },
        { label: "model version", value: (r) => r.model_version, stepped: true },
        { label: "policy revision", value: (r) => r.policy_revision, stepped: true },
      ]),
    ];
  }

  function redraw() {
    for (const c of charts || []) {
      const data = [hist.t.slice(), ...c.series.map((s) => hist.rows.map((r, i) => { const v = s.value(r, i); return v ?? null; }))];
      c.u.setData(data);
    }
  }

  // ------------------------------------------------------------------ numbers and policy
  function renderStats(stats) {
    for (const el of document.querySelectorAll("[data-stat]")) el.textContent = fmt(get(stats, el.dataset.stat));
  }

  function flatten(obj, prefix) {  // {"a": 1, "filter": {"judge": "x"}} -> [["a", 1], ["filter.judge", "x"]]
    return Object.entries(obj).flatMap(([k, v]) =>
      v !== null && typeof v === "object" && !Array.isArray(v) ? flatten(v, `${prefix}${k}.`) : [[`${prefix}${k}`, v]]);
  }

  function renderPolicy(state) {
    document.getElementById("policy-revision").textContent = String(state.revision);
    const fields = flatten(state.policy, "");
    const body = document.querySelector("#policy-table tbody");
    body.replaceChildren(...fields.map(([k, v]) => {
      const tr = document.createElement("tr");
      tr.dataset.field = k;
      for (const text of [k, JSON.stringify(v)]) { const td = document.createElement("td"); td.textContent = text; tr.append(td); }
      return tr;
    }));
    const select = document.getElementById("policy-field");
    if (select.options.length !== fields.length) {
      const chosen = select.value;
      select.replaceChildren(...fields.map(([k]) => new Option(k, k)));
      if (chosen) select.value = chosen;
      if (!document.getElementById("policy-value").value) fillValue();
    }
  }

  function fillValue() {
    const field = document.getElementById("policy-field").value;
    if (policy && field) document.getElementById("policy-value").value = JSON.stringify(get(policy.policy, field));
  }

  function parseValue(text) {  // JSON where it parses (numbers, true, null, lists, quoted strings), else the text
    try { return JSON.parse(text); } catch (e) { return text; }
  }

  async function applyChange(event) {
    event.preventDefault();
    const field = document.getElementById("policy-field").value;
    const value = parseValue(document.getElementById("policy-value").value.trim());
    const token = document.getElementById("policy-token").value.trim();  // read now, sent once, never stored
    const result = document.getElementById("policy-result");
    const body = field.split(".").reverse().reduce((inner, key) => ({ [key]: inner }), value);
    const headers = { "Content-Type": "application/json" };
    if (policy) headers["If-Match"] = `"${policy.revision}"`;
    if (token) headers.Authorization = `Bearer ${token}`;
    result.dataset.ok = ""; result.textContent = "sending…";
    try {
      const r = await fetch("v1/policy", { method: "PATCH", headers, body: JSON.stringify(body), cache: "no-store", credentials: "omit" });
      const answer = await r.json().catch(() => ({}));
      if (r.ok) {
        policy = answer;
        renderPolicy(answer);
        result.dataset.ok = "true";
        result.textContent = `${field} = ${JSON.stringify(get(answer.policy, field))}: revision ${answer.revision}`;
        poll(true);
      } else {
        result.dataset.ok = "false";
        result.textContent = `${r.status} ${answer.error || ""}: ${answer.message || r.statusText}`;
      }
    } catch (e) {
      result.dataset.ok = "false";
      result.textContent = `request failed: ${e.message}`;
    }
  }

  // ------------------------------------------------------------------ polling
  async function getJson(url) {
    const r = await fetch(url, { cache: "no-store", credentials: "omit" });
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(`${url}: ${r.status} ${body.message || r.statusText}`);
    return body;
  }

  let timer = null;
  async function poll(once) {
    if (!once) timer = null;
    try {
      const [stats, state] = await Promise.all([getJson("v1/stats"), getJson("v1/policy")]);
      const now = Date.now() / 1000;
      const last = hist.rows[hist.rows.length - 1];
      if (last !== undefined && last.policy_revision !== stats.policy_revision) marks.push({ t: now, revision: stats.policy_revision });
      hist.t.push(now); hist.rows.push(stats);
      if (hist.t.length > MAX_POINTS) { hist.t.shift(); hist.rows.shift(); }
      if (charts === null) charts = buildCharts(stats);
      policy = state;
      renderStats(stats);
      renderPolicy(state);
      renderMarks();
      redraw();
      setStatus("live", `live: refreshed ${new Date(now * 1000).toLocaleTimeString()} (every ${REFRESH_MS / 1000} s)`);
    } catch (e) {
      setStatus("unavailable", `unavailable, retrying every ${REFRESH_MS / 1000} s: ${e.message}`);
    } finally {
      refreshes += 1;
      document.body.dataset.refreshes = String(refreshes);
      if (!once && timer === null) timer = setTimeout(() => poll(false), REFRESH_MS);
    }
  }

  function renderMarks() {
    const list = document.getElementById("revision-marks");
    if (list.children.length === marks.length) return;
    list.replaceChildren(...marks.map((m) => {
      const li = document.createElement("li");
      li.dataset.revision = String(m.revision);
      li.textContent = `revision ${m.revision} at ${new Date(m.t * 1000).toLocaleTimeString()}`;
      return li;
    }));
  }

  window.addEventListener("resize", () => {
    for (const c of charts || []) c.u.setSize({ width: Math.max(300, c.el.clientWidth), height: 220 });
  });
  document.getElementById("policy-form").addEventListener("submit", applyChange);
  document.getElementById("policy-field").addEventListener("change", fillValue);
  poll(false);
})();
