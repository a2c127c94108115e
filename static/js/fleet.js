// The fleet page's drill-down: the cell of the node whose GPUs are shown stays marked,
// also after a refresh swaps that cell, and the GPUs, once swapped in, take the focus (a
// reader hears them; a sighted user sees where they went).
(function () {
  function mark() {
    const shown = document.getElementById("fleet-drill-node");
    const id = shown ? "node-cell-" + shown.dataset.nodeId : "";
    document.querySelectorAll("#heatmap .heat-cell").forEach(function (cell) {
      cell.classList.toggle("heat-selected", cell.id === id);
    });
  }
  document.body.addEventListener("htmx:afterSettle", mark);
  document.body.addEventListener("htmx:oobAfterSwap", mark);
  document.body.addEventListener("htmx:afterSwap", function (event) {
    if (event.detail.target.id !== "fleet-drill") return;
    const title = document.getElementById("drill-title");
    if (!title) return;
    const box = title.getBoundingClientRect();
    const inView = box.top >= 0 && box.bottom <= window.innerHeight;
    title.focus({ preventScroll: inView });
    if (!inView) title.scrollIntoView({ block: "start" });
  });
  mark();
})();
