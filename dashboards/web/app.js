// The operator page: live charts and tables from /dashboard/stream (one event per second), actions to /admin/*.
const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "governor-admin-token";
const COLORS = ["#0b5cad", "#c2410c", "#146c2e", "#7e22ce", "#a4161a", "#0e7490", "#854d0e", "#be185d"];
const PLOT_CONFIG = { displayModeBar: false, responsive: true };
let current = null;   // the latest event's payload

function layout(extra = {}) {
  return {
    margin: { l: 44, r: 8, t: 6, b: 28 }, height: 185, paper_bgcolor: "#fff", plot_bgcolor: "#fff",
    font: { size: 11, color: "#1b1f24" }, showlegend: true,
    legend: { orientation: "h", y: -0.22, font: { size: 10 } },
    xaxis: { type: "date", tickformat: "%H:%M:%S", gridcolor: "#e4e7eb" },
    yaxis: { gridcolor: "#e4e7eb", rangemode: "tozero" }, ...extra,
  };
}

function line(x, y, name, color, dash = "solid") {
  return { x, y, name, type: "scatter", mode: "lines", line: { color, width: 2, dash }, connectgaps: false };
}

const ms = (values) => values.map((v) => (v === null ? null : v * 1000));

function drawCharts(live) {
  const x = live.t.map((t) => new Date(t * 1000));
  Plotly.react("chart-goodput", [line(x, live.goodput, "tokens/s", COLORS[0])], layout({ showlegend: false }),
    PLOT_CONFIG);
  const latency = [["ttft", "TTFT", 0], ["inter_token", "inter-token", 1], ["e2e", "end-to-end", 2]].flatMap(
    ([key, name, c]) => [line(x, ms(live[`${key}_p50`]), `${name} p50`, COLORS[c]),
      line(x, ms(live[`${key}_p99`]), `${name} p99`, COLORS[c], "dot")]);
  const logAxis = { type: "log", dtick: 1, gridcolor: "#e4e7eb" };
  Plotly.react("chart-latency", latency, layout({ yaxis: logAxis }), PLOT_CONFIG);
  const positions = live.acceptance_per_position;
  const acceptance = [line(x, live.acceptance, "all", "#1b1f24")].concat(positions.map((y, p) => ({
    ...line(x, y, `position ${p + 1}`, `hsl(212, 80%, ${22 + (50 * p) / Math.max(positions.length - 1, 1)}%)`, "dot"),
    showlegend: p === 0 || p === positions.length - 1,    // darker = earlier position; the ends are named
  })));
  Plotly.react("chart-acceptance", acceptance, layout({
    yaxis: { range: [0, 1.05], gridcolor: "#e4e7eb" }, margin: { l: 44, r: 4, t: 6, b: 28 },
    legend: { orientation: "v", x: 1.01, y: 1, font: { size: 10 } },
  }), PLOT_CONFIG);
  Plotly.react("chart-load", [line(x, live.batch_size, "batch size", COLORS[0]),
    line(x, live.queue_depth, "queue depth", COLORS[1])], layout(), PLOT_CONFIG);
  const heat = live.expert_heat || [];
  Plotly.react("chart-heat", [{
    z: heat, type: "heatmap", colorscale: "YlOrRd", reversescale: true, zmin: 0,
    hovertemplate: "layer %{y}, expert %{x}: %{z:.2f}<extra></extra>",
    colorbar: { thickness: 10, len: 0.9 },
  }], layout({
    showlegend: false, xaxis: { title: { text: "expert", standoff: 2 }, dtick: 1 },
    yaxis: { title: { text: "layer" }, dtick: 1, autorange: "reversed" }, margin: { l: 44, r: 8, t: 6, b: 36 },
  }), PLOT_CONFIG);
  Plotly.react("chart-balance", [line(x, live.balancedness, "balancedness", COLORS[2]),
    line(x, live.comm_share, "communication share", COLORS[3])],
  layout({ yaxis: { range: [0, 1.05], gridcolor: "#e4e7eb" } }), PLOT_CONFIG);
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function fillTable(id, rows, columns, empty) {
  const body = $(id).tBodies[0];
  body.replaceChildren();
  if (rows.length === 0) {
    cell(body.insertRow(), empty, "meta").colSpan = $(id).tHead.rows[0].cells.length;
  }
  for (const item of rows) {
    const row = body.insertRow();
    for (const [value, className] of columns(item)) cell(row, value, className);
  }
}

// the store's timestamps are UTC; SQLite drops the zone
const utc = (iso) => (iso.endsWith("Z") || iso.includes("+") ? iso : `${iso}Z`);
const time = (iso) => (iso ? new Date(utc(iso)).toLocaleTimeString([], { hour12: false }) : "");
const gain = (g) => (g === null || g === undefined ? "–" : `${g.toFixed(3)}x`);
// a k schedule reads "b≤1: k8, b≤4: k4, …"; any other structured value is only marked as such
const scheduleText = (bands) => bands.map(([upTo, k]) => `b≤${upTo}: k${k}`).join(", ");
const short = (v, key) => (key === "draft_len_schedule" && Array.isArray(v) ? scheduleText(v)
  : v !== null && typeof v === "object" ? "(structured)" : String(v));
const diffText = (diff) => Object.entries(diff || {})     // a first version has nothing before it
  .map(([k, [a, b]]) => (a === null ? `${k} = ${short(b, k)}` : `${k}: ${short(a, k)} → ${short(b, k)}`)).join("; ");

const percent = (x) => `${(100 * x).toFixed(0)}%`;
const calibrationText = (c) => (!c || !c.trials ? "what-if calibration: no predicted trial measured yet"
  : `what-if calibration over ${c.trials} trials: median |measured/predicted − 1| ${percent(c.median_abs_error)}, `
    + `${percent(c.over_predicted_share)} over-predicted (uncalibrated model: ${percent(c.raw_median_abs_error)}, `
    + `${percent(c.raw_over_predicted_share)})`);

function drawState(state) {
  const config = state.config;
  $("speculation").textContent = `speculation: ${state.speculation}`;
  $("drafter").textContent = state.speculation !== "on" ? "plain decoding"
    : `${config.spec_method === "ngram" ? "prompt lookup (n-gram)" : "draft model"} · ${
      config.draft_len_schedule ? `k by batch: ${scheduleText(config.draft_len_schedule)}` : `k ${config.draft_len}`}`;
  $("speculation").className = `badge ${state.speculation}`;
  $("config-version").textContent = `config v${config.version}`;
  const ctl = state.controller;
  $("policy-name").textContent = ctl ? `policy ${ctl.policy} (${ctl.policy_kind})` : "no controller";
  const dl = $("config");
  dl.replaceChildren();
  for (const [key, value] of Object.entries(config)) {
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = key;
    dd.textContent = key === "draft_len_schedule" && Array.isArray(value) ? scheduleText(value)
      : value !== null && typeof value === "object" ? JSON.stringify(value) : String(value);
    dl.append(dt, dd);
  }
  $("pin-state").textContent = !ctl ? "" : [
    ctl.pin ? `pinned v${ctl.pin.config_version} by ${ctl.pin.owner}` : "not pinned",
    ctl.trial ? `trial ${ctl.trial.id} running: ${ctl.trial.reason}` : "no trial running",
    `last known good v${ctl.last_known_good.version}`].join(" · ");
  $("calibration").textContent = ctl ? calibrationText(ctl.calibration) : "";
  fillTable("history", state.history, (v) => [[v.id, "num"], [time(v.at), "num"], [v.source], [diffText(v.diff)],
    [v.reason]], "no config versions");
  fillTable("decisions", state.decisions, (d) => [[d.id, "num"], [time(d.at), "num"], [d.action], [d.reason],
    [gain(d.predicted_gain), "num"], [gain(d.measured_gain), "num"], [d.config_version ?? "", "num"]], "no decisions");
  fillTable("alerts", state.alerts, (a) => [[time(a.received_at), "num"], [a.name], [a.status, a.status], [a.action],
    [a.outcome ?? "not acted on yet"]], "no alerts received");
  const select = $("policy-select");
  if (select.options.length !== state.policies.length) {
    select.replaceChildren(...state.policies.map((name) => new Option(name, name)));
  }
}

function fillPinForm(config) {
  $("pin-method").value = config.spec_method;
  $("pin-draft-len").value = config.draft_len;
  $("pin-schedule").value = config.draft_len_schedule ? JSON.stringify(config.draft_len_schedule) : "";
  $("pin-capacity").value = config.capacity_factor;
}

function connect() {
  const source = new EventSource("/dashboard/stream");
  source.onopen = () => { $("connection").textContent = "live"; };
  source.onerror = () => { $("connection").textContent = "reconnecting…"; };
  source.onmessage = (event) => {
    const first = current === null;
    current = JSON.parse(event.data);
    if (first) fillPinForm(current.config);     // the form starts from the config in use
    drawCharts(current.live);
    drawState(current);
  };
}

async function act(label, method, path, body) {
  const result = $("action-result");
  const token = sessionStorage.getItem(TOKEN_KEY) || "";
  const headers = { "Content-Type": "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  let reply;
  try {
    reply = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (error) {
    result.className = "error";
    result.textContent = `${label} failed: ${error.message}`;
    return;
  }
  const payload = await reply.json().catch(() => ({}));
  if (reply.ok) {
    result.className = "ok";
    result.textContent = `${label}: done${payload.decision ? ` (decision ${payload.decision})` : ""}`;
  } else {
    result.className = "error";
    result.textContent = `${label} refused (${reply.status}): ${payload.error?.message ?? reply.statusText}`;
  }
}

function wireActions() {
  const token = $("token");
  token.value = sessionStorage.getItem(TOKEN_KEY) || "";
  token.addEventListener("input", () => sessionStorage.setItem(TOKEN_KEY, token.value));
  $("forget-token").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); token.value = ""; });
  $("pin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const { version, ...config } = current ? current.config : {};
    const schedule = $("pin-schedule").value.trim();
    let bands = null;                             // empty: no schedule, k applies at every batch size
    try {
      bands = schedule ? JSON.parse(schedule) : null;
    } catch (error) {
      $("action-result").className = "error";
      $("action-result").textContent = `Pin refused: draft_len_schedule is not JSON (${error.message})`;
      return;
    }
    act("Pin", "PUT", "/admin/config", {
      ...config, spec_method: $("pin-method").value, draft_len: Number($("pin-draft-len").value),
      draft_len_schedule: bands, capacity_factor: Number($("pin-capacity").value),
    });
  });
  $("release").addEventListener("click", () => act("Release", "POST", "/admin/release"));
  $("rollback").addEventListener("click", () => act("Roll back", "POST", "/admin/rollback"));
  $("switch-policy").addEventListener("click", () => act("Switch policy", "PUT", "/admin/policy",
    { name: $("policy-select").value }));
  $("search-start").addEventListener("click", () => act("Start search", "POST", "/admin/search/start"));
  $("search-stop").addEventListener("click", () => act("Stop search", "POST", "/admin/search/stop"));
}

wireActions();
connect();
