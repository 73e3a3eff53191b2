// The models page refreshes itself: every 5 s it fetches what serves and the store, rendered by the
// server (agent/web/models_page.py), and swaps it in. Fetches stop while the tab is hidden.
(function () {
  "use strict";
  var target = document.getElementById("models");
  function refresh() {
    if (document.hidden) { return; }
    fetch("/models/part", { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.status === 401) { window.location.assign("/login"); return null; }
        return r.ok ? r.text() : null;
      })
      .then(function (html) { if (html !== null) { target.innerHTML = html; } })
      .catch(function () { /* the daemon is restarting: try again at the next tick */ });
  }
  window.setInterval(refresh, 5000);
})();
