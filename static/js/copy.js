// Copy buttons: <button data-copy="#element-id"> copies that element's text; delegated, so it
// also works on fragments htmx swaps in. Says "Copied" (or how to copy by hand) beside it.
(function () {
  function done(button, text) {
    const original = button.dataset.label || button.textContent;
    button.dataset.label = original;
    button.textContent = text;
    setTimeout(function () { button.textContent = original; }, 2000);
  }
  document.addEventListener("click", function (event) {
    const button = event.target.closest("button[data-copy]");
    if (!button) return;
    event.preventDefault();
    const source = document.querySelector(button.dataset.copy);
    if (!source) return;
    const text = source.textContent.trim();
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(
        function () { done(button, "Copied"); },
        function () { done(button, "Select and copy it"); }
      );
      return;
    }
    const range = document.createRange();
    range.selectNodeContents(source);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    done(button, document.execCommand && document.execCommand("copy") ? "Copied" : "Press Ctrl+C");
  });
})();
