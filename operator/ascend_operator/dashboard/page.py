"""The dashboard page: one HTML document, no external assets (clusters are often offline); it polls
``/api/jobs`` every 2 s and draws each job's curves as SVG."""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Ascend Train: jobs</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body { font: 14px system-ui, sans-serif; margin: 20px; background: #f6f7f9; color: #1d2330; }
 h1 { font-size: 20px; margin: 0 0 12px; }
 .job { background: #fff; border: 1px solid #dde1e7; border-radius: 8px; padding: 12px 16px; margin-bottom: 14px; }
 .head { display: flex; gap: 12px; align-items: baseline; flex-wrap: wrap; }
 .name { font-weight: 600; font-size: 16px; }
 .phase { padding: 1px 8px; border-radius: 10px; font-size: 12px; background: #e4e7ec; }
 .phase.Running { background: #d4eefc; } .phase.Succeeded { background: #d3f5dc; }
 .phase.Failed { background: #fbd9d9; } .phase.Restarting { background: #fdefc8; }
 .bar { height: 8px; background: #e4e7ec; border-radius: 4px; margin: 8px 0; overflow: hidden; }
 .bar > div { height: 100%; background: #3b82f6; }
 .figures { color: #4a5263; font-size: 13px; } .message { color: #8a2c2c; font-size: 12px; margin-top: 4px; }
 .charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(240px, 1fr)); gap: 10px; margin-top: 8px; }
 .chart { border: 1px solid #eceef2; border-radius: 6px; padding: 4px 6px; }
 .chart .title { font-size: 12px; color: #4a5263; display: flex; justify-content: space-between; }
 svg { width: 100%; height: 110px; } polyline { fill: none; stroke: #3b82f6; stroke-width: 1.5; }
 .empty { color: #9aa1ad; font-size: 12px; }
 #state { color: #6b7280; font-size: 12px; }
</style></head>
<body data-updates="0">
<h1>Ascend Train jobs <span id="state">loading...</span></h1>
<div id="jobs"></div>
<script>
const CHARTS = [["loss", "loss"], ["validationLoss", "validation loss"], ["learningRate", "learning rate"],
                ["tokensPerSecond", "tokens/s"]];
// drawn only for the jobs whose stage reports them (GRPO, DPO/SimPO, PRM, MoE)
const STAGE_CHARTS = [["rewardMean", "reward mean"], ["accuracy", "accuracy"], ["rewardAccuracy", "pair accuracy"],
                      ["rewardMargin", "reward margin"], ["stepAccuracy", "step accuracy"],
                      ["rewardModelScore", "reward model score"], ["loadBalancingLoss", "load-balancing loss"]];
function fmt(v) { return v === undefined || v === null ? "-" : (Math.abs(v) >= 1000 || Math.abs(v) < 0.01) && v !== 0
  ? Number(v).toPrecision(3) : String(Math.round(v * 1000) / 1000); }
function eta(s) { if (s === undefined || s === null) return "-"; s = Math.max(0, Math.round(s));
  const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60), r = s % 60;
  return (h ? h + "h" : "") + (h || m ? m + "m" : "") + r + "s"; }
function esc(t) { return String(t).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"})[c]); }
function chart(series, key, title) {
  const pts = series.filter(p => p[key] !== undefined && p[key] !== null);
  const last = pts.length ? fmt(pts[pts.length - 1][key]) : "";
  if (!pts.length) return `<div class="chart" data-series="${key}" data-points="0"><div class="title">${title}</div>` +
    `<div class="empty">no points yet</div></div>`;
  const xs = pts.map(p => p.iteration), ys = pts.map(p => p[key]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const sx = x => 4 + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * 292, sy = y => 104 - (y1 > y0 ? (y - y0) / (y1 - y0) : 0.5) * 98;
  const line = pts.map(p => sx(p.iteration).toFixed(1) + "," + sy(p[key]).toFixed(1)).join(" ");
  return `<div class="chart" data-series="${key}" data-points="${pts.length}"><div class="title"><span>${title}</span>` +
    `<span>${last} @ ${xs[xs.length - 1]}</span></div><svg viewBox="0 0 300 110" preserveAspectRatio="none">` +
    `<polyline points="${line}"></polyline></svg></div>`;
}
function render(data) {
  const html = data.jobs.map(j => {
    const p = j.progress, pct = Math.max(0, Math.min(100, p.percent || 0));
    return `<div class="job" data-job="${esc(j.namespace)}/${esc(j.name)}"><div class="head">` +
      `<span class="name">${esc(j.name)}</span><span class="phase ${esc(j.phase)}">${esc(j.phase)}</span>` +
      `<span class="figures">${esc(j.namespace)} &middot; iteration ${p.iteration ?? "-"}/${p.trainIters ?? "-"}` +
      ` &middot; ${pct.toFixed(1)}% &middot; ETA ${eta(p.etaSeconds)} &middot; loss ${fmt(p.loss)}` +
      ` &middot; ${fmt(p.tokensPerSecond)} tok/s &middot; restarts ${j.restarts}</span></div>` +
      `<div class="bar"><div style="width:${pct}%"></div></div>` +
      (j.phase === "Failed" && j.message ? `<div class="message">${esc(j.message)}</div>` : "") +
      `<div class="charts">${CHARTS.concat(STAGE_CHARTS.filter(([k]) => j.series.some(p => p[k] !== undefined)))
        .map(([k, t]) => chart(j.series, k, t)).join("")}</div></div>`;
  }).join("");
  document.getElementById("jobs").innerHTML = html || '<p class="empty">no AscendTrainJobs yet</p>';
}
async function tick() {
  try {
    const r = await fetch("/api/jobs", {cache: "no-store"});
    const data = await r.json();
    if (!r.ok) throw new Error(data.error || r.status);
    render(data);
    document.body.dataset.updates = String(Number(document.body.dataset.updates) + 1);
    document.getElementById("state").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) { document.getElementById("state").textContent = "cannot reach the cluster: " + e.message; }
}
tick(); setInterval(tick, 2000);
</script></body></html>
"""
