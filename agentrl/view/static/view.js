// agentrl view: the curves (uPlot), the metric picker and the live refresh; everything else
// is server-rendered.
"use strict";
(function () {
  const COLORS = ["#2457b5", "#c0392b", "#1f8a4c", "#b9770e", "#7d3c98", "#117a8b"];
  const STEP_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000];

  // as many decimals as the tick spacing has: 0.25 apart -> 2, so no two labels read alike
  function decimalsOf(incr) {
    const s = String(+incr.toPrecision(6));
    if (s.includes("e-")) {
      const [m, e] = s.split("e-");
      return parseInt(e, 10) + ((m.split(".")[1] || "").length);
    }
    return (s.split(".")[1] || "").length;
  }
  function tickLabels(splits, incr) {
    const d = Math.min(decimalsOf(incr || 1), 10);
    return splits.map((v) => (v == null ? "" : Math.abs(v) >= 1e5 ? v.toExponential(2) : v.toFixed(d)));
  }
  // auto axes: the data's own range, a flat series padded around its value (never 0-100)
  function autoRange(u, min, max) {
    if (min == null || max == null) return [0, 1];
    if (min === max) {
      const pad = Math.abs(min) * 0.1 || 0.5;
      return [min - pad, max + pad];
    }
    const pad = (max - min) * 0.06;
    return [min - pad, max + pad];
  }
  function ema(values, alpha) {
    if (!alpha) return values;
    let s = null;
    return values.map((v) => (v == null ? null : (s = s == null ? v : alpha * s + (1 - alpha) * v)));
  }

  function drawCharts(box) {
    const runs = JSON.parse(box.dataset.runs);
    const headline = box.dataset.headline ? JSON.parse(box.dataset.headline) : null;
    const follow = box.dataset.follow === "1";
    const labels = box.dataset.labels ? JSON.parse(box.dataset.labels) : {};
    const picker = document.getElementById("picker");
    const url = new URL(window.location.href);
    let chosen = url.searchParams.getAll("m");
    if (!chosen.length) chosen = JSON.parse(box.dataset.defaults || "[]");
    let alpha = parseFloat(url.searchParams.get("ema") || "0") || 0;
    const cells = {};
    let data = null;
    let lastVersion = null;

    async function load() {
      const q = runs.map((r) => "run=" + encodeURIComponent(r)).join("&");
      const resp = await fetch("/api/metrics?" + q);
      if (!resp.ok) return;
      const got = await resp.json();
      const version = JSON.stringify(Object.values(got).map((d) => d.version));
      if (version === lastVersion) return;
      lastVersion = version;
      data = got;
      renderAll();
      if (picker) buildPicker();
    }

    function renderAll() {
      if (headline) renderLines("headline", "reward", headline, true);
      for (const key of chosen) {
        if (key.startsWith("dist:")) renderDist(key);
        else renderLines(key, labels[key] || key, [[key, key]], false);
      }
      for (const key of Object.keys(cells)) {
        if (key !== "headline" && !chosen.includes(key)) {
          if (cells[key].plot) cells[key].plot.destroy();
          cells[key].div.remove();
          delete cells[key];
        }
      }
    }

    function cell(key, label) {
      if (cells[key]) return cells[key];
      const div = document.createElement("div");
      div.className = "chart" + (key === "headline" ? " headline" : "");
      div.dataset.metric = key;
      div.innerHTML = "<h4></h4><div class='plot'></div>";
      div.querySelector("h4").textContent = label;
      box.appendChild(div);
      return (cells[key] = { div, plot: null, shape: "" });
    }

    function steps() {
      const all = new Set();
      for (const d of Object.values(data)) (d.series.step || []).forEach((s) => all.add(s));
      return Array.from(all).sort((a, b) => a - b);
    }

    function column(d, key, xs) {
      const at = new Map();
      (d.series.step || []).forEach((s, j) => at.set(s, (d.series[key] || [])[j] ?? null));
      return xs.map((s) => (at.has(s) ? at.get(s) : null));
    }

    // one chart of line series: each (metric, label) of `lines` for each run overlaid
    function renderLines(key, title, lines, isHeadline) {
      const c = cell(key, title);
      const xs = steps();
      const ys = [], series = [{ label: "step" }], raw = {};
      let i = 0;
      for (const [name, d] of Object.entries(data)) {
        for (const [metric, label] of lines) {
          const options = Array.isArray(metric) ? metric : [metric];
          const found = options.find((m) => (d.series[m] || []).some((v) => v != null));
          const col = found ? column(d, found, xs) : xs.map(() => null);
          const tag = runs.length > 1 ? `${label} · ${name}` : label;
          raw[tag] = col;
          ys.push(ema(col, alpha));
          series.push({ label: tag, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true, points: { size: 5 } });
          i++;
        }
      }
      const any = ys.some((col) => col.some((v) => v != null));
      c.div.dataset.values = JSON.stringify(raw);
      c.div.dataset.drawn = JSON.stringify(ys);  // what the lines show (smoothed when asked)
      draw(c, key, xs, ys, series, any, isHeadline || runs.length > 1, []);
    }

    // quantile bands (min-max, p25-p75) and the median of a per-step distribution
    function renderDist(key) {
      const name = key.slice(5);
      const first = Object.values(data)[0];
      const c = cell(key, `${name} per sample: median, 25-75% and min-max over the step's samples`);
      const xs = first.series.step || [];
      const q = (first.dists && first.dists[name]) || [];
      const ys = [0, 1, 2, 3, 4].map((j) => q.map((row) => (row ? row[j] : null)));
      const col = COLORS[0];
      const series = [{ label: "step" },
        { label: "min", stroke: "#9bb0d8", width: 1 }, { label: "p25", stroke: "#6f8fcf", width: 1 },
        { label: "median", stroke: col, width: 2, points: { size: 5 } },
        { label: "p75", stroke: "#6f8fcf", width: 1 }, { label: "max", stroke: "#9bb0d8", width: 1 }];
      const bands = [{ series: [5, 1], fill: "rgba(36,87,181,0.08)" }, { series: [4, 2], fill: "rgba(36,87,181,0.18)" }];
      c.div.dataset.values = JSON.stringify({ median: ys[2] });
      draw(c, key, xs, ys, series, ys[2].some((v) => v != null), true, bands);
    }

    function draw(c, key, xs, ys, series, any, legend, bands) {
      const holder = c.div.querySelector(".plot");
      if (!any) {
        holder.innerHTML = "<div class='empty'>not recorded in this run</div>";
        if (c.plot) { c.plot.destroy(); c.plot = null; }
        return;
      }
      const shape = JSON.stringify(series.map((s) => s.label)) + alpha;
      if (c.plot && c.shape === shape) { c.plot.setData([xs, ...ys]); return; }
      if (c.plot) c.plot.destroy();
      holder.innerHTML = "";
      c.shape = shape;
      c.plot = new uPlot({
        width: Math.max(300, c.div.clientWidth - 12), height: key === "headline" ? 230 : 170,
        series, bands, legend: { show: legend },
        scales: { x: { time: false }, y: { range: autoRange } },
        axes: [{ incrs: STEP_INCRS }, {
          size: 56,
          values: (u, splits, ax, space, incr) => {
            const labels = tickLabels(splits, incr);
            c.div.dataset.yticks = JSON.stringify(labels);
            return labels;
          },
        }],
      }, [xs, ...ys], holder);
    }

    function setUrl() {
      const u = new URL(window.location.href);
      u.searchParams.delete("m");
      chosen.forEach((m) => u.searchParams.append("m", m));
      if (alpha) u.searchParams.set("ema", String(alpha)); else u.searchParams.delete("ema");
      history.replaceState(null, "", u.toString());
    }

    // every numeric metric of the runs, grouped by the prefix before its first "/"
    function buildPicker() {
      const list = picker.querySelector("#metric-list");
      const keys = new Set();
      for (const d of Object.values(data)) d.keys.forEach((k) => keys.add(k));
      const all = ["dist:reward", "dist:length", ...Array.from(keys).sort()];
      const groups = {};
      for (const k of all) {
        const prefix = k.startsWith("dist:") ? "distributions" : k.includes("/") ? k.split("/")[0] : "(no prefix)";
        (groups[prefix] = groups[prefix] || []).push(k);
      }
      const open = new Set(Array.from(list.querySelectorAll("details[open]")).map((d) => d.dataset.prefix));
      list.innerHTML = "";
      for (const [prefix, names] of Object.entries(groups)) {
        const det = document.createElement("details");
        det.dataset.prefix = prefix;
        if (open.has(prefix) || names.some((n) => chosen.includes(n))) det.open = true;
        det.innerHTML = `<summary></summary>`;
        det.querySelector("summary").textContent = `${prefix} (${names.length})`;
        for (const n of names) {
          const lab = document.createElement("label");
          lab.className = "metric";
          lab.dataset.metric = n;
          const box = document.createElement("input");
          box.type = "checkbox";
          box.checked = chosen.includes(n);
          box.addEventListener("change", () => {
            chosen = box.checked ? [...chosen, n] : chosen.filter((m) => m !== n);
            setUrl();
            renderAll();
          });
          lab.appendChild(box);
          lab.appendChild(document.createTextNode(" " + n));
          det.appendChild(lab);
        }
        list.appendChild(det);
      }
      filterPicker();
    }

    function filterPicker() {
      const needle = picker.querySelector("#metric-search").value.trim().toLowerCase();
      picker.querySelectorAll("#metric-list details").forEach((det) => {
        let shown = 0;
        det.querySelectorAll("label.metric").forEach((lab) => {
          const hit = !needle || lab.dataset.metric.toLowerCase().includes(needle);
          lab.hidden = !hit;
          shown += hit;
        });
        det.hidden = !shown;
        if (needle && shown) det.open = true;
      });
    }

    if (picker) {
      picker.querySelector("#metric-search").addEventListener("input", filterPicker);
      const slider = picker.querySelector("#ema");
      const shown = picker.querySelector("#ema-val");
      slider.value = String(alpha);
      shown.textContent = alpha ? alpha.toFixed(2) : "off";
      slider.addEventListener("input", () => {
        alpha = parseFloat(slider.value) || 0;
        shown.textContent = alpha ? alpha.toFixed(2) : "off";
        setUrl();
        if (data) renderAll();
      });
    }
    load();
    if (follow) setInterval(load, 1000);
  }

  document.querySelectorAll(".charts").forEach(drawCharts);
})();
