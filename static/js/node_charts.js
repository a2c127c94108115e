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
        canvas.dataset.points = String(series.points.length);
        if (!series.points.length) {
          // no empty axes: say there is nothing yet
          const note = document.createElement("p");
          note.className = "chart-empty";
          note.textContent = "No data yet: no sample of this GPU in the last hour.";
          const box = canvas.closest(".chart-box") || canvas;  // not an empty sized box
          box.after(note);
          box.hidden = true;
          canvas.hidden = true;
          return;
        }
        const labels = series.points.map(function (p) { return gpWhen.format(p.t); });
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
            responsive: true,
            maintainAspectRatio: false,  // the .chart-box sets the height
            scales: { x: gpWhen.axis(), y: { beginAtZero: true, suggestedMax: Number(canvas.dataset.total) } },
          },
        });
        canvas.dataset.points = String(series.points.length);
      });
  });
})();
