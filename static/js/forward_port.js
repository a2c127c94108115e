// The slice page's forward commands: a renter may pick the local port each forward listens
// on. The number typed rewrites the shown command (-L 127.0.0.1:<local>:...) and the URL to
// open; delegated, so it also works on the section htmx keeps across the page's polling.
(function () {
  const LOCAL = /-L 127\.0\.0\.1:\d+:/;

  function problem(value) {
    if (!/^\d+$/.test(value)) return "a whole number from 1 to 65535";
    const port = Number(value);
    if (port < 1 || port > 65535) return "a port from 1 to 65535";
    return "";
  }

  document.addEventListener("input", function (event) {
    const input = event.target.closest("input[data-forward-port]");
    if (!input) return;
    const remote = input.dataset.forwardPort;
    const command = document.getElementById("gateway-forward-" + remote);
    const url = document.getElementById("gateway-forward-url-" + remote);
    const error = document.getElementById("gateway-forward-error-" + remote);
    const value = input.value.trim();
    const wrong = problem(value);
    input.setAttribute("aria-invalid", wrong ? "true" : "false");
    if (error) {
      const port = Number(value);
      error.textContent = wrong
        ? "The local port must be " + wrong + "."
        : port < 1024 ? "Ports below 1024 need root on most systems." : "";
      error.hidden = !error.textContent;
    }
    if (wrong) return;
    if (command) command.textContent = command.textContent.replace(LOCAL, "-L 127.0.0.1:" + Number(value) + ":");
    if (url) url.textContent = "http://127.0.0.1:" + Number(value) + "/";
  });
})();
