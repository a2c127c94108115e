// Slice page: VRAM over time against the quota line, redrawn when the live part refreshes.
(function () {
  let chart = null;
  function draw() {
    const data = document.getElementById("slice-chart-data");
    const canvas = document.getElementById("vram-chart");
    if (!data || !canvas || typeof Chart === "undefined") return;
    const c = JSON.parse(data.textContent);
    // No sample yet: two blank labels still draw the quota line.
    const labels = c.labels.length
      ? c.labels.map(function (t) { return gpWhen.format(t); })
      : ["", ""];
    const quota = labels.map(function () { return c.quota_mb; });
    if (chart) {
      chart.data.labels = labels;
      chart.data.datasets[0].data = c.used_mb;
      chart.data.datasets[1].data = quota;
      chart.update("none");
    } else {
      chart = new Chart(canvas, {
        type: "line",
        data: {
          labels: labels,
          datasets: [
            { label: "VRAM used (MiB)", data: c.used_mb, pointRadius: 2, borderColor: "#3b82f6",
              backgroundColor: "rgba(59,130,246,0.15)", fill: true },
            { label: "quota (MiB)", data: quota, pointRadius: 0, borderColor: "#c62828",
              borderDash: [6, 4], fill: false },
          ],
        },
        options: {
          animation: false,
          responsive: true,
          maintainAspectRatio: false,  // the .chart-box sets the height
          scales: { x: gpWhen.axis(), y: { beginAtZero: true, suggestedMax: Math.round(c.quota_mb * 1.1) } },
        },
      });
    }
    canvas.dataset.points = String(c.used_mb.length);
    canvas.dataset.quota = String(c.quota_mb);
  }
  document.addEventListener("DOMContentLoaded", draw);
  document.body.addEventListener("htmx:afterSettle", draw);
})();
