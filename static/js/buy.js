// Buy page: the total updates as the tier and hours change (the server confirms it).
(function () {
  const form = document.getElementById("buy-form");
  const data = document.getElementById("tier-prices-data");
  const out = document.getElementById("buy-estimate");
  if (!form || !data || !out) return;
  const prices = JSON.parse(data.textContent);
  function update() {
    const price = Number(prices[form.elements.tier.value]);
    const hours = parseInt(form.elements.hours.value, 10);
    out.textContent = price >= 0 && hours > 0 ? (price * hours).toFixed(2) : "–";
  }
  form.addEventListener("input", update);
  form.addEventListener("change", update);
  update();
})();
