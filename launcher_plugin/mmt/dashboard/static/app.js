// mmt dashboard: polls the JSON API and updates the page in place (no reloads, no build step).
// Every text from the server goes in through textContent, never as HTML: logs and overrides are arbitrary text.
"use strict";

const POLL_MS = 1500;
const MAX_POINTS = 900;      // node samples kept per node in the browser
const MAX_LOG_LINES = 5000;  // log lines kept in the DOM
const COLORS = ["#1f6fd1", "#d9480f", "#2b8a3e", "#ae3ec9", "#e67700", "#0c8599", "#c2255c", "#5f3dc4"];

// ------------------------------------------------------------------------------------------ helpers

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v);
  }
  for (const child of children) if (child !== null && child !== undefined) el.append(child);
  return el;
}

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  if (!response.ok) throw Object.assign(new Error(`${url}: HTTP ${response.status}`), { status: response.status });
  return response.json();
}

function fmtDuration(s) {
  if (s === null || s === undefined) return "—";
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}

function fmtBytes(b) {
  if (b === null || b === undefined) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(b) >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return `${b.toFixed(b >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
}

const fmtRate = (b) => (b === null || b === undefined ? "—" : `${fmtBytes(b)}/s`);
const fmtNum = (v, digits = 4) => (v === null || v === undefined ? "—" : Number(v.toPrecision(digits)).toString());
const fmtPct = (v) => (v === null || v === undefined ? "—" : `${v.toFixed(0)}%`);
// a job with roles: each role's nodes × devices ("trainer 2 x 2 + scorer 1 x 1")
const topology = (j) => j.roles || (j.num_nodes ? `${j.num_nodes} × ${j.devices ?? "?"}` : "? × ?");
const statusBadge = (status) => h("span", { class: "status", "data-status": status, text: status });

function setConn(ok, text) {
  const el = document.getElementById("conn");
  el.textContent = text;
  el.classList.toggle("offline", !ok);
}

// ------------------------------------------------------------------------------------------- charts

// After each draw, the legend shows the newest values unless the cursor is on the chart.
function showNewest(u) {
  const n = u.data[0].length;
  if (n && !(u.cursor.left >= 0)) u.setLegend({ idx: n - 1 });
}

// Dashed vertical lines at the chart's marks (x values): where a restarted run took over on the training curves.
function drawMarks(chart) {
  return (u) => {
    if (!chart.marks.length) return;
    const ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = "#c0392b";
    ctx.lineWidth = 1;
    ctx.setLineDash([5, 4]);
    for (const x of chart.marks) {
      const px = Math.round(u.valToPos(x, "x", true));
      if (px < u.bbox.left || px > u.bbox.left + u.bbox.width) continue;
      ctx.beginPath();
      ctx.moveTo(px, u.bbox.top);
      ctx.lineTo(px, u.bbox.top + u.bbox.height);
      ctx.stroke();
    }
    ctx.restore();
  };
}

// A uPlot chart in a container that says how many points it shows (data-points) and how many marks it draws
// (data-marks), for people and for tests.
class Chart {
  constructor(parent, { title, kind, node, series, fmt, time = true, range, scatter, xAxis }) {
    this.el = h("div", { class: "chart", "data-kind": kind, "data-node": node, "data-points": "0", "data-marks": "0" });
    this.marks = [];
    parent.append(this.el);
    const width = Math.max(280, this.el.clientWidth || 380);
    const opts = {
      title, width, height: 170,
      scales: { x: { time, ...(xAxis?.scale || {}) }, y: { range: range || ((u, min, max) => [Math.min(0, min), max > 0 ? max * 1.08 : 1]) } },
      series: [{ label: time ? "time" : (xAxis?.label || "step"), value: xAxis?.value }].concat(series.map((s, i) => ({
        label: s.label, stroke: s.color || COLORS[i % COLORS.length], width: 1.5, spanGaps: true,
        value: (u, v) => fmt(v), dash: s.dash,
        ...(scatter ? { paths: () => null, points: { show: true, size: 8 } } : {}),
      }))),
      axes: [{ ...(xAxis?.axis || {}) },
        { values: (u, splits) => splits.map(fmt), size: 74, ...(fmt === fmtBytes || fmt === fmtRate ? { incrs: BYTE_INCRS } : {}) }],
      legend: { live: true },
      hooks: { draw: [showNewest, drawMarks(this)], setCursor: [showNewest] },
      cursor: { drag: { x: true, y: false } },
    };
    this.plot = new uPlot(opts, [[], ...series.map(() => [])], this.el);
  }

  setData(data, marks = []) {
    this.marks = marks;
    this.el.dataset.marks = String(marks.length);
    this.plot.setData(data);
    this.el.dataset.points = String(data[0].length);
  }

  resize() { this.plot.setSize({ width: Math.max(280, this.el.clientWidth), height: 170 }); }
  destroy() { this.plot.destroy(); }
}

// axis steps for bytes: powers of two of B, KiB, MiB, GiB, TiB (so ticks read 4 GB, 8 GB, not 9.3 GB)
const BYTE_INCRS = [0, 1, 2, 3, 4].flatMap((k) => [1, 2, 4, 8, 16, 32, 64, 128, 256, 512].map((m) => m * 1024 ** k));

const percentRange = (u, min, max) => [0, Math.max(100, max || 0) * 1.02];

// --------------------------------------------------------------------------------------- node metrics

// One node's samples, kept as columns, and its charts (GPU charts only when the node reports GPUs).
class NodePanel {
  constructor(parent, node) {
    this.node = node;
    this.t = [];
    this.series = {};
    this.gpus = new Map();  // index -> {name, series}
    this.card = h("div", { class: "card node", "data-node": node });
    this.title = h("h4", { text: `node ${node}` });
    this.grid = h("div", { class: "charts" });
    this.card.append(this.title, this.grid);
    parent.append(this.card);
    const chart = (kind, title, series, fmt, range) => new Chart(this.grid, { kind, title, node, series, fmt, range });
    this.charts = [
      [chart("cpu", "CPU", [{ label: "host %" }, { label: "job %" }], fmtPct, percentRange),
        () => [this.s("cpu_percent"), this.s("job_cpu_percent")]],
      [chart("memory", "Memory", [{ label: "host used" }, { label: "job RSS" }, { label: "total", color: "#999", dash: [4, 4] }], fmtBytes),
        () => [this.s("mem_used_bytes"), this.s("job_rss_bytes"), this.s("mem_total_bytes")]],
      [chart("network", "Network", [{ label: "sent" }, { label: "received" }], fmtRate),
        () => [this.s("net_sent_bytes_per_s"), this.s("net_recv_bytes_per_s")]],
      [chart("disk", "Disk", [{ label: "read" }, { label: "write" }], fmtRate),
        () => [this.s("disk_read_bytes_per_s"), this.s("disk_write_bytes_per_s")]],
    ];
    this.gpuCharts = null;
  }

  s(key) { return this.series[key] || []; }

  get last() { return this.t.length ? this.t[this.t.length - 1] : null; }

  // Append what the server sent after our last sample; replace everything when `replace`.
  merge(data, replace) {
    if (replace) { this.t = []; this.series = {}; this.gpus = new Map(); }
    const last = this.last;
    const keep = data.t.map((t, i) => (last === null || t > last ? i : -1)).filter((i) => i >= 0);
    const pad = this.t.length;
    this.t.push(...keep.map((i) => data.t[i]));
    for (const [key, values] of Object.entries(data.series)) {
      if (!this.series[key]) this.series[key] = new Array(pad).fill(null);
      this.series[key].push(...keep.map((i) => values[i]));
    }
    for (const gpu of data.gpus) {
      if (!this.gpus.has(gpu.index)) this.gpus.set(gpu.index, { name: gpu.name, series: {} });
      const mine = this.gpus.get(gpu.index);
      for (const [key, values] of Object.entries(gpu.series)) {
        if (!mine.series[key]) mine.series[key] = new Array(pad).fill(null);
        mine.series[key].push(...keep.map((i) => values[i]));
      }
    }
    // columns that this batch did not carry stay aligned with t
    const align = (cols) => { for (const k in cols) while (cols[k].length < this.t.length) cols[k].push(null); };
    align(this.series);
    for (const gpu of this.gpus.values()) align(gpu.series);
    const drop = this.t.length - MAX_POINTS;
    if (drop > 0) {
      this.t.splice(0, drop);
      for (const k in this.series) this.series[k].splice(0, drop);
      for (const gpu of this.gpus.values()) for (const k in gpu.series) gpu.series[k].splice(0, drop);
    }
    if (data.host) this.title.textContent = `node ${this.node} · ${data.host}`;
    if (keep.length || replace) this.draw();
  }

  draw() {
    if (this.gpus.size && !this.gpuCharts) this.addGpuCharts();
    for (const [chart, columns] of this.charts) chart.setData([this.t, ...columns()]);
  }

  addGpuCharts() {
    const gpus = [...this.gpus.entries()];
    const perGpu = (key) => () => gpus.map(([index]) => this.gpus.get(index).series[key] || []);
    const labels = gpus.map(([index, g]) => ({ label: `GPU ${index}${g.name ? " " + g.name : ""}` }));
    const chart = (kind, title, fmt, range) => new Chart(this.grid, { kind, title, node: this.node, series: labels, fmt, range });
    this.gpuCharts = [
      [chart("gpu_util", "GPU utilisation", fmtPct, percentRange), perGpu("util_percent")],
      [chart("gpu_memory", "GPU memory", fmtBytes), perGpu("mem_used_bytes")],
      [chart("gpu_power", "GPU power", (v) => (v === null ? "—" : `${v.toFixed(0)} W`)), perGpu("power_w")],
      [chart("gpu_temp", "GPU temperature", (v) => (v === null ? "—" : `${v.toFixed(0)} °C`)), perGpu("temp_c")],
    ];
    this.charts.push(...this.gpuCharts);
  }

  resize() { for (const [chart] of this.charts) chart.resize(); }
  destroy() { for (const [chart] of this.charts) chart.destroy(); }
}

// ----------------------------------------------------------------------------------------------- a job

class JobView {
  constructor(root, id) {
    this.id = id;
    this.api = `api/jobs/${encodeURIComponent(id)}`;
    this.nodes = new Map();
    this.curvesVersion = undefined;
    this.curveCharts = null;
    this.log = { name: null, next: null, lines: 0, total: 0 };
    this.header = h("div");
    this.failure = h("div", { id: "failure" });
    this.curves = h("div", { class: "charts", id: "curves" });
    this.nodesEl = h("div", { id: "nodes" });
    this.logSelect = h("select", { id: "log-select", "aria-label": "rank", onchange: () => this.switchLog(this.logSelect.value) });
    this.logInfo = h("span", { class: "hint" });
    this.logEl = h("pre", { id: "log", "data-lines": "0", "data-total": "0" });
    root.replaceChildren(
      this.header, this.failure,
      h("h3", { text: "Training curves" }), this.curves,
      h("h3", { text: "Nodes" }), this.nodesEl,
      h("h3", { text: "Logs" }),
      h("div", { class: "logbar" }, h("label", { text: "rank " }, this.logSelect), this.logInfo),
      this.logEl,
    );
  }

  async poll() {
    const job = await getJSON(this.api);
    this.renderHeader(job);
    this.renderFailure(job);
    this.updateLogChoices(job);
    const nodesSeen = job.metric_nodes.every((n) => this.nodes.has(n));
    await Promise.all([
      this.pollMetrics(!nodesSeen),
      this.pollLog(),
      job.curves_version !== this.curvesVersion ? this.pollCurves(job.curves_version) : null,
    ]);
  }

  renderHeader(job) {
    const facts = [
      ["topology", `${topology(job)}${job.num_nodes && !job.roles ? " (nodes × devices)" : ""}`],
      ["machine", job.machine || "—"],
      ["duration", fmtDuration(job.duration_s)],
      [job.metric_name || "metric", fmtNum(job.metric)],
    ];
    if (job.backend) facts.push(["backend", job.backend]);
    if (job.scheduler_id) facts.push(["scheduler id", String(job.scheduler_id)]);
    if (job.note) facts.push(["scheduler", job.note]);  // why it waits, that it can never start, or no answer
    const runs = job.earlier_runs || [];
    if (runs.length) facts.push(["restarts", String(runs.length)]);
    if (job.code) {  // the launch's snapshot of the project: what the job runs
      const commit = job.code.commit ? job.code.commit.slice(0, 12) : "no git";
      facts.push(["code", `${job.code.id} (${commit}${job.code.dirty ? " + uncommitted changes" : ""})`]);
    }
    this.header.replaceChildren(
      h("h2", {}, h("span", { text: `#${job.num} ${job.name}` }), statusBadge(job.status)),
      h("div", { class: "facts" }, ...facts.map(([k, v]) => h("span", {}, `${k} `, h("b", { text: v })))),
      h("div", {}, ...job.overrides.map((o) => h("span", { class: "chip", text: o }))),
      h("div", { class: "path", text: job.path }),
      ...(runs.length ? [h("ul", { class: "runs" }, ...runs.map((r) => h("li", {
        text: `run ${r.restart} failed after ${fmtDuration(r.duration_s)}: ${r.error}`,
      })))] : []),
    );
  }

  renderFailure(job) {
    const f = job.failure;
    if (!f && !job.error) { this.failure.replaceChildren(); return; }
    if (this.failure.dataset.shown === (job.error || "") + (f?.traceback || "")) return;
    this.failure.dataset.shown = (job.error || "") + (f?.traceback || "");
    const parts = [];
    if (f) {
      const who = f.whole_node ? `node ${f.node_rank}` : `rank ${f.rank} (node ${f.node_rank})`;
      const how = f.exception || (f.signal ? `killed by ${f.signal}` : f.exit_code !== null ? `exit code ${f.exit_code}` : "failed");
      parts.push(h("div", { class: "what", text: `${who}: ${how}` }));
      if (f.missing_result) parts.push(h("div", { text: "it exited without reporting a result" }));
      if (f.log) {
        const name = f.log.split("/").pop();
        parts.push(h("div", {}, "log: ", h("a", { href: "#", text: name, onclick: (e) => { e.preventDefault(); this.switchLog(name); } })));
      }
      if (f.traceback) parts.push(h("pre", { class: "traceback", text: f.traceback }));
    } else {
      parts.push(h("pre", { class: "traceback", text: job.error }));
    }
    this.failure.replaceChildren(h("div", { class: "failure" }, ...parts));
  }

  // ---- node metrics
  async pollMetrics(replace) {
    const lasts = [...this.nodes.values()].map((n) => n.last).filter((t) => t !== null);
    const since = !replace && lasts.length === this.nodes.size && lasts.length ? Math.min(...lasts) : null;
    const data = await getJSON(`${this.api}/metrics${since === null ? "" : `?since=${since}`}`);
    if (!data.nodes.length && !this.nodes.size) {
      if (!this.nodesEl.querySelector(".empty"))
        this.nodesEl.replaceChildren(h("p", { class: "empty", text: "No machine metrics yet (metrics/node<n>.jsonl)." }));
      return;
    }
    this.nodesEl.querySelector(".empty")?.remove();
    for (const node of data.nodes) {
      if (!this.nodes.has(node.node)) this.nodes.set(node.node, new NodePanel(this.nodesEl, node.node));
      this.nodes.get(node.node).merge(node, since === null);
    }
  }

  // ---- training curves
  async pollCurves(version) {
    const data = await getJSON(`${this.api}/curves`);
    this.curvesVersion = version;
    const names = Object.keys(data.series);
    if (!names.length) {
      this.curves.replaceChildren(h("p", { class: "empty", text: "No training curves yet (metrics.csv)." }));
      return;
    }
    const losses = names.filter((n) => n.includes("loss"));
    // recipe=llm's tokens/s are 1e3..1e6 where its MFU and wait times are below 1: a chart of their own
    const rates = names.filter((n) => n.startsWith("tokens_per_s"));
    const others = names.filter((n) => !n.includes("loss") && !rates.includes(n));
    const groups = [["loss", "Loss", losses], ["rate", "Throughput (tokens/s)", rates], ["other", "Other metrics", others]]
      .filter((g) => g[2].length);
    const shape = groups.map((g) => g[2].join(",")).join("|");
    if (this.curveShape !== shape) {
      this.curveCharts?.forEach(([c]) => c.destroy());
      this.curves.replaceChildren();
      this.curveCharts = groups.map(([kind, title, cols]) => [new Chart(this.curves, {
        kind: `curve_${kind}`, title, time: false, fmt: (v) => fmtNum(v, 4),
        series: cols.map((c) => ({ label: c })),
        range: (u, min, max) => [min === null ? 0 : min - (max - min) * 0.05, max === null ? 1 : max + (max - min) * 0.05 || max + 1],
      }), cols]);
      this.curveShape = shape;
    }
    // a dashed line where a restarted (or requeued) run took over from its checkpoint
    for (const [chart, cols] of this.curveCharts) chart.setData([data.step, ...cols.map((c) => data.series[c])], data.restarts || []);
  }

  // ---- logs
  updateLogChoices(job) {
    const names = job.logs.map((l) => l.name);
    const current = [...this.logSelect.options].map((o) => o.value);
    if (names.join() !== current.join()) {
      this.logSelect.replaceChildren(...job.logs.map((l) => h("option", {
        value: l.name, text: l.rank === null ? `node ${l.node} (all ranks)` : `rank ${l.rank} (node ${l.node})`,
      })));
      if (this.log.name && names.includes(this.log.name)) this.logSelect.value = this.log.name;
    }
    if (!this.log.name && names.length) {  // a failed job opens on the log of the rank that failed
      const failed = job.failure?.log?.split("/").pop();
      this.switchLog(names.includes(failed) ? failed : names[0], false);
    }
    if (!names.length) this.logInfo.textContent = "no logs yet";
  }

  switchLog(name, fetchNow = true) {
    this.log = { name, next: null, lines: 0, total: 0 };
    this.logSelect.value = name;
    this.logEl.textContent = "";
    this.setLogCounts();
    if (fetchNow) this.pollLog().catch(() => {});
  }

  setLogCounts() {
    this.logEl.dataset.lines = String(this.log.lines);
    this.logEl.dataset.total = String(this.log.total);
    this.logEl.dataset.name = this.log.name || "";
  }

  async pollLog() {
    const log = this.log;
    for (let round = 0; log.name && round < 8; round++) {  // catch up by chunks, a few per poll
      const offset = log.next === null ? "" : `&offset=${log.next}`;
      let chunk;
      try {
        chunk = await getJSON(`${this.api}/log?name=${encodeURIComponent(log.name)}${offset}`);
      } catch (err) {
        if (err.status !== 404 || this.log !== log) throw err;
        this.log = { name: null, next: null, lines: 0, total: 0 };  // the log went away: pick again
        return;
      }
      if (this.log !== log) return;  // the rank filter changed meanwhile
      this.appendLog(chunk);
      if (!chunk.more) break;
    }
  }

  appendLog(chunk) {
    const log = this.log;
    const atBottom = this.logEl.scrollTop + this.logEl.clientHeight >= this.logEl.scrollHeight - 24;
    if (chunk.reset) { this.logEl.textContent = ""; log.lines = 0; }
    log.next = chunk.next;
    this.logInfo.textContent = `${log.name} · ${fmtBytes(chunk.size)}`;
    if (chunk.text) {
      const count = chunk.text.split("\n").length - (chunk.text.endsWith("\n") ? 1 : 0);
      this.logEl.append(document.createTextNode(chunk.text));
      log.lines += count;
      log.total += count;
      if (log.lines > MAX_LOG_LINES) {  // keep the newest lines only
        const kept = this.logEl.textContent.split("\n").slice(-MAX_LOG_LINES - 1).join("\n");
        this.logEl.textContent = kept;
        log.lines = MAX_LOG_LINES;
      }
      if (atBottom) this.logEl.scrollTop = this.logEl.scrollHeight;
    }
    this.setLogCounts();
  }

  resize() {
    for (const node of this.nodes.values()) node.resize();
    this.curveCharts?.forEach(([c]) => c.resize());
  }

  destroy() {
    for (const node of this.nodes.values()) node.destroy();
    this.curveCharts?.forEach(([c]) => c.destroy());
  }
}

