// The slice page's web terminal (docs/terminal.md). "Open terminal" asks the platform for a
// one-use ticket (a POST with the page's CSRF token), then opens the WebSocket it names on
// the edge, which runs a shell in the container. Binary frames are the terminal's bytes
// both ways; text frames are JSON control messages: {"resize": [cols, rows]} from here,
// {"connected": true} from the edge. xterm (vendor/xterm) fills #terminal-box and follows
// its size (the fit addon, refitted by a ResizeObserver). The status line says connecting,
// connected, or closed with the edge's reason.
(function () {
  "use strict";
  const openButton = document.getElementById("terminal-open");
  if (!openButton || !window.Terminal || !window.FitAddon) return;
  const closeButton = document.getElementById("terminal-close");
  const box = document.getElementById("terminal-box");
  const status = document.getElementById("terminal-status");
  const encoder = new TextEncoder();
  let socket = null;
  let term = null;
  let fit = null;
  let resizing = null;
  let styles = null;
  let closedHere = false;

  function say(text) {
    status.textContent = text;
  }

  function csrfToken() {
    try {
      return JSON.parse(document.body.getAttribute("hx-headers") || "{}")["X-CSRFToken"] || "";
    } catch (error) {
      return "";
    }
  }

  // xterm draws its theme, font and cursor through <style> elements whose text it writes;
  // the page's policy (style-src 'self') refuses inline styles, so the rules of the style
  // elements xterm makes are applied as constructed style sheets instead (the CSSOM from
  // this script, which the policy allows). Only the terminal's own box and the style
  // elements that appear in <head> while the terminal exists are watched.
  function StyleMirror() {
    const sheets = new Map();
    function mirror(element) {
      let sheet = sheets.get(element);
      if (!sheet) {
        sheet = new CSSStyleSheet();
        sheets.set(element, sheet);
        document.adoptedStyleSheets = document.adoptedStyleSheets.concat([sheet]);
      }
      try {
        sheet.replaceSync(element.textContent || "");
      } catch (error) {
        // a rule the browser cannot parse: the terminal works with its defaults
      }
    }
    function forget(element) {
      const sheet = sheets.get(element);
      if (!sheet) return;
      sheets.delete(element);
      document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => s !== sheet);
    }
    function seen(node, found) {
      if (node.nodeType !== 1) return;
      if (node.tagName === "STYLE") found(node);
      else node.querySelectorAll("style").forEach(found);
    }
    const observer = new MutationObserver(function (records) {
      records.forEach(function (record) {
        const target = record.target.nodeType === 1 ? record.target : record.target.parentNode;
        if (target && target.tagName === "STYLE") mirror(target);
        record.addedNodes.forEach((node) => seen(node, mirror));
        record.removedNodes.forEach((node) => seen(node, forget));
      });
    });
    [box, document.head].forEach(function (root) {
      observer.observe(root, { childList: true, subtree: true, characterData: true });
    });
    this.stop = function () {
      observer.disconnect();
      Array.from(sheets.keys()).forEach(forget);
    };
  }

  function send(data) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(data);
  }

  function sendSize() {
    box.dataset.cols = term.cols;
    box.dataset.rows = term.rows;
    send(JSON.stringify({ resize: [term.cols, term.rows] }));
  }

  function refit() {
    if (!term || box.hidden) return;
    try {
      fit.fit();
    } catch (error) {
      // the box is not laid out yet: the next resize fits it
    }
  }

  function startTerminal() {
    if (term) term.dispose();
    if (styles) styles.stop();
    box.hidden = false;
    styles = new StyleMirror();
    const narrow = window.matchMedia("(max-width: 576px)").matches;
    term = new window.Terminal({
      cursorBlink: true,
      fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace',
      fontSize: narrow ? 12 : 14,
      scrollback: 5000,
      theme: { background: "#101418" },
    });
    fit = new window.FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(box);
    refit();
    box.dataset.cols = term.cols;
    box.dataset.rows = term.rows;
    term.onData((data) => send(encoder.encode(data)));
    term.onBinary((data) => send(Uint8Array.from(data, (c) => c.charCodeAt(0))));
    term.onResize(sendSize);
    if (!resizing) {
      resizing = new ResizeObserver(() => window.requestAnimationFrame(refit));
      resizing.observe(box);
    }
  }

  function ended(event) {
    let why = event.reason || "code " + event.code;
    if (!event.reason && closedHere) why = "closed in the browser";
    else if (!event.reason && event.code === 1006) why = "the connection was refused or lost";
    say("Closed: " + why);
    if (term) term.options.disableStdin = true;
    socket = null;
    openButton.disabled = false;
    openButton.textContent = "Open a new terminal";
    closeButton.hidden = true;
  }

  function connect(url) {
    const address = new URL(url);
    address.searchParams.set("cols", term.cols);
    address.searchParams.set("rows", term.rows);
    closedHere = false;
    socket = new WebSocket(address.toString());
    socket.binaryType = "arraybuffer";
    socket.addEventListener("message", function (event) {
      if (typeof event.data !== "string") {
        term.write(new Uint8Array(event.data));
        return;
      }
      let message = {};
      try {
        message = JSON.parse(event.data);
      } catch (error) {
        return;
      }
      if (message.connected) {
        say("Connected.");
        closeButton.hidden = false;
        sendSize();
        term.focus();
      }
    });
    socket.addEventListener("close", ended);
  }

  async function ticket() {
    const response = await fetch(openButton.dataset.ticketUrl, {
      method: "POST",
      headers: { "X-CSRFToken": csrfToken(), Accept: "application/json" },
      credentials: "same-origin",
    });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok || !answer.url) {
      throw new Error(answer.message || "refused (HTTP " + response.status + ")");
    }
    return answer.url;
  }

  openButton.addEventListener("click", async function () {
    if (socket) return;
    openButton.disabled = true;
    say("Connecting…");
    let url;
    try {
      url = await ticket();
    } catch (error) {
      say("Closed: " + (error instanceof TypeError ? "the platform could not be reached" : error.message));
      openButton.disabled = false;
      return;
    }
    startTerminal();
    connect(url);
  });

  closeButton.addEventListener("click", function () {
    if (!socket) return;
    closedHere = true;
    socket.close(1000, "closed in the browser");
  });
})();
