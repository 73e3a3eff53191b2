// The live view (agent/web/live.py): each <figure class="live" data-pipeline="NAME"> long-polls
// /live/NAME/frame.jpg?after=SEQ and paints each new picture on its canvas (a canvas, not an <img>
// with a blob: URL, so the page keeps its CSP: default-src 'self'). data-plain="1": the frames
// without the drawings. Under it: the picture's age and the pipeline's frame rate. A hidden tab
// stops polling, so the server stops making pictures for it a few seconds later.
(function () {
  "use strict";
  var RETRY_MS = 2000;

  function watch(figure) {
    var name = figure.getAttribute("data-pipeline");
    var plain = figure.getAttribute("data-plain") === "1" ? "&plain=1" : "";
    var canvas = figure.querySelector("canvas");
    var context = canvas.getContext("2d");
    var ageText = figure.querySelector(".live-age");
    var fpsText = figure.querySelector(".live-fps");
    var seq = 0;
    var age = null; // seconds old when it arrived (the server's clock), and when that was (ours)
    var arrived = 0;

    function later(ms) { window.setTimeout(poll, ms); }

    function say(text) { ageText.textContent = text; age = null; }

    function paint(answer) {
      var next = Number(answer.headers.get("X-Frame-Seq"));
      var sent = Number(answer.headers.get("X-Frame-Age"));
      var fps = answer.headers.get("X-Pipeline-Fps");
      return answer.blob().then(function (blob) { return window.createImageBitmap(blob); })
        .then(function (bitmap) {
          if (canvas.width !== bitmap.width || canvas.height !== bitmap.height) {
            canvas.width = bitmap.width;
            canvas.height = bitmap.height;
          }
          context.drawImage(bitmap, 0, 0);
          bitmap.close();
          seq = next;
          age = sent;
          arrived = window.performance.now();
          showAge();
          fpsText.textContent = fps === null ? "" : "pipeline " + Number(fps).toFixed(1) + " fps";
          figure.setAttribute("data-seq", String(seq));
        });
    }

    function poll() {
      if (document.hidden) { later(1000); return; }
      var url = "/live/" + encodeURIComponent(name) + "/frame.jpg?after=" + seq + plain;
      window.fetch(url, { credentials: "same-origin", cache: "no-store" })
        .then(function (answer) {
          if (answer.status === 401) { window.location.assign("/login"); return null; }
          if (answer.status === 200) { return paint(answer).then(function () { later(0); }); }
          if (answer.status === 204) { later(0); return null; } // nothing newer yet: ask again
          if (answer.status === 404) { seq = 0; say("not running: looking again"); } // stopped, rebuilt
          else { say("busy: trying again"); }
          later(RETRY_MS);
          return null;
        })
        .catch(function () { say("no answer: trying again"); later(RETRY_MS); });
    }

    function showAge() {
      if (age === null) { return; }
      var seconds = age + (window.performance.now() - arrived) / 1000;
      ageText.textContent = "frame " + seconds.toFixed(1) + " s old";
    }

    window.setInterval(showAge, 500);
    poll();
  }

  document.querySelectorAll("figure.live[data-pipeline]").forEach(watch);
})();
