// The "Hugging Face model id" and "Revision" fields estimate when they change (Enter, or
// leaving the field), not on every keystroke: each id read from the Hub costs the platform
// requests and the visitor's budget of Hub reads, and "Qwen/Qwen3" on the way to
// "Qwen/Qwen3-8B" is a model of its own. Their input events stop here, before the form's
// live estimate hears them; change events still reach it.
(function () {
  const HUB_FIELDS = ["hub_model", "hub_revision"];
  document.addEventListener("input", function (event) {
    if (event.target && HUB_FIELDS.indexOf(event.target.name) !== -1) event.stopPropagation();
  }, true);
})();
