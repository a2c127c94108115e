// Tier catalog: price per GB-hour bar chart (Chart.js, vendored), axes in their units.
(function () {
  const data = document.getElementById("chart-data");
  const canvas = document.getElementById("price-chart");
  if (!data || !canvas || typeof Chart === "undefined") return;
  const chart = JSON.parse(data.textContent);
  const unit = chart.currency + " per GB of VRAM per hour";
  new Chart(canvas, {
    type: "bar",
    data: {
      labels: chart.labels,
      datasets: [{ label: unit, data: chart.price_per_gb_hour }],
    },
    options: {
      animation: false,
      responsive: true,
      maintainAspectRatio: false,  // the .chart-box sets the height
      plugins: {
        legend: { display: false },
        tooltip: { callbacks: { label: (ctx) => ctx.parsed.y.toFixed(4) + " " + chart.currency + " / GB-hour" } },
      },
      scales: {
        x: { title: { display: true, text: "tier (VRAM)" } },
        y: { beginAtZero: true, title: { display: true, text: unit } },
      },
    },
  });
})();
