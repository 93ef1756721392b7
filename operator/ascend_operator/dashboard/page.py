"""The dashboard page: one HTML document with no external assets (clusters are often offline). It polls
``/api/jobs`` every 2 s and draws, per job: the pipeline (DatasetPrep -> CheckpointConvert -> AscendTrainJob ->
evaluation -> export) with each part's phase and a link to it, the failure cause, the evaluation results per task,
the goodput and a stacked bar per recovery (its measured parts), and a chart per series the job has, as SVG with axes, ticks and units, every kept point a circle whose title is
its value (and a tooltip on hover), a log scale and smoothing for the losses, and another run's curve on the same
chart. The view's settings live in the URL's fragment (``#log=1&smooth=0.6&compare=ns/a:ns/b``), so a view can be
shared and tested."""

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Ascend Train: jobs</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body { font: 14px system-ui, sans-serif; margin: 20px; background: #f6f7f9; color: #1d2330; }
 h1 { font-size: 20px; margin: 0 0 8px; display: flex; gap: 16px; align-items: baseline; flex-wrap: wrap; }
 #state { color: #6b7280; font-size: 12px; font-weight: normal; }
 .controls { font-size: 13px; color: #4a5263; display: flex; gap: 18px; align-items: center; margin-bottom: 12px; }
 #banner { display: none; background: #fdecec; border: 1px solid #f3b4b4; color: #7a1f1f; border-radius: 6px;
           padding: 8px 12px; margin-bottom: 12px; } #banner.show { display: block; }
 .job { background: #fff; border: 1px solid #dde1e7; border-radius: 8px; padding: 12px 16px; margin-bottom: 14px; }
 .head { display: flex; gap: 12px; align-items: baseline; flex-wrap: wrap; }
 .name { font-weight: 600; font-size: 16px; color: inherit; text-decoration: none; }
 .phase { padding: 1px 8px; border-radius: 10px; font-size: 12px; background: #e4e7ec; }
 .phase.Running, .phase.Evaluating { background: #d4eefc; } .phase.Succeeded { background: #d3f5dc; }
 .phase.Failed { background: #fbd9d9; } .phase.Restarting { background: #fdefc8; }
 .phase.Missing, .phase.NotRun { background: #f1f1f1; color: #8a8f99; }
 .bar { height: 8px; background: #e4e7ec; border-radius: 4px; margin: 8px 0; overflow: hidden; }
 .bar > div { height: 100%; background: #3b82f6; }
 .figures { color: #4a5263; font-size: 13px; }
 .failure { color: #8a2c2c; background: #fdf3f3; border-left: 3px solid #d64545; font-size: 13px; margin: 6px 0;
            padding: 4px 8px; white-space: pre-wrap; font-family: ui-monospace, monospace; }
 .pipeline { display: flex; flex-wrap: wrap; align-items: center; gap: 4px; list-style: none; padding: 0;
             margin: 6px 0; font-size: 12px; }
 .pipeline .node { border: 1px solid #dde1e7; border-radius: 6px; padding: 3px 8px; background: #fafbfc; }
 .pipeline .node a { color: #1d4ed8; text-decoration: none; } .pipeline .kind { color: #6b7280; }
 .pipeline .arrow { color: #9aa1ad; }
 table.evaluation { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
 .tracking { font-size: 12px; color: #4a5263; margin: 4px 0; } .tracking a { color: #1d4ed8; }
 table.evaluation td, table.evaluation th { border-bottom: 1px solid #eceef2; padding: 2px 10px 2px 0;
                                            text-align: left; }
 .charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(340px, 1fr)); gap: 10px; margin-top: 8px; }
 .chart { border: 1px solid #eceef2; border-radius: 6px; padding: 4px 6px; margin: 0; }
 .chart figcaption { font-size: 12px; color: #4a5263; display: flex; justify-content: space-between; gap: 8px; }
 .chart select { font-size: 11px; }
 svg.plot { width: 100%; height: auto; display: block; }
 .axis line, .axis path { stroke: #9aa1ad; stroke-width: 1; } .grid line { stroke: #eef0f3; }
 .axis text { font-size: 10px; fill: #4a5263; } .axis .label { font-size: 10px; fill: #6b7280; }
 path.line { fill: none; stroke: #2563eb; stroke-width: 1.6; } path.raw { fill: none; stroke: #93b4f5;
 stroke-width: 1; opacity: 0.6; } path.compare { stroke: #ea580c; stroke-dasharray: 4 3; }
 circle.pt { fill: #2563eb; r: 1.6; } circle.pt:hover { r: 4; }
 .legend { font-size: 11px; } .legend .mine { color: #2563eb; } .legend .other { color: #ea580c; }
 .empty { color: #9aa1ad; font-size: 12px; }
 .recoveries { font-size: 12px; color: #4a5263; margin: 6px 0; }
 .recovery { display: grid; grid-template-columns: 300px 1fr 70px; gap: 8px; align-items: center; margin: 2px 0; }
 .stack { display: flex; height: 12px; background: #f1f2f5; border-radius: 3px; overflow: hidden; }
 .seg { height: 100%; } .seg.detection { background: #ef4444; } .seg.stopping { background: #f59e0b; }
 .seg.podStart { background: #a855f7; } .seg.rendezvous { background: #3b82f6; }
 .seg.checkpointLoad { background: #14b8a6; } .seg.retrain { background: #64748b; }
 .parts-legend span::before { content: ""; display: inline-block; width: 9px; height: 9px; margin: 0 3px 0 10px;
                              border-radius: 2px; background: var(--c); }
 #tip { position: fixed; pointer-events: none; background: #1d2330; color: #fff; font-size: 12px; padding: 3px 6px;
        border-radius: 4px; display: none; z-index: 5; }
</style></head>
<body data-updates="0">
<h1>Ascend Train jobs <span id="state">loading...</span></h1>
<div class="controls">
 <label><input type="checkbox" id="logscale"> log scale (loss)</label>
 <label>smoothing (loss) <input type="range" id="smoothing" min="0" max="0.99" step="0.01" value="0">
   <span id="smoothing-value">0</span></label>
</div>
<div id="banner" role="alert"></div>
<div id="jobs"></div>
<div id="tip"></div>
<script>
// [series key, title, unit]; losses get the log scale and smoothing.
const CHARTS = [["loss", "loss", ""], ["validationLoss", "validation loss", ""], ["learningRate", "learning rate", ""],
  ["tokensPerSecond", "throughput", "tokens/s"], ["rewardMean", "reward mean", ""], ["accuracy", "accuracy", ""],
  ["rewardAccuracy", "pair accuracy", ""], ["rewardMargin", "reward margin", ""],
  ["stepAccuracy", "step accuracy", ""], ["rewardModelScore", "reward model score", ""],
  ["loadBalancingLoss", "load-balancing loss", ""]];
const LOSSES = new Set(["loss", "validationLoss"]);
const W = 360, H = 190, L = 58, R = 10, T = 8, B = 34;
const view = {log: false, smooth: 0, compare: {}};
let last = null;

function readHash() {
  const h = new URLSearchParams(location.hash.slice(1));
  view.log = h.get("log") === "1"; view.smooth = Math.min(0.99, Math.max(0, Number(h.get("smooth") || 0)));
  view.compare = {};
  for (const pair of (h.get("compare") || "").split(",").filter(Boolean)) {
    const [a, b] = pair.split(":"); if (a && b) view.compare[a] = b;
  }
  document.getElementById("logscale").checked = view.log;
  document.getElementById("smoothing").value = view.smooth;
  document.getElementById("smoothing-value").textContent = view.smooth;
}
function writeHash() {
  const parts = [];
  if (view.log) parts.push("log=1");
  if (view.smooth) parts.push("smooth=" + view.smooth);
  const pairs = Object.entries(view.compare).filter(([, b]) => b).map(([a, b]) => a + ":" + b);
  if (pairs.length) parts.push("compare=" + pairs.join(","));
  history.replaceState(null, "", "#" + parts.join("&"));
}
function fmt(v) {
  if (v === undefined || v === null) return "-";
  const a = Math.abs(v);
  if (a === 0) return "0";
  if (a >= 1e5 || a < 1e-3) return Number(v).toExponential(2).replace(/\.?0+e/, "e").replace("e+", "e");
  if (a >= 100) return String(Math.round(v));
  return String(Number(v.toPrecision(4)));
}
function eta(s) { if (s === undefined || s === null) return "-"; s = Math.max(0, Math.round(s));
  const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60), r = s % 60;
  return (h ? h + "h" : "") + (h || m ? m + "m" : "") + r + "s"; }
function esc(t) { return String(t).replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;",
  "'": "&#39;"})[c]); }
function niceTicks(lo, hi, n) {
  if (!(hi > lo)) { const d = Math.abs(lo) * 0.1 || 1; lo -= d; hi += d; }
  const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  const lo2 = Math.floor(lo / step + 1e-9) * step, hi2 = Math.ceil(hi / step - 1e-9) * step;
  if (out[0] - lo2 > 1e-9 * step) out.unshift(Number(lo2.toPrecision(12)));
  if (hi2 - out[out.length - 1] > 1e-9 * step) out.push(Number(hi2.toPrecision(12)));
  return {lo: lo2, hi: hi2, ticks: out};
}
function logTicks(lo, hi) {  // 1, 2, 5 x 10^k from the last one at or below lo to the first at or above hi
  const all = [];
  for (let e = Math.floor(Math.log10(lo)) - 1; e <= Math.ceil(Math.log10(hi)); e++)
    for (const m of [1, 2, 5]) all.push(Number((m * Math.pow(10, e)).toPrecision(12)));
  const from = all.filter(v => v <= lo).pop() ?? all[0], to = all.find(v => v >= hi) ?? all[all.length - 1];
  const out = all.filter(v => v >= from && v <= to);
  // less than a decade: plain nice ticks, placed on the log axis
  return out.length >= 3 ? out : niceTicks(lo, hi, 4).ticks.filter(v => v > 0);
}
function smoothed(ys, w) {  // TensorBoard's debiased exponential moving average
  let s = 0; return ys.map((y, i) => { s = s * w + (1 - w) * y; return s / (1 - Math.pow(w, i + 1)); });
}
function pathOf(xs, ys, sx, sy) {
  return xs.map((x, i) => (i ? "L" : "M") + sx(x).toFixed(1) + "," + sy(ys[i]).toFixed(1)).join("");
}
function chart(job, key, title, unit, jobsByKey) {
  const pts = job.series.filter(p => typeof p[key] === "number");
  const otherKey = view.compare[job.namespace + "/" + job.name];
  const other = key === "loss" && otherKey && jobsByKey[otherKey] ?
    jobsByKey[otherKey].series.filter(p => typeof p[key] === "number") : [];
  const isLoss = LOSSES.has(key), all = pts.concat(other);
  const xs = all.map(p => p.iteration), ys = all.map(p => p[key]);
  const log = isLoss && view.log && ys.every(y => y > 0);
  let x = niceTicks(Math.min(...xs), Math.max(...xs), 5), yLo = Math.min(...ys), yHi = Math.max(...ys), yTicks;
  if (log) { yTicks = logTicks(yLo, yHi); yLo = Math.min(yLo, yTicks[0]); yHi = Math.max(yHi, yTicks[yTicks.length - 1]);
    if (!(yHi > yLo)) { yLo /= 1.1; yHi *= 1.1; } }
  else { const t = niceTicks(yLo, yHi, 4); yLo = t.lo; yHi = t.hi; yTicks = t.ticks; }
  const f = log ? Math.log10 : (v => v);
  const sx = v => L + (x.hi > x.lo ? (v - x.lo) / (x.hi - x.lo) : 0.5) * (W - L - R);
  const sy = v => H - B - (f(yHi) > f(yLo) ? (f(v) - f(yLo)) / (f(yHi) - f(yLo)) : 0.5) * (H - B - T);
  const mine = pts.map(p => p[key]), its = pts.map(p => p.iteration);
  const smooth = isLoss && view.smooth > 0;
  let lines = smooth ? `<path class="raw" d="${pathOf(its, mine, sx, sy)}"></path>` +
    `<path class="line smoothed" d="${pathOf(its, smoothed(mine, view.smooth), sx, sy)}"></path>` :
    `<path class="line" d="${pathOf(its, mine, sx, sy)}"></path>`;
  if (other.length) {
    const o = other.map(p => p[key]);
    lines += `<path class="line compare" d="${pathOf(other.map(p => p.iteration), smooth ? smoothed(o, view.smooth) : o,
      sx, sy)}"></path>`;
  }
  const dots = pts.map(p => `<circle class="pt" r="1.6" cx="${sx(p.iteration).toFixed(1)}" cy="${sy(p[key]).toFixed(1)}" ` +
    `data-iteration="${p.iteration}" data-value="${p[key]}"><title>iteration ${p.iteration}: ${title} ` +
    `${fmt(p[key])}${unit ? " " + unit : ""}</title></circle>`).join("");
  const xAxis = x.ticks.filter(v => v >= x.lo && v <= x.hi).map(v => `<g class="tick"><line x1="${sx(v)}" x2="${sx(v)}" ` +
    `y1="${H - B}" y2="${H - B + 4}"></line><text x="${sx(v)}" y="${H - B + 14}" text-anchor="middle">${fmt(v)}</text></g>`).join("");
  const yAxis = yTicks.map(v => `<g class="tick"><line x1="${L - 4}" x2="${L}" y1="${sy(v)}" y2="${sy(v)}"></line>` +
    `<text x="${L - 6}" y="${sy(v) + 3}" text-anchor="end">${fmt(v)}</text></g>`).join("");
  const grid = yTicks.map(v => `<line x1="${L}" x2="${W - R}" y1="${sy(v)}" y2="${sy(v)}"></line>`).join("");
  const yLabel = title + (unit ? " (" + unit + ")" : "") + (log ? ", log scale" : "");
  const others = Object.keys(jobsByKey).filter(k => k !== job.namespace + "/" + job.name &&
    jobsByKey[k].series.some(p => typeof p.loss === "number"));
  const cmp = key === "loss" && others.length ? `<select class="compare" data-for="${esc(job.namespace + "/" + job.name)}" ` +
    `title="draw another run's loss on this chart"><option value="">compare with...</option>` +
    others.map(k => `<option value="${esc(k)}"${k === otherKey ? " selected" : ""}>${esc(k)}</option>`).join("") +
    `</select>` : "";
  const legend = other.length ? `<span class="legend"><span class="mine">&#9473; ${esc(job.name)}</span> ` +
    `<span class="other">&#9476; ${esc(otherKey)}</span></span>` : "";
  const lastPt = pts[pts.length - 1];
  return `<figure class="chart" data-series="${key}" data-points="${pts.length}" data-log="${log ? 1 : 0}"` +
    `${other.length ? ` data-compare="${esc(otherKey)}" data-compare-points="${other.length}"` : ""}>` +
    `<figcaption><span>${title}</span>${legend}${cmp}<span>${fmt(lastPt[key])}${unit ? " " + unit : ""} at ` +
    `${lastPt.iteration}</span></figcaption><svg class="plot" viewBox="0 0 ${W} ${H}" data-key="${key}">` +
    `<g class="grid">${grid}</g><g class="axis x"><line x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}"></line>` +
    `${xAxis}<text class="label" x="${(L + W - R) / 2}" y="${H - 4}" text-anchor="middle">iteration</text></g>` +
    `<g class="axis y"><line x1="${L}" x2="${L}" y1="${T}" y2="${H - B}"></line>${yAxis}<text class="label" ` +
    `transform="translate(10 ${(T + H - B) / 2}) rotate(-90)" text-anchor="middle">${esc(yLabel)}</text></g>` +
    `${lines}<g class="points">${dots}</g></svg></figure>`;
}
function pipeline(job) {
  return `<ol class="pipeline">` + job.pipeline.map((n, i) => (i ? `<li class="arrow" aria-hidden="true">&rarr;</li>` : "") +
    `<li class="node" data-kind="${esc(n.kind)}" data-phase="${esc(n.phase)}"><span class="kind">${esc(n.kind)}</span> ` +
    `<a href="${esc(n.link)}">${esc(n.name)}</a> <span class="phase ${esc(n.phase)}">${esc(n.phase)}</span></li>`).join("") +
    `</ol>`;
}
function score(t) {
  if (t.accuracy !== undefined && t.accuracy !== null) return `${(100 * t.accuracy).toFixed(1)}%`;
  if (t.metric && t.metrics && t.metrics[t.metric] !== undefined)
    return `${esc(t.metric.split(",")[0])} ${Number(t.metrics[t.metric]).toPrecision(4)}`;
  return "-";
}
function evaluation(e) {
  if (!e || !(e.tasks || []).length) return "";
  return `<table class="evaluation"><tr><th>task</th><th>accuracy</th><th>samples</th><th>time</th></tr>` +
    e.tasks.map(t => `<tr data-task="${esc(t.task)}"><td>${esc(t.task)}</td><td>${score(t)}</td>` +
      `<td>${t.samples}</td><td>${t.seconds === undefined || t.seconds === null ? "-" : eta(t.seconds)}</td></tr>`).join("") +
    `</table>`;
}
const PARTS = [["detection", "detection", "#ef4444"], ["stopping", "stopping", "#f59e0b"],
  ["podStart", "pod start", "#a855f7"], ["rendezvous", "rendezvous", "#3b82f6"],
  ["checkpointLoad", "checkpoint load", "#14b8a6"], ["retrain", "steps again", "#64748b"]];
function recoveries(j) {  // goodput, then one stacked bar per recovery: its parts in seconds, on one scale
  const rs = j.recoveries || [], g = j.goodput;
  if (!rs.length && !(g && g.goodput !== undefined && g.goodput !== null)) return "";
  const total = r => PARTS.reduce((s, [k]) => s + (r.seconds[k] || 0), 0);
  const longest = Math.max(1e-9, ...rs.map(total));
  const head = g && g.goodput !== undefined && g.goodput !== null ?
    `<div class="goodput" data-goodput="${g.goodput}">goodput ${(100 * g.goodput).toFixed(1)}%: productive ` +
    `${eta(g.productiveSeconds)} of ${eta(g.wallSeconds)}, recoveries ${eta(g.recoverySeconds)}, other ` +
    `${eta(g.otherSeconds)}</div>` : "";
  const rows = rs.map(r => `<div class="recovery" data-level="${esc(r.level)}"><span>${esc(r.level)} &middot; ` +
    `${esc(r.reason)}${r.lostIterations !== undefined && r.lostIterations !== null ? ` &middot; ${r.lostIterations} steps again` : ""}` +
    `</span><div class="stack">` + PARTS.filter(([k]) => r.seconds[k]).map(([k, label]) =>
      `<div class="seg ${k}" data-part="${k}" style="width:${(100 * r.seconds[k] / longest).toFixed(2)}%" ` +
      `title="${label} ${r.seconds[k].toFixed(1)} s"></div>`).join("") +
    `</div><span>${(r.totalSeconds ?? total(r)).toFixed(1)} s</span></div>`).join("");
  const legend = rs.length ? `<div class="parts-legend">${PARTS.map(([, label, c]) =>
    `<span style="--c:${c}">${label}</span>`).join("")}</div>` : "";
  return `<div class="recoveries">${head}${rows}${legend}</div>`;
}
function tracking(j) {  // where the experiment trackers keep the run: a link where it is online
  const ts = j.tracking || [];
  if (!ts.length) return "";
  return `<div class="tracking">tracked in ` + ts.map(t => {
    const online = /^https?:\/\//.test(t.url || "");
    return `<span data-tracker="${esc(t.tracker)}">${esc(t.tracker)} ` + (online ?
      `<a href="${esc(t.url)}" target="_blank" rel="noopener">run ${esc(t.runId)}</a>` :
      `run ${esc(t.runId)}${t.location ? ` (${esc(t.location)})` : ""}`) + `</span>`;
  }).join(" &middot; ") + `</div>`;
}
function render(data) {
  const jobsByKey = Object.fromEntries(data.jobs.map(j => [j.namespace + "/" + j.name, j]));
  const html = data.jobs.map(j => {
    const p = j.progress, pct = Math.max(0, Math.min(100, p.percent || 0));
    const charts = CHARTS.filter(([k]) => j.series.some(pt => typeof pt[k] === "number"));
    return `<section class="job" data-job="${esc(j.namespace)}/${esc(j.name)}"><div class="head">` +
      `<a class="name" href="${esc(j.link)}">${esc(j.name)}</a>` +
      `<span class="phase ${esc(j.phase)}" data-phase="${esc(j.phase)}">${esc(j.phase)}</span>` +
      `<span class="figures">${esc(j.namespace)} &middot; iteration ${p.iteration ?? "-"}/${p.trainIters ?? "-"}` +
      ` &middot; ${pct.toFixed(1)}% &middot; ETA ${eta(p.etaSeconds)} &middot; loss ${fmt(p.loss)}` +
      ` &middot; ${fmt(p.tokensPerSecond)} tokens/s &middot; restarts ${j.restarts}</span></div>` +
      `<div class="bar"><div style="width:${pct}%"></div></div>` + pipeline(j) +
      (j.phase === "Failed" && j.message ? `<div class="failure">${esc(j.message)}</div>` : "") +
      tracking(j) + evaluation(j.evaluation) + recoveries(j) +
      (charts.length ? `<div class="charts">${charts.map(([k, t, u]) => chart(j, k, t, u, jobsByKey)).join("")}</div>`
        : `<p class="empty">no logged points yet</p>`) + `</section>`;
  }).join("");
  document.getElementById("jobs").innerHTML = html || '<p class="empty">no AscendTrainJobs yet</p>';
}
function redraw() { if (last) render(last); }
async function tick() {
  const banner = document.getElementById("banner");
  try {
    const r = await fetch("/api/jobs", {cache: "no-store"});
    const data = await r.json();
    if (!r.ok) throw Object.assign(new Error(data.error || "HTTP " + r.status), {detail: data.detail});
    const text = JSON.stringify(data);
    if (!last || text !== JSON.stringify(last)) { last = data; render(data); }
    banner.className = ""; banner.textContent = "";
    document.body.dataset.updates = String(Number(document.body.dataset.updates) + 1);
    document.getElementById("state").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    banner.className = "show"; banner.textContent = e.message.startsWith("Failed to fetch") || e instanceof TypeError
      ? "The dashboard server does not answer (stopped?); retrying every 2 s." : e.message;
    if (e.detail) banner.title = e.detail;
    document.getElementById("state").textContent = last ? "showing the last data received" : "";
  }
}
document.getElementById("logscale").addEventListener("change", e => { view.log = e.target.checked; writeHash(); redraw(); });
document.getElementById("smoothing").addEventListener("input", e => { view.smooth = Number(e.target.value);
  document.getElementById("smoothing-value").textContent = view.smooth; writeHash(); redraw(); });
document.addEventListener("change", e => { if (e.target.matches("select.compare")) {
  view.compare[e.target.dataset.for] = e.target.value; writeHash(); redraw(); } });
document.addEventListener("mousemove", e => {
  const tip = document.getElementById("tip"), svg = e.target.closest && e.target.closest("svg.plot");
  if (!svg) { tip.style.display = "none"; return; }
  const box = svg.getBoundingClientRect(), x = (e.clientX - box.left) * W / box.width;
  let best = null;
  for (const c of svg.querySelectorAll("circle.pt"))
    if (!best || Math.abs(c.cx.baseVal.value - x) < Math.abs(best.cx.baseVal.value - x)) best = c;
  if (!best) return;
  tip.textContent = best.querySelector("title").textContent;
  tip.style.left = (e.clientX + 12) + "px"; tip.style.top = (e.clientY + 12) + "px"; tip.style.display = "block";
});
window.addEventListener("hashchange", () => { readHash(); redraw(); });
readHash(); tick(); setInterval(tick, 2000);
</script></body></html>
"""
