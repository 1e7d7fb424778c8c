// agentrl view: the curves (uPlot) and their live refresh; everything else is server-rendered.
"use strict";
(function () {
  const COLORS = ["#2457b5", "#c0392b", "#1f8a4c", "#b9770e", "#7d3c98", "#117a8b"];

  function drawCharts(box) {
    const runs = JSON.parse(box.dataset.runs);
    const curves = JSON.parse(box.dataset.curves);
    const follow = box.dataset.follow === "1";
    const plots = {};
    let lastVersion = null;

    async function load() {
      const q = runs.map((r) => "run=" + encodeURIComponent(r)).join("&");
      const resp = await fetch("/api/metrics?" + q);
      if (!resp.ok) return;
      const data = await resp.json();
      const version = JSON.stringify(Object.values(data).map((d) => d.version));
      if (version === lastVersion) return;
      lastVersion = version;
      for (const [key, label] of curves) render(key, label, data);
    }

    function render(key, label, data) {
      // one x axis (steps) shared by the runs overlaid; a run without a step leaves a gap
      const steps = new Set();
      for (const d of Object.values(data)) (d.series.step || []).forEach((s) => steps.add(s));
      const xs = Array.from(steps).sort((a, b) => a - b);
      const ys = [], series = [{ label: "step" }];
      let any = false;
      Object.entries(data).forEach(([name, d], i) => {
        const at = new Map();
        (d.series.step || []).forEach((s, j) => at.set(s, (d.series[key] || [])[j] ?? null));
        const col = xs.map((s) => (at.has(s) ? at.get(s) : null));
        if (col.some((v) => v !== null)) any = true;
        ys.push(col);
        series.push({ label: name, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true, points: { size: 5 } });
      });
      let cell = plots[key];
      if (!cell) {
        const div = document.createElement("div");
        div.className = "chart";
        div.dataset.metric = key;
        div.innerHTML = "<h4></h4><div class='plot'></div>";
        div.querySelector("h4").textContent = label;
        box.appendChild(div);
        cell = plots[key] = { div, plot: null };
      }
      const holder = cell.div.querySelector(".plot");
      if (!any) {
        holder.innerHTML = "<div class='empty'>not recorded in this run</div>";
        if (cell.plot) { cell.plot.destroy(); cell.plot = null; }
        return;
      }
      if (cell.plot) { cell.plot.setData([xs, ...ys]); return; }
      holder.innerHTML = "";
      cell.plot = new uPlot({
        width: Math.max(300, cell.div.clientWidth - 12), height: 170, series,
        scales: { x: { time: false } }, legend: { show: runs.length > 1 },
        axes: [{ incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000] }, {}],
      }, [xs, ...ys], holder);
    }

    load();
    if (follow) setInterval(load, 1000);
  }

  document.querySelectorAll(".charts").forEach(drawCharts);
})();
