// The page's only script: no library, no build step, served from the binary.
// - Live updates: a session page polls /ui/live (the URL in data-poll) every data-every ms;
//   a 204 means nothing new, a 200 brings the live part again, rendered (and escaped) by
//   the server, which replaces the old one. Polling, not SSE: see ARCHITECTURE.md.
// - Erasure asks for confirmation (data-confirm) before the form is sent.
"use strict";

(function () {
  function poll(section) {
    var url = section.getAttribute("data-poll");
    var every = parseInt(section.getAttribute("data-every"), 10) || 2000;
    var busy = false;
    var timer = null;
    function tick() {
      if (busy || document.hidden) { return; }
      busy = true;
      fetch(url, { credentials: "same-origin", headers: { "accept": "text/html" } })
        .then(function (resp) {
          if (resp.status !== 200) { return null; }
          return resp.text();
        })
        .then(function (text) {
          if (!text) { return; }
          var doc = new DOMParser().parseFromString(text, "text/html");
          var fresh = doc.getElementById("live");
          if (!fresh) { return; }
          var open = {};
          section.querySelectorAll("details[open]").forEach(function (d) {
            var row = d.closest("tr");
            if (row && row.id) { open[row.id] = true; }
          });
          var node = document.importNode(fresh, true);
          section.replaceWith(node);
          node.querySelectorAll("tr[id]").forEach(function (row) {
            if (open[row.id]) {
              var d = row.querySelector("details");
              if (d) { d.open = true; }
            }
          });
          section = node;
          url = node.getAttribute("data-poll");
          // A session no longer there comes back without a URL: polling stops.
          if (!url) { clearInterval(timer); }
        })
        .catch(function () { /* the next tick tries again */ })
        .then(function () { busy = false; });
    }
    timer = setInterval(tick, every);
  }

  document.addEventListener("DOMContentLoaded", function () {
    var live = document.getElementById("live");
    if (live && live.getAttribute("data-poll")) { poll(live); }
    document.querySelectorAll("button[data-confirm]").forEach(function (button) {
      button.form.addEventListener("submit", function (event) {
        if (!window.confirm(button.getAttribute("data-confirm"))) { event.preventDefault(); }
      });
    });
  });
})();
