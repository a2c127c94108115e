// Confirmations without inline script (the Content-Security-Policy runs none; see
// docs/security-headers.md): a form with data-confirm="message", or the submit button that
// was pressed with one (a form with several buttons: grant or decline), asks with confirm()
// before it submits; Cancel submits nothing. Delegated from the document, so forms that
// htmx swaps in later ask too; in the capture phase, so it answers before htmx sends a form.
(function () {
  document.addEventListener("submit", function (event) {
    const form = event.target;
    const button = event.submitter;
    const message = (button && button.dataset.confirm) || form.dataset.confirm;
    if (!message || window.confirm(message)) return;
    event.preventDefault();
    event.stopImmediatePropagation();
  }, true);
})();
