// "Will it fit?": the estimate's terms as one stacked bar against the tier's usable memory.
(function () {
  let chart = null;
  function draw() {
    const data = document.getElementById("fit-chart-data");
    const canvas = document.getElementById("fit-chart");
    if (!data || !canvas || typeof Chart === "undefined") return;
    const c = JSON.parse(data.textContent);
    if (chart) chart.destroy();
    const palette = ["#3b82f6", "#f59e0b", "#10b981", "#ef4444", "#8b5cf6", "#06b6d4",
                     "#f97316", "#84cc16", "#ec4899", "#64748b"];
    const datasets = c.labels.map(function (label, i) {
      return { label: label, data: [c.mib[i]], stack: "job",
               backgroundColor: palette[i % palette.length] };
    });
    if (c.usable_mib) {
      datasets.push({ label: "usable in tier", data: [c.usable_mib], stack: "tier",
                      backgroundColor: "rgba(0,0,0,0.08)", borderColor: "#333", borderWidth: 1 });
    }
    chart = new Chart(canvas, {
      type: "bar",
      data: { labels: ["MiB"], datasets: datasets },
      options: { indexAxis: "y", animation: false,
                 scales: { x: { stacked: true, beginAtZero: true }, y: { stacked: true } } },
    });
    canvas.dataset.segments = String(c.labels.length);
  }
  document.addEventListener("DOMContentLoaded", draw);
  document.body.addEventListener("htmx:afterSettle", draw);
})();
