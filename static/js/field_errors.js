// The job fields' error slots (`<small id="<input id>-error" class="field-error">`, filled or
// hidden by each estimate): mark the inputs they describe for assistive technology. Shared by
// the /fit/ and /launch/ pages.
window.markFieldErrors = function (root) {
  root.querySelectorAll(".field-error").forEach(function (slot) {
    const input = document.getElementById(slot.id.replace(/-error$/, ""));
    if (!input) return;
    const help = document.getElementById(input.id + "_helptext") ? input.id + "_helptext" : "";
    const describedBy = (slot.hidden ? help : (slot.id + " " + help)).trim();
    if (slot.hidden) input.removeAttribute("aria-invalid");
    else input.setAttribute("aria-invalid", "true");
    if (describedBy) input.setAttribute("aria-describedby", describedBy);
    else input.removeAttribute("aria-describedby");
  });
};
