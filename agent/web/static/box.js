// The box page refreshes itself: every 2 s it fetches the status part of the page, rendered by the
// server (agent/web/pages.py), and swaps it in. Fetches stop while the tab is hidden.
(function () {
  "use strict";
  var target = document.getElementById("status");
  function refresh() {
    if (document.hidden) { return; }
    fetch("/box/status", { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.status === 401) { window.location.assign("/login"); return null; }
        return r.ok ? r.text() : null;
      })
      .then(function (html) { if (html !== null) { target.innerHTML = html; } })
      .catch(function () { /* the daemon is restarting: try again at the next tick */ });
  }
  window.setInterval(refresh, 2000);
})();
