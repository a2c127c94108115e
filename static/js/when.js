// One way to write a moment on every page, as the `when` template filter writes it
// (tenants/templatetags/when.py): "2025-05-01 20:33:47 UTC", 24-hour, in the zone the
// page states on <html data-time-zone> (its IANA name) and data-time-zone-name (as shown).
(function () {
  const root = document.documentElement;
  const zone = root.dataset.timeZone || "UTC";
  const zoneName = root.dataset.timeZoneName || zone;
  let parts;
  try {
    parts = new Intl.DateTimeFormat("en-GB", {
      timeZone: zone, hourCycle: "h23", year: "numeric", month: "2-digit", day: "2-digit",
      hour: "2-digit", minute: "2-digit", second: "2-digit",
    });
  } catch (e) {  // a zone this browser does not know: write UTC, and say so
    parts = null;
  }
  function format(t) {
    const d = t instanceof Date ? t : new Date(t);
    if (isNaN(d.getTime())) return String(t);
    if (!parts) return d.toISOString().slice(0, 19).replace("T", " ") + " UTC";
    const p = {};
    parts.formatToParts(d).forEach(function (x) { p[x.type] = x.value; });
    return p.year + "-" + p.month + "-" + p.day + " " + p.hour + ":" + p.minute + ":" + p.second + " " + zoneName;
  }
  // A label `format` wrote, without its date: what a chart's time axis writes under each
  // tick ("20:33:47 UTC"); its tooltip keeps the whole label.
  function tick(label) {
    const text = String(label);
    return /^\d{4}-\d{2}-\d{2} /.test(text) ? text.slice(11) : text;
  }
  // Chart.js options for a time axis of labels written by `format`.
  function axis() {
    return { ticks: { callback: function (value) { return tick(this.getLabelForValue(value)); } } };
  }
  window.gpWhen = { format: format, tick: tick, axis: axis, zone: zone, zoneName: zoneName };
})();
