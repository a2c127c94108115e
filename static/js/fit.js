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
      data: { labels: ["VRAM"], datasets: datasets },
      options: { indexAxis: "y", animation: false, maintainAspectRatio: false,
                 scales: { x: { stacked: true, beginAtZero: true, title: { display: true, text: "MiB" } },
                           y: { stacked: true } } },
    });
    canvas.dataset.segments = String(c.labels.length);
  }
  // The fields' error slots come with each result (htmx out-of-band swaps).
  function markInvalid() {
    window.markFieldErrors(document.getElementById("fit-form") || document);
  }
  // "To make it fit": a suggestion's button carries the form values that apply it; the
  // form's own htmx trigger (change) re-runs the estimate in place.
  document.addEventListener("click", function (event) {
    const button = event.target.closest ? event.target.closest("#fit-result .apply-suggestion") : null;
    const form = document.getElementById("fit-form");
    if (!button || !form) return;
    event.preventDefault();
    const values = JSON.parse(button.dataset.apply);
    Object.keys(values).forEach(function (name) {
      const el = form.elements[name];
      if (!el) return;
      if (el.type === "checkbox") el.checked = values[name] === true;
      else el.value = values[name];
    });
    form.dispatchEvent(new Event("change", { bubbles: true }));
  });
  document.addEventListener("DOMContentLoaded", function () { draw(); markInvalid(); });
  document.body.addEventListener("htmx:afterSwap", markInvalid);  // the slots came with it
  document.body.addEventListener("htmx:afterSettle", draw);
})();
