// Node detail: VRAM used (mean and peak) over the last hour per GPU, from the API.
(function () {
  if (typeof Chart === "undefined") return;
  document.querySelectorAll("canvas.vram-chart").forEach(function (canvas) {
    const since = new Date(Date.now() - 3600 * 1000).toISOString();
    fetch(canvas.dataset.seriesUrl + "?start=" + encodeURIComponent(since), {
      headers: { Accept: "application/json" }, credentials: "same-origin",
    })
      .then(function (r) { return r.json(); })
      .then(function (series) {
        const labels = series.points.map(function (p) { return new Date(p.t).toLocaleTimeString(); });
        canvas.chart = new Chart(canvas, {
          type: "line",
          data: {
            labels: labels,
            datasets: [
              { label: "VRAM used (MiB)", data: series.points.map(function (p) { return p.used_mb; }), pointRadius: 0 },
              { label: "peak (MiB)", data: series.points.map(function (p) { return p.used_max_mb; }), pointRadius: 0, borderDash: [4, 3] },
            ],
          },
          options: {
            animation: false,
            scales: { y: { beginAtZero: true, suggestedMax: Number(canvas.dataset.total) } },
          },
        });
        canvas.dataset.points = String(series.points.length);
      });
  });
})();
