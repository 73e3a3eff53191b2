// A page's parts refresh themselves: each element with data-refresh="<url>" fetches that part of
// the page, rendered by the server, every data-every ms and swaps it in (the box page's status,
// agent/web/pages.py; the models page, agent/web/models_page.py). Fetches stop while the tab is hidden.
(function () {
  "use strict";
  function keepFresh(target) {
    var url = target.getAttribute("data-refresh");
    function refresh() {
      if (document.hidden) { return; }
      fetch(url, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) {
          if (r.status === 401) { window.location.assign("/login"); return null; }
          return r.ok ? r.text() : null;
        })
        .then(function (html) { if (html !== null) { target.innerHTML = html; } })
        .catch(function () { /* the daemon is restarting: try again at the next tick */ });
    }
    window.setInterval(refresh, Number(target.getAttribute("data-every")) || 2000);
  }
  document.querySelectorAll("[data-refresh]").forEach(keepFresh);
})();
