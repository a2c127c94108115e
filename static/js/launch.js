// Launch page: the live VRAM estimate of the job against the chosen purchase's tier. The
// server renders it (GET /launch/?estimate=1: the launch check's estimator, tier names and
// rounding); this swaps it in with the job fields' error slots (out of band, as htmx
// would), applies a suggestion's changes to the form, and keeps a few form hints.
(function () {
  const form = document.getElementById("launch-form");
  if (!form || !document.getElementById("estimate-panel")) return;
  const sshImages = JSON.parse(document.getElementById("ssh-images").textContent).map(String);
  // Never sent with an estimate: what to run is not the job's size (and may hold secrets).
  const NOT_THE_JOB = ["command", "environment", "ssh_public_key", "ssh_key", "image", "guaranteed",
                       "csrfmiddlewaretoken", "idempotency_token"];
  let timer = null;
  let seq = 0;

  function panel() { return document.getElementById("estimate-panel"); }
  function val(name) {
    const el = form.elements[name];
    return el ? el.value : "";
  }
  function query() {
    const params = new URLSearchParams();
    new FormData(form).forEach(function (value, name) {
      if (NOT_THE_JOB.indexOf(name) < 0) params.append(name, value);
    });
    return params.toString();
  }
  function markInvalid() {
    window.markFieldErrors(form);
  }
  function unavailable() {
    const p = panel();
    p.removeAttribute("aria-busy");
    p.dataset.fits = "";
    const verdict = document.getElementById("estimate-verdict");
    verdict.className = "muted";
    verdict.textContent = "The live estimate is unavailable; the launch still checks it.";
    const body = document.getElementById("estimate-body");
    if (body) body.remove();
  }
  function swapIn(html) {
    const tpl = document.createElement("template");
    tpl.innerHTML = html;
    const fresh = tpl.content.getElementById("estimate-panel");
    if (!fresh) { unavailable(); return; }  // e.g. the session ended: a login page
    tpl.content.querySelectorAll("[hx-swap-oob]").forEach(function (el) {
      el.removeAttribute("hx-swap-oob");
      const old = document.getElementById(el.id);
      if (old) old.replaceWith(el);
    });
    panel().replaceWith(fresh);
    markInvalid();
  }
  function update() {
    const mine = ++seq;
    const p = panel();
    p.setAttribute("aria-busy", "true");
    fetch(p.dataset.url + "&" + query(), {
      credentials: "same-origin",
      headers: { "HX-Request": "true", Accept: "text/html" },
    })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) { if (mine === seq) swapIn(html); })
      .catch(function () { if (mine === seq) unavailable(); });
  }
  // "To make it fit": a suggestion's button carries the form values that apply it.
  function apply(values) {
    Object.keys(values).forEach(function (name) {
      const el = form.elements[name];
      if (!el) return;
      if (el.type === "checkbox") el.checked = values[name] === true;
      else el.value = values[name];
    });
    hints();
    clearTimeout(timer);
    update();
  }
  document.addEventListener("click", function (event) {
    const button = event.target.closest ? event.target.closest(".apply-suggestion") : null;
    if (!button || !panel().contains(button)) return;
    event.preventDefault();
    apply(JSON.parse(button.dataset.apply));
  });
  function hints() {
    const training = val("workload") === "training";
    form.querySelectorAll(".training-only").forEach(function (el) { el.hidden = !training; });
    form.querySelectorAll(".inference-only").forEach(function (el) { el.hidden = training; });
    const key = form.elements.ssh_public_key;
    // a key registered on the account, when one is chosen, stands in for a pasted one
    if (key) key.required = sshImages.indexOf(val("image")) >= 0 && !val("ssh_key");
  }
  function changed(event) {
    hints();
    if (event && event.target && NOT_THE_JOB.indexOf(event.target.name) >= 0) return;
    clearTimeout(timer);
    timer = setTimeout(update, 250);
  }
  form.addEventListener("change", changed);
  form.addEventListener("input", changed);
  hints();
  markInvalid();
  // The page came with its first estimate; a browser that restored edited fields (back,
  // reload) gets one for what the form now holds.
  window.addEventListener("pageshow", function (event) {
    const edited = Array.prototype.some.call(form.elements, function (el) {
      if (NOT_THE_JOB.indexOf(el.name) >= 0) return false;
      if (el.type === "checkbox") return el.checked !== el.defaultChecked;
      if (el.tagName === "SELECT") {
        let initial = 0;  // no option marked selected: the browser shows the first
        Array.prototype.forEach.call(el.options, function (o, i) { if (o.defaultSelected) initial = i; });
        return el.options.length > 0 && el.selectedIndex !== initial;
      }
      return "defaultValue" in el && el.value !== el.defaultValue;
    });
    if (edited || event.persisted) update();
  });
})();