// --------------------------------------------------------------------------------------------- a sweep

class SweepView {
  constructor(root, id) {
    this.api = `api/sweeps/${encodeURIComponent(id)}`;
    this.root = root;
    this.charts = [];
    this.shape = null;
    this.header = h("div");
    this.table = h("div");
    this.plots = h("div", { class: "charts", id: "sweep-charts" });
    root.replaceChildren(this.header, h("h3", { text: "Metric against each swept parameter" }), this.plots,
      h("h3", { text: "Jobs" }), this.table);
  }

  async poll() {
    const sweep = await getJSON(this.api);
    const counts = Object.entries(sweep.counts).map(([s, n]) => `${n} ${s.toLowerCase()}`).join(", ");
    this.header.replaceChildren(h("h2", { text: sweep.name }), h("div", { class: "facts", text: counts }),
      h("div", { class: "path", text: sweep.path }));
    this.table.replaceChildren(h("table", {},
      h("tr", {}, ...["#", "overrides", "status", "nodes × devices", "duration", sweep.metric_name || "metric"].map((t) => h("th", { text: t }))),
      ...sweep.jobs.map((j) => h("tr", {},
        h("td", {}, h("a", { href: `#job=${j.id}`, text: j.num })), h("td", { text: j.overrides.join(" ") }),
        h("td", {}, statusBadge(j.status)), h("td", { text: topology(j) }), h("td", { text: fmtDuration(j.duration_s) }),
        h("td", { text: fmtNum(j.metric) })))));
    this.drawParams(sweep);
  }

