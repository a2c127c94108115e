// Incident KPIs: incidents per day by class (stacked bars), and per node / per class
// bars. The numbers come from json_script; the tables on the page hold the same ones.
(function () {
  const COLORS = ["#3b82f6", "#c62828", "#2e7d32", "#b26a00", "#6a1b9a", "#00838f"];
  function color(i) { return COLORS[i % COLORS.length]; }
  function hasPoints(config) {
    return config.data.datasets.some(function (d) {
      return (d.data || []).some(function (v) { return v !== null && v !== undefined && v !== 0; });
    });
  }
  function chart(id, config) {
    const canvas = document.getElementById(id);
    if (!canvas) return;
    if (!hasPoints(config)) {
      // never bare axes: the page says there is nothing to draw yet
      const note = document.createElement("p");
      note.className = "chart-empty";
      note.id = id.replace(/-chart$/, "-empty");
      note.textContent = "No data yet.";
      (canvas.closest(".chart-box") || canvas).replaceWith(note);  // not an empty sized box
      return;
    }
    // the .chart-box sets the height
    config.options = Object.assign({ animation: false, responsive: true, maintainAspectRatio: false },
                                   config.options || {});
    new Chart(canvas, config);
  }
  function draw() {
    const data = document.getElementById("kpi-chart-data");
    if (!data || typeof Chart === "undefined") return;
    const c = JSON.parse(data.textContent);
    chart("kpi-per-day-chart", {
      type: "bar",
      data: {
        labels: c.per_day.labels,
        datasets: c.per_day.series.map(function (s, i) {
          return { label: s.label, data: s.counts, backgroundColor: color(i) };
        }),
      },
      options: { scales: { x: { stacked: true },
                           y: { stacked: true, beginAtZero: true, ticks: { precision: 0 } } } },
    });
    chart("kpi-by-class-chart", {
      type: "bar",
      data: {
        labels: c.by_class.labels,
        datasets: [
          { label: "mean time to detect (min)", data: c.by_class.mttd_min, backgroundColor: color(0) },
          { label: "mean time to resolve (min)", data: c.by_class.mttr_min, backgroundColor: color(1) },
        ],
      },
      options: { scales: { y: { beginAtZero: true } } },
    });
    chart("kpi-by-node-chart", {
      type: "bar",
      data: {
        labels: c.by_node.labels,
        datasets: [
          { label: "incidents per 1,000 GPU-hours", data: c.by_node.per_1000, backgroundColor: color(0) },
          { label: "preemption failures (%)", data: c.by_node.preemption_pct, backgroundColor: color(1) },
        ],
      },
      options: { scales: { y: { beginAtZero: true } } },
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();
