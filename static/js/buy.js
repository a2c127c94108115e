// Buy page: the total updates as the tier and hours change (the server confirms it), in
// credits and in money at the rate in force.
(function () {
  const form = document.getElementById("buy-form");
  const data = document.getElementById("tier-prices-data");
  const rateData = document.getElementById("credit-rate-data");
  const out = document.getElementById("buy-estimate");
  if (!form || !data || !out) return;
  const prices = JSON.parse(data.textContent);
  const rate = rateData ? JSON.parse(rateData.textContent) : { currency: "USD", per_credit: "1" };
  let money;
  try {
    money = new Intl.NumberFormat("en-US", { style: "currency", currency: rate.currency });
  } catch (e) {
    money = { format: (v) => v.toFixed(2) + " " + rate.currency };
  }
  function update() {
    const price = Number(prices[form.elements.tier.value]);
    const hours = parseInt(form.elements.hours.value, 10);
    if (!(price >= 0 && hours > 0)) {
      out.textContent = "–";
      return;
    }
    const credits = price * hours;
    out.textContent = credits.toFixed(2) + " credits (" + money.format(credits * Number(rate.per_credit)) + ")";
  }
  form.addEventListener("input", update);
  form.addEventListener("change", update);
  update();
})();