  drawParams(sweep) {
    const shape = JSON.stringify(sweep.params.map((p) => [p.name, p.categories]));
    if (shape !== this.shape) {
      this.charts.forEach((c) => c.destroy());
      this.charts = [];
      this.plots.replaceChildren();
      this.shape = shape;
      if (!sweep.params.length) this.plots.append(h("p", { class: "empty", text: "Nothing is swept: the jobs' overrides do not differ." }));
      for (const p of sweep.params) {
        const values = p.points.map((pt) => pt.x).filter((x) => x !== null);
        const logX = p.numeric && values.length > 1 && Math.min(...values) > 0 && Math.max(...values) / Math.min(...values) >= 100;
        const xAxis = p.numeric
          ? {
            label: p.name, value: (u, v) => fmtNum(v),
            scale: logX ? { distr: 3, range: (u, min, max) => [min / 1.6, max * 1.6] }
              : { range: (u, min, max) => [min - ((max - min) * 0.06 || 1), max + ((max - min) * 0.06 || 1)] },
          }
          : {
            label: p.name, value: (u, v) => (v === null ? "—" : p.categories[v] ?? ""),
            scale: { range: () => [-0.5, p.categories.length - 0.5] },
            axis: { splits: () => p.categories.map((_, i) => i), values: (u, splits) => splits.map((i) => p.categories[i] ?? "") },
          };
        const chart = new Chart(this.plots, {
          kind: "sweep_param", node: null, title: `${sweep.metric_name || "metric"} vs ${p.name}`, time: false,
          scatter: true, xAxis, fmt: (v) => fmtNum(v), series: [{ label: sweep.metric_name || "metric" }],
          range: (u, min, max) => (min === null ? [0, 1] : [min - (max - min) * 0.1 - 1e-9, max + (max - min) * 0.1 + 1e-9]),
        });
        chart.el.dataset.param = p.name;
        this.charts.push(chart);
      }
    }
    sweep.params.forEach((p, i) => this.charts[i]?.setData([p.points.map((pt) => pt.x), p.points.map((pt) => pt.metric)]));
  }

