// Buy page: the total updates as the tier and hours change (the server confirms it), in
// credits and in money, written exactly as tenants/money.py writes them: exact decimal
// arithmetic (BigInt), half up to the currency's minor unit, the same signs and separators.
(function () {
  const form = document.getElementById("buy-form");
  const data = document.getElementById("tier-prices-data");
  const rateData = document.getElementById("credit-rate-data");
  const out = document.getElementById("buy-estimate");
  if (!form || !data || !out) return;
  const prices = JSON.parse(data.textContent);
  const rate = rateData
    ? JSON.parse(rateData.textContent)
    : { currency: "USD", per_credit: "1", symbol: "$", places: 2 };

  // "12.3456" with `scale` decimals -> BigInt of units of 10^-scale.
  function units(text, scale) {
    const [whole, frac = ""] = String(text).split(".");
    return BigInt(whole + frac.padEnd(scale, "0").slice(0, scale));
  }
  // Units of 10^-scale -> "1,234.50" with `places` decimals, half up.
  function written(value, scale, places) {
    let v = value;
    const drop = scale - places;
    if (drop > 0) {
      const step = 10n ** BigInt(drop);
      v = (v + step / 2n) / step;
    }
    const text = v.toString().padStart(places + 1, "0");
    const whole = text.slice(0, text.length - places).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
    return places ? whole + "." + text.slice(text.length - places) : whole;
  }
  function update() {
    const entry = prices[form.elements.tier.value];
    const hours = parseInt(form.elements.hours.value, 10);
    if (entry === undefined || !(hours > 0)) {
      out.textContent = "–";
      return;
    }
    const [price, discount] = entry;
    const off = form.elements.interruptible && form.elements.interruptible.checked ? discount : 0;
    // price x hours x (100 - off) / 100, rounded half up once to the cent (Tier.price_of)
    const cents = (units(price, 2) * BigInt(hours) * BigInt(100 - off) + 50n) / 100n;
    const money = cents * units(rate.per_credit, 4); // units of 10^-6
    const amount = written(money, 6, rate.places);
    const value = rate.symbol ? rate.symbol + amount : amount + " " + rate.currency;
    const credits = written(cents, 2, 2);
    out.textContent = credits + (credits === "1.00" ? " credit (" : " credits (") + value + ")";
  }
  form.addEventListener("input", update);
  form.addEventListener("change", update);
  update();
})();
