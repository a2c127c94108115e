// Ops incident ledger: select every open row, count the selection on the bulk button, and
// hold the live refresh while rows are selected (a refresh would clear the checkboxes).
(function () {
  const ROWS = "#incident-rows input[name=ids]";
  function selected() {
    return document.querySelectorAll(ROWS + ":checked").length;
  }
  function sync() {
    const button = document.getElementById("bulk-ack-button");
    if (!button) return;
    const n = selected();
    button.disabled = n === 0;
    button.textContent = n ? "Acknowledge " + n + " selected" : "Acknowledge selected";
    const all = document.getElementById("select-all");
    const boxes = document.querySelectorAll(ROWS);
    if (all) all.checked = boxes.length > 0 && n === boxes.length;
  }
  document.addEventListener("change", function (event) {
    const target = event.target;
    if (target.id === "select-all") {
      document.querySelectorAll(ROWS).forEach(function (box) { box.checked = target.checked; });
    }
    if (target.id === "select-all" || target.name === "ids") sync();
  });
  document.body.addEventListener("htmx:beforeRequest", function (event) {
    const elt = event.detail && event.detail.elt;
    if (elt && elt.id === "ledger-poll" && selected() > 0) event.preventDefault();
  });
  document.body.addEventListener("htmx:afterSettle", sync);
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", sync);
  } else {
    sync();
  }
})();
