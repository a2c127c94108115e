// Tier catalog: price per GB-hour bar chart (Chart.js, vendored).
(function () {
  const data = document.getElementById("chart-data");
  const canvas = document.getElementById("price-chart");
  if (!data || !canvas || typeof Chart === "undefined") return;
  const chart = JSON.parse(data.textContent);
  new Chart(canvas, {
    type: "bar",
    data: {
      labels: chart.labels,
      datasets: [{ label: "credits per GB-hour", data: chart.price_per_gb_hour }],
    },
    options: { animation: false, plugins: { legend: { display: false } },
               scales: { y: { beginAtZero: true } } },
  });
})();
