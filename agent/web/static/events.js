// The events page refreshes its list by itself: every few seconds it asks the server for the list
// (agent/web/events.py `/events/list`, with the page's filters and the version it shows) and swaps it
// in only when it changed (204 otherwise). An older page (paged back) stays as it is; nothing is
// fetched while the tab is hidden.
(function () {
  "use strict";
  var list = document.getElementById("events");
  if (!list || list.dataset.live !== "1") { return; }
  var seconds = Number(list.dataset.refreshS) || 3;
  function refresh() {
    if (document.hidden) { return; }
    var query = list.dataset.query ? list.dataset.query + "&" : "";
    var url = "/events/list?" + query + "known=" + encodeURIComponent(list.dataset.version || "");
    fetch(url, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.status === 401) { window.location.assign("/login"); return null; }
        if (r.status !== 200) { return null; }
        var version = r.headers.get("X-Events-Version") || "";
        return r.text().then(function (html) { return { html: html, version: version }; });
      })
      .then(function (got) {
        if (got === null) { return; }
        list.innerHTML = got.html;
        list.dataset.version = got.version;
      })
      .catch(function () { /* the daemon is restarting: try again at the next tick */ });
  }
  window.setInterval(refresh, seconds * 1000);
})();
