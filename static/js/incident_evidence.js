// Incident page: the GPU's VRAM in the frozen evidence window, with the slice's quota or
// the GPU's total as a dashed line when known. The data comes from json_script.
(function () {
  function draw() {
    const data = document.getElementById("evidence-chart-data");
    const canvas = document.getElementById("evidence-chart");
    if (!data || !canvas || typeof Chart === "undefined") return;
    const c = JSON.parse(data.textContent);
    const labels = c.labels.map(function (t) {
      return gpWhen.format(t);  // not a moment: written as it came
    });
    const datasets = [
      { label: "GPU VRAM used (MiB)", data: c.used_mb, pointRadius: 2, borderColor: "#3b82f6",
        backgroundColor: "rgba(59,130,246,0.15)", fill: true },
    ];
    if (c.limit_mb) {
      datasets.push({ label: c.limit_label || "limit (MiB)", data: labels.map(function () { return c.limit_mb; }),
        pointRadius: 0, borderColor: "#c62828", borderDash: [6, 4], fill: false });
    }
    new Chart(canvas, {
      type: "line",
      data: { labels: labels, datasets: datasets },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,  // the .chart-box sets the height
        plugins: { tooltip: { callbacks: { label: function (ctx) {
          // a missing value reads as a dash, never "null" or "undefined"
          const v = ctx.parsed && ctx.parsed.y;
          return ctx.dataset.label + ": " + (v === null || v === undefined || isNaN(v) ? "—" : String(v));
        } } } },
        scales: { x: gpWhen.axis(), y: { beginAtZero: true,
          suggestedMax: c.limit_mb ? Math.round(c.limit_mb * 1.1) : undefined } },
      },
    });
    canvas.dataset.points = String(c.used_mb.length);
    canvas.dataset.limit = c.limit_mb ? String(c.limit_mb) : "";
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();
