// Launch page: the live VRAM estimate of the job against the chosen purchase's tier,
// from POST /api/v1/estimates/ (the same check the launch runs), plus small form hints.
(function () {
  const form = document.getElementById("launch-form");
  const panel = document.getElementById("estimate-panel");
  if (!form || !panel) return;
  const tiers = JSON.parse(document.getElementById("purchase-tiers").textContent);
  const sshImages = JSON.parse(document.getElementById("ssh-images").textContent).map(String);
  const verdict = document.getElementById("estimate-verdict");
  const body = document.getElementById("estimate-body");
  let timer = null;
  let seq = 0;

  function csrf() {
    try { return JSON.parse(document.body.getAttribute("hx-headers"))["X-CSRFToken"]; }
    catch (e) { return ""; }
  }
  function val(name) {
    const el = form.elements[name];
    return el ? el.value : "";
  }
  function job() {
    const workload = val("workload");
    const req = {
      model: { catalog: val("model") },
      workload: workload,
      weights_dtype: val("weights_dtype"),
      kv_cache_dtype: val("kv_cache_dtype"),
      engine: val("engine"),
      batch: parseInt(val("batch"), 10) || 1,
      context_tokens: parseInt(val("context_tokens"), 10) || 1,
    };
    if (workload === "training") {
      req.method = val("method") || "lora";
      req.optimizer = val("optimizer") || "adamw";
      req.seq_len = req.context_tokens;
      req.micro_batch = req.batch;
    }
    const tier = tiers[val("purchase")];
    if (tier) req.tier_mib = tier;
    return req;
  }
  function node(tag, text, cls) {
    const el = document.createElement(tag);
    if (text !== undefined) el.textContent = text;
    if (cls) el.className = cls;
    return el;
  }
  function mib(x) { return Math.round(x).toLocaleString() + " MiB"; }
  function render(d) {
    panel.dataset.fits = String(d.fits);
    panel.dataset.totalMib = String(Math.round(d.total_mib));
    if (d.fits === true) verdict.textContent = "Fits the tier: " + mib(d.total_mib) + " of " + mib(d.usable_mib) + ".";
    else if (d.fits === false) verdict.textContent = "Does not fit the tier: " + mib(d.total_mib) + " needed, " + mib(d.usable_mib) + " usable. The launch would be refused.";
    else verdict.textContent = "Estimated peak " + mib(d.total_mib) + " (choose a purchase to compare with its tier).";
    verdict.className = d.fits === false ? "error-text" : (d.fits ? "fits" : "muted");
    body.replaceChildren();
    const table = node("table", undefined, "estimate-terms");
    const tbody = node("tbody");
    d.terms.forEach(function (t) {
      const tr = node("tr");
      tr.append(node("td", t.label), node("td", t.mib.toFixed(1)), node("td", t.detail || t.basis, "muted"));
      tbody.append(tr);
    });
    const total = node("tr");
    total.append(node("th", "Total"), node("th", d.total_mib.toFixed(1)), node("th", ""));
    tbody.append(total);
    table.append(tbody);
    body.append(table);
    if (d.suggestions && d.suggestions.length) {
      body.append(node("h3", "To make it fit"));
      const ul = node("ul", undefined, "estimate-suggestions");
      d.suggestions.forEach(function (s) {
        ul.append(node("li", s.label + ": " + mib(s.total_mib) + (s.fits ? " (fits)" : "")));
      });
      body.append(ul);
    }
  }
  function update() {
    const mine = ++seq;
    panel.setAttribute("aria-busy", "true");
    fetch(panel.dataset.url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrf() },
      body: JSON.stringify(job()),
    })
      .then(function (r) { return r.json().then(function (j) { return { ok: r.ok, j: j }; }); })
      .then(function (res) {
        if (mine !== seq) return;
        panel.removeAttribute("aria-busy");
        if (res.ok) { render(res.j); return; }
        panel.dataset.fits = "";
        verdict.className = "error-text";
        verdict.textContent = res.j.message || "This job cannot be estimated.";
        body.replaceChildren();
      })
      .catch(function () {
        if (mine !== seq) return;
        panel.removeAttribute("aria-busy");
        verdict.className = "muted";
        verdict.textContent = "The live estimate is unavailable; the launch still checks it.";
      });
  }
  function hints() {
    const training = val("workload") === "training";
    form.querySelectorAll(".training-only").forEach(function (el) { el.hidden = !training; });
    const key = form.elements.ssh_public_key;
    if (key) key.required = sshImages.indexOf(val("image")) >= 0;
  }
  function changed(event) {
    hints();
    if (event && event.target && ["command", "environment", "ssh_public_key"].indexOf(event.target.name) >= 0) return;
    clearTimeout(timer);
    timer = setTimeout(update, 250);
  }
  form.addEventListener("change", changed);
  form.addEventListener("input", changed);
  hints();
  update();
})();
