// The dashboard's one script: reads the page's data (a JSON block, never code) and draws it with Plotly.
"use strict";

const COLOURS = {
  "regression": "#c62828", "failed": "#6a1b9a", "infra": "#757575", "unconfirmed": "#ef6c00",
  "drift": "#f9a825", "inconclusive": "#8d6e63", "not compared": "#9e9e9e", "improvement": "#2e7d32",
  "new": "#90caf9", "ok": "#a5d6a7",
};
const MARKED = ["regression", "improvement", "drift", "unconfirmed", "inconclusive"];
const CONFIG = {displaylogo: false, responsive: true};

function pageData() {
  return JSON.parse(document.getElementById("page-data").textContent);
}

// Plotly reads HTML in its text (<b>, <br>, <a href>): text from a model, a board or a history is given as text,
// its markup characters as entities, which Plotly shows as they are.
function plain(value) {
  return String(value).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

function plot(id, traces, layout) {
  const element = document.getElementById(id);
  if (element) {
    Plotly.newPlot(element, traces, Object.assign({margin: {t: 30, r: 20}, hovermode: "closest"}, layout), CONFIG);
  }
}

function trend(data) {
  const nights = data.points.map((p) => p.night);
  const shapes = [];
  const annotations = [];
  if (data.baseline) {
    shapes.push({type: "rect", xref: "x", yref: "paper", x0: data.baseline.first, x1: data.baseline.last, y0: 0, y1: 1,
      fillcolor: "#1565c0", opacity: 0.08, line: {width: 0}, layer: "below"});
  }
  for (const p of data.points.filter((p) => p.new_program)) {
    shapes.push({type: "line", xref: "x", yref: "paper", x0: p.night, x1: p.night, y0: 0, y1: 1,
      line: {dash: "dot", color: "#455a64"}});
    annotations.push({x: p.night, y: 1, xref: "x", yref: "paper", text: "new .pte " + (p.pte_sha256 || "").slice(0, 8),
      showarrow: false, yanchor: "bottom", font: {size: 10}});
  }
  // One trace per verdict that marks a night, so the legend names every marker; the dotted program lines and the
  // shaded baseline window get legend entries too (drawn as shapes, named by empty traces).
  const verdictTraces = MARKED.filter((v) => data.points.some((p) => p.verdict === v)).map((v) => {
    const marked = data.points.filter((p) => p.verdict === v);
    return {name: v, x: marked.map((p) => p.night), y: marked.map((p) => p.median_ms), mode: "markers", type: "scatter",
      text: marked.map((p) => p.verdict), hovertemplate: "%{x}: %{text}, %{y:.3f} ms<extra></extra>",
      marker: {size: 14, symbol: "diamond-open", line: {width: 3}, color: COLOURS[v]}};
  });
  const keys = [];
  if (data.points.some((p) => p.new_program)) {
    keys.push({name: "new program (.pte)", x: [null], y: [null], mode: "lines", type: "scatter",
      line: {dash: "dot", color: "#455a64"}, hoverinfo: "skip"});
  }
  if (data.baseline) {
    keys.push({name: "baseline window", x: [null], y: [null], mode: "markers", type: "scatter", hoverinfo: "skip",
      marker: {symbol: "square", size: 14, color: "rgba(21, 101, 192, 0.15)"}});
  }
  const medians = data.points.map((p) => p.median_ms);
  const traces = [
    {name: "median", x: nights, y: medians, mode: "lines+markers", type: "scatter",
      hovertemplate: "%{x}: %{y:.4f} ms<extra></extra>"},
    {name: "p90", x: nights, y: data.points.map((p) => p.p90_ms), mode: "lines", type: "scatter",
      line: {dash: "dash"}},
    ...verdictTraces, ...keys,
  ];
  const topOf = (values) => {
    const known = values.filter((v) => typeof v === "number");
    return known.length ? Math.max(...known) * 1.15 : 1;
  };
  // Honest axes: both from zero (a 0.04 MB change of 22.7 MB is 0.2 %, and looks it).
  plot("trend-latency", traces, {title: {text: "latency per night"}, showlegend: true,
    yaxis: {title: {text: "ms"}, range: [0, topOf(data.points.map((p) => p.p90_ms).concat(medians))]},
    xaxis: {type: "category"}, shapes: shapes, annotations: annotations});
  const peaks = data.points.map((p) => p.peak_mb);
  plot("trend-memory", [{name: "peak RSS", x: nights, y: peaks, type: "scatter", mode: "lines+markers",
    hovertemplate: "%{x}: %{y:.3f} MB<extra></extra>"}], {title: {text: "peak memory per night"}, showlegend: true,
    yaxis: {title: {text: "MB"}, range: [0, topOf(peaks)]},
    xaxis: {type: "category"}, shapes: shapes.filter((s) => s.type === "rect")});
  // A language model's cell: its decode speed, the figure its median (one whole generation) stands in for.
  plot("trend-decode", [{name: "decode tokens/s", x: nights, y: data.points.map((p) => p.decode_tokens_per_s),
    type: "scatter", mode: "lines+markers"}], {title: {text: "decode speed per night"},
    yaxis: {title: {text: "tokens/s"}, rangemode: "tozero"}, xaxis: {type: "category"}, shapes: shapes});
  // Energy and the decode's share of the memory roofline: a night that did not measure them is null, a gap.
  const energy = data.points.map((p) => (data.generates ? p.mj_per_token : p.joules_per_inference));
  const unit = data.generates ? "mJ per token" : "J per inference";
  plot("trend-energy", [{name: "energy", x: nights, y: energy, type: "scatter", mode: "lines+markers",
    hovertemplate: "%{x}: %{y:.3g} " + unit + "<extra></extra>"}], {title: {text: "energy per night"},
    showlegend: true, yaxis: {title: {text: unit}, range: [0, topOf(energy)]}, xaxis: {type: "category"},
    shapes: shapes.filter((s) => s.type === "rect")});
  const shares = data.points.map((p) => (typeof p.roofline_share === "number" ? p.roofline_share * 100 : null));
  plot("trend-roofline", [{name: "decode share of the roofline", x: nights, y: shares, type: "scatter",
    mode: "lines+markers", hovertemplate: "%{x}: %{y:.0f} %<extra></extra>"}],
    {title: {text: "decode share of the memory roofline per night"}, showlegend: true,
    yaxis: {title: {text: "%"}, range: [0, topOf(shares)]}, xaxis: {type: "category"},
    shapes: shapes.filter((s) => s.type === "rect")});
}

function run(data) {
  // Every iteration in order, one bar each, the warm-up first and marked; the y-range is the timed iterations' (a
  // slow warm-up is cut at the top, its value written on it), so no one iteration squashes the others.
  const warm = data.warmup_ms || [];
  const timed = data.iterations_ms || [];
  const top = timed.length ? Math.max(...timed) * 1.15 : undefined;
  plot("run-latency", [
    {name: "timed iterations", type: "bar", x: timed.map((_, i) => warm.length + i + 1), y: timed,
      marker: {color: "#1565c0"}, hovertemplate: "iteration %{x}: %{y:.4f} ms<extra></extra>"},
    {name: "warm-up (not timed)", type: "bar", x: warm.map((_, i) => i + 1), y: warm, marker: {color: "#ef6c00"},
      text: warm.map((v) => (top !== undefined && v > top ? v.toFixed(3) + " ms" : "")), textposition: "inside",
      hovertemplate: "warm-up %{x}: %{y:.4f} ms<extra></extra>"},
  ], {title: {text: "every iteration, in order"}, bargap: 0.05, xaxis: {title: {text: "iteration"}},
    yaxis: {title: {text: "ms"}, range: top !== undefined ? [0, top] : undefined, rangemode: "tozero"},
    legend: {orientation: "h", y: -0.25}});
  plot("run-distribution", [{name: "timed iterations", type: "histogram", x: timed, marker: {color: "#1565c0"}}],
    {title: {text: "timed iterations: distribution"}, xaxis: {title: {text: "ms"}},
      yaxis: {title: {text: "iterations"}}, bargap: 0.05});
  if (data.operators && data.operators.length) {
    const ops = data.operators.slice().reverse();
    plot("run-operators", [{type: "bar", orientation: "h", x: ops.map((o) => o.share), y: ops.map((o) => plain(o.node_id)),
      text: ops.map((o) => plain(o.op)), hovertemplate: "%{y} %{text}: %{x:.1f} %<extra></extra>"}],
      {title: {text: "share of the method (%)"}, margin: {l: 160, t: 30}});
  }
  if (data.modules && data.modules.length) {
    // A treemap of the module tree: each module's own time, its submodules' added by Plotly (exact: no rounding
    // can make children outweigh their parent).
    const mods = data.modules;
    plot("run-modules", [{type: "treemap", branchvalues: "remainder", ids: mods.map((m) => m.module),
      parents: mods.map((m) => m.parent), labels: mods.map((m) => plain(m.name)), values: mods.map((m) => m.self_ms),
      customdata: mods.map((m) => [plain(m.module), m.total_ms, m.share]), maxdepth: 5,
      texttemplate: "%{label}<br>%{customdata[1]:.3f} ms (%{customdata[2]:.1f} %)",
      hovertemplate: "%{customdata[0]}<br>%{customdata[1]:.3f} ms, %{customdata[2]:.1f} % of the measured time<extra></extra>"}],
      {title: {text: "time by module"}, margin: {l: 10, r: 10, t: 30, b: 10}, height: 520});
  }
  if (data.memory && data.memory.phases.length) {
    const phases = data.memory.phases;
    const traces = [{name: "peak RSS", type: "bar", x: phases.map((p) => p.phase),
      y: phases.map((p) => (p.peak_rss_bytes || 0) / 1e6)}];
    const layout = {title: {text: "memory per phase (MB)"}};
    if (data.memory.planned_bytes) {
      layout.shapes = [{type: "line", xref: "paper", x0: 0, x1: 1, y0: data.memory.planned_bytes / 1e6,
        y1: data.memory.planned_bytes / 1e6, line: {dash: "dot", color: "#c62828"}}];
      layout.annotations = [{xref: "paper", x: 1, y: data.memory.planned_bytes / 1e6, text: "planned arenas",
        showarrow: false, xanchor: "right", yanchor: "bottom"}];
    }
    plot("run-memory", traces, layout);
  }
}

// The operators whose medians moved most, one horizontal bar each, sorted (the largest change on top), each named on
// the axis by its operator, its module and where it runs (`#N`: XNNPACK node N of that delegate call); coloured by
// what `fab compare` says of it. The axis is a list of categories: node ids such as "12" would otherwise make it a
// number line, their bars stacked on it.
const COMPARE_BARS = 25;
const CHANGE_KINDS = [
  {name: "slower (its own test, at least the floor)", colour: "#c62828", test: (o) => o.changed && o.delta_ms > 0},
  {name: "faster (its own test, at least the floor)", colour: "#1565c0", test: (o) => o.changed && o.delta_ms < 0},
  {name: "not changed (within noise, under the floor, or not tested)", colour: "#b0bec5", test: (o) => !o.changed},
];

function compareLabel(o) {
  return plain(`${o.op || "?"} · ${o.module || "no module"} · ${o.where}`);
}

function compare(data) {
  // A delegate call whose XNNPACK nodes are compared is shown by them (its own bar would count them twice).
  const byNodes = new Set((data.ops || []).filter((o) => o.graph).map((o) => o.graph.split("::").pop()));
  const timed = (data.ops || []).filter((o) => typeof o.delta_ms === "number" && (o.graph || !byNodes.has(o.node_id)));
  const moved = timed.filter((o) => o.delta_ms !== 0);  // the unmoved only when nothing moved (a run against itself)
  const ops = (moved.length ? moved : timed).sort((x, y) => Math.abs(y.delta_ms) - Math.abs(x.delta_ms))
    .slice(0, COMPARE_BARS).reverse();
  if (!ops.length) return;
  const traces = CHANGE_KINDS.map((kind) => {
    const shown = ops.filter(kind.test);
    return {name: kind.name, type: "bar", orientation: "h", x: shown.map((o) => o.delta_ms), y: shown.map(compareLabel),
      marker: {color: kind.colour}, customdata: shown.map((o) => [o.median_a_ms, o.median_b_ms]),
      hovertemplate: "%{y}<br>A %{customdata[0]:.4f} ms → B %{customdata[1]:.4f} ms: %{x:+.4f} ms<extra></extra>"};
  }).filter((trace) => trace.x.length);
  const element = document.getElementById("compare-ops");
  if (element) element.style.height = `${Math.max(300, 28 * ops.length + 140)}px`;
  const title = `Δ median per operator, B − A: the ${ops.length} largest changes (a delegate call by its nodes)`;
  plot("compare-ops", traces, {title: {text: title},
    barmode: "overlay", showlegend: true, legend: {orientation: "h", y: -0.12},
    xaxis: {title: {text: "Δ median (ms)"}, zeroline: true, zerolinewidth: 2, zerolinecolor: "#455a64"},
    yaxis: {type: "category", categoryorder: "array", categoryarray: ops.map(compareLabel), automargin: true,
      tickfont: {size: 11}},
    margin: {t: 40, r: 20, l: 10}});
}

// Filters: each `.filters` block's selects and date inputs hide the elements its `data-targets` selector names whose
// data-<field> does not match (a select's empty value: any; a date input: from or to that day).
function applyFilters(block) {
  const filters = Array.from(block.querySelectorAll(".filter"));
  const targets = Array.from(document.querySelectorAll(block.dataset.targets));
  for (const target of targets) {
    target.hidden = !filters.every((f) => {
      const value = target.dataset[f.dataset.field] || "";
      if (!f.value) return true;
      if (f.dataset.op === "from") return value >= f.value;
      if (f.dataset.op === "to") return value <= f.value;
      return value === f.value;
    });
  }
  // A picker whose chosen run is hidden picks the first shown one, the two sides kept apart when they can be.
  const selects = Array.from(new Set(targets.map((t) => t.parentElement).filter((p) => p.tagName === "SELECT")));
  for (const select of selects) {
    const chosen = select.selectedOptions[0];
    if (chosen && chosen.hidden) {
      const taken = selects.filter((other) => other !== select).map((other) => other.value);
      const shown = Array.from(select.options).filter((o) => !o.hidden);
      const pick = shown.find((o) => !taken.includes(o.value)) || shown[0];
      if (pick) select.value = pick.value;
    }
  }
}

function filters() {
  for (const block of document.querySelectorAll(".filters")) {
    for (const f of block.querySelectorAll(".filter")) {
      f.addEventListener("change", () => applyFilters(block));
      f.addEventListener("input", () => applyFilters(block));
    }
  }
}

const DRAW = {trend: trend, run: run, compare: compare};

document.addEventListener("DOMContentLoaded", () => {
  filters();
  const draw = DRAW[document.body.dataset.page];
  if (draw) {
    draw(pageData());
  }
});
