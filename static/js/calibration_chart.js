// Calibration: mean measured peak against mean estimate per image and model; the diagonal
// is a perfect estimate, points above it used more than estimated.
(function () {
  const data = document.getElementById("calibration-data");
  const canvas = document.getElementById("calibration-chart");
  if (!data || !canvas || typeof Chart === "undefined") return;
  const c = JSON.parse(data.textContent);
  const top = Math.max.apply(null, c.points.map(function (p) { return Math.max(p.x, p.y); }).concat([1]));
  new Chart(canvas, {
    type: "scatter",
    data: {
      datasets: [
        { label: "image · model", data: c.points, pointRadius: 5, backgroundColor: "#3b82f6" },
        { label: "peak = estimate", data: [{ x: 0, y: 0 }, { x: top, y: top }], type: "line",
          pointRadius: 0, borderColor: "#999", borderDash: [4, 4] },
      ],
    },
    options: {
      animation: false,
      responsive: true,
      maintainAspectRatio: false,  // the .chart-box sets the height
      scales: {
        x: { title: { display: true, text: "estimated MiB" }, beginAtZero: true },
        y: { title: { display: true, text: "measured peak MiB" }, beginAtZero: true },
      },
      plugins: {
        tooltip: {
          callbacks: {
            label: function (ctx) {
              const p = ctx.raw;
              return (p.label ? p.label + ": " : "") + p.x + " → " + p.y + " MiB";
            },
          },
        },
      },
    },
  });
  canvas.dataset.points = String(c.points.length);
})();