  resize() { this.charts.forEach((c) => c.resize()); }
  destroy() { this.charts.forEach((c) => c.destroy()); }
}

// ------------------------------------------------------------------------------------------ job list

const list = { shape: null, rows: new Map() };

function renderList(sweeps, selected) {
  const nav = document.getElementById("jobs");
  const shape = sweeps.map((s) => s.id + ":" + s.jobs.map((j) => j.id).join(",")).join("|");
  if (shape !== list.shape) {  // rebuild only when jobs appear or go: rows under the cursor stay clickable
    list.shape = shape;
    list.rows = new Map();
    if (!sweeps.length) { nav.replaceChildren(h("p", { class: "hint", text: "No job dirs found yet." })); return; }
    nav.replaceChildren(...sweeps.map((s) => {
      const counts = h("span", { class: "counts" });
      const title = h("a", { class: "sweep-name", href: `#sweep=${s.id}`, "data-sweep": s.id, title: s.path }, s.name, counts);
      list.rows.set(s.id, { counts });
      return h("div", { class: "sweep" }, title, ...s.jobs.map((j) => {
        const row = { status: h("span", { class: "status" }), meta: h("span", { class: "meta" }), over: h("span", { class: "over" }) };
        list.rows.set(j.id, row);
        return h("a", { class: "job", href: `#job=${j.id}`, "data-job": j.id, "data-num": j.num, "data-sweep": s.id },
          h("span", { class: "num", text: `#${j.num}` }), row.over, row.status, row.meta);
      }));
    }));
  }
  for (const s of sweeps) {
    list.rows.get(s.id).counts.textContent = `${s.jobs.length} job${s.jobs.length === 1 ? "" : "s"}`;
    for (const j of s.jobs) {
      const row = list.rows.get(j.id);
      row.over.textContent = j.overrides.join(" ") || j.name;
      row.over.title = j.name;
      row.status.textContent = j.status;
      row.status.dataset.status = j.status;
      const metric = j.metric === null ? "" : ` · ${j.metric_name || "metric"} ${fmtNum(j.metric)}`;
      row.meta.textContent = `${topology(j)} · ${j.machine || "?"} · ${fmtDuration(j.duration_s)}${metric}${j.note ? ` · ${j.note}` : ""}`;
      row.meta.title = j.note || "";
    }
  }
  for (const el of nav.querySelectorAll(".selected")) el.classList.remove("selected");
  if (selected) nav.querySelector(`[data-job="${selected}"], [data-sweep="${selected}"].sweep-name`)?.classList.add("selected");
}

// -------------------------------------------------------------------------------------- routing, loop

let view = null;
let viewKey;  // undefined until the first route(), which starts the polling

function route() {
  const match = /^#(job|sweep)=([0-9a-f]+)$/.exec(location.hash);
  const key = match ? location.hash : null;
  if (key === viewKey) return;
  view?.destroy();
  viewKey = key;
  const root = document.getElementById("view");
  view = !match ? null : match[1] === "job" ? new JobView(root, match[2]) : new SweepView(root, match[2]);
  if (!view) root.replaceChildren(h("p", { class: "hint", text: "Pick a job, or a sweep to plot its metric against what it sweeps." }));
  tick(true);
}

let timer = null;
let busy = false;

async function tick(now = false) {
  clearTimeout(timer);
  if (busy) { timer = setTimeout(tick, now ? 50 : POLL_MS); return; }
  busy = true;
  try {
    const data = await getJSON("api/jobs");
    renderList(data.sweeps, viewKey ? viewKey.split("=")[1] : null);
    if (view) await view.poll();
    setConn(true, `live · updated ${new Date().toLocaleTimeString()}`);
  } catch (err) {
    if (err.status === 404 && view) {  // a job or sweep that is not (or no longer) under the dirs served
      view.destroy();
      view = null;
      document.getElementById("view").replaceChildren(h("p", { class: "hint", text: "No such job or sweep here." }));
    }
    setConn(err.status === 404, err.status === 404 ? "live" : `offline, retrying (${err.message})`);
  } finally {
    busy = false;
    timer = setTimeout(tick, POLL_MS);
  }
}

window.addEventListener("hashchange", route);
window.addEventListener("resize", () => view?.resize());
route();
