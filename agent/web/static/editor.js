// The zone editor (agent/web/editor.py): the pipeline's latest plain frame under an SVG of its zones,
// lines and masks. Click to add points (a line takes two), close a polygon on its first point or by a
// double-click; drag a corner to move it; click a shape to select it; the table renames, relabels and
// deletes. Points are fractions of the frame (3 decimals, as written). Save POSTs the shapes with the
// file's hash and the CSRF token; the answer is shown: applied, or the problems beside each shape.
(function () {
  "use strict";
  var root = document.getElementById("zone-editor");
  if (!root) { return; }
  var data = JSON.parse(root.getAttribute("data-editor"));
  var KINDS = ["zones", "lines", "motion_masks", "object_masks"];
  var TITLES = { zones: "zone", lines: "line", motion_masks: "motion mask", object_masks: "object mask" };
  var NAMED = { zones: true, lines: true };
  var LABELLED = { zones: true, lines: true, object_masks: true };
  var SVG = "http://www.w3.org/2000/svg";
  var CLOSE_PX = 10; // a click this near the first point closes the polygon
  var SAME_PX = 3; // a click this near the last point adds nothing (a double-click's second click)
  var RETRY_MS = 1000;

  var img = document.getElementById("zone-frame");
  var svg = document.getElementById("zone-svg");
  var waiting = document.getElementById("zone-waiting");
  var tbody = document.querySelector("#zone-table tbody");
  var status = document.getElementById("zone-status");
  var problemsList = document.getElementById("zone-problems");
  var snippet = document.getElementById("zone-snippet");
  var finishButton = document.getElementById("zone-finish");
  var saveButton = document.getElementById("zone-save");
  var csrf = document.querySelector('meta[name="csrf-token"]').getAttribute("content");

  var size = null; // the frame's [width, height] in pixels, once a frame came
  var shapes = {}; // kind -> [{name, points (fractions, or null until the frame's size is known),
  //                pixels, origin, moved, labels, labelsSet, problems}]
  var drawing = null; // {kind, points} while a new shape is being drawn
  var selected = null; // {kind, index}
  var drag = null; // {kind, index, point, moved}
  var attempt = 0;

  KINDS.forEach(function (kind) {
    shapes[kind] = (data.shapes[kind] || []).map(function (s, i) {
      var pixels = s.units === "pixels";
      return {
        name: s.name || null, points: pixels ? null : s.points.map(copy), pixels: pixels ? s.points : null,
        "in": s["in"] || null,
        origin: i, moved: false, labels: s.labels || null, labelsSet: false, problems: []
      };
    });
  });

  function copy(p) { return [Number(p[0]), Number(p[1])]; }
  function round3(v) { return Math.round(v * 1000) / 1000; }
  function box() { return size || [1280, 720]; }

  // --- the frame -----------------------------------------------------------------------------------

  function loadFrame() {
    attempt += 1;
    img.src = "/live/" + encodeURIComponent(data.pipeline) + "/frame.jpg?plain=1&try=" + attempt;
  }
  img.addEventListener("load", function () {
    size = [img.naturalWidth, img.naturalHeight];
    waiting.hidden = true;
    img.parentNode.classList.remove("waiting");
    KINDS.forEach(function (kind) {
      shapes[kind].forEach(function (s) {
        if (s.points === null) {
          s.points = s.pixels.map(function (p) { return [p[0] / size[0], p[1] / size[1]]; });
        }
      });
    });
    render();
  });
  // 204 (no frame yet) and 404 (not running) come here: ask again a little later.
  img.addEventListener("error", function () { window.setTimeout(loadFrame, RETRY_MS); });

  // --- drawing -------------------------------------------------------------------------------------

  function at(event) {
    var rect = svg.getBoundingClientRect();
    return [
      Math.min(1, Math.max(0, (event.clientX - rect.left) / rect.width)),
      Math.min(1, Math.max(0, (event.clientY - rect.top) / rect.height))
    ];
  }

  function cssDistance(a, b) {
    var rect = svg.getBoundingClientRect();
    return Math.hypot((a[0] - b[0]) * rect.width, (a[1] - b[1]) * rect.height);
  }

  function freeName(kind) {
    var taken = {};
    shapes.zones.concat(shapes.lines).forEach(function (s) { taken[s.name] = true; });
    for (var n = 1; n < 1000; n += 1) {
      if (!taken[TITLES[kind] + "-" + n]) { return TITLES[kind] + "-" + n; }
    }
    return TITLES[kind] + "-" + Date.now();
  }

  function startDrawing(kind) {
    drawing = { kind: kind, points: [] };
    selected = null;
    finishButton.disabled = kind === "lines";
    say("Drawing a " + TITLES[kind] + ": click on the frame to add its points.");
    render();
  }

  function finishDrawing() {
    if (!drawing) { return; }
    var need = drawing.kind === "lines" ? 2 : 3;
    if (drawing.points.length < need) {
      say("A " + TITLES[drawing.kind] + " needs " + need + " points.");
      return;
    }
    var kind = drawing.kind;
    shapes[kind].push({
      name: NAMED[kind] ? freeName(kind) : null, points: drawing.points, pixels: null, origin: null,
      moved: true, labels: null, labelsSet: false, problems: []
    });
    selected = { kind: kind, index: shapes[kind].length - 1 };
    drawing = null;
    finishButton.disabled = true;
    say("Added; Save writes it.");
    render();
  }

  svg.addEventListener("click", function (event) {
    if (drag && drag.moved) { return; }
    if (drawing) {
      var p = at(event);
      var points = drawing.points;
      if (points.length && cssDistance(p, points[points.length - 1]) <= SAME_PX) { return; }
      if (points.length >= 3 && cssDistance(p, points[0]) <= CLOSE_PX) { finishDrawing(); return; }
      points.push(p);
      if (drawing.kind === "lines" && points.length === 2) { finishDrawing(); return; }
      render();
      return;
    }
    var target = event.target.closest("[data-kind]");
    selected = target ? { kind: target.getAttribute("data-kind"), index: Number(target.getAttribute("data-index")) } : null;
    render();
  });

  svg.addEventListener("dblclick", function (event) {
    if (drawing && drawing.kind !== "lines") { event.preventDefault(); finishDrawing(); }
  });

  svg.addEventListener("mousedown", function (event) {
    var handle = event.target.closest("circle[data-point]");
    if (drawing || !handle) { return; }
    event.preventDefault();
    drag = {
      kind: handle.getAttribute("data-kind"), index: Number(handle.getAttribute("data-index")),
      point: Number(handle.getAttribute("data-point")), moved: false
    };
  });

  window.addEventListener("mousemove", function (event) {
    if (!drag) { return; }
    var shape = shapes[drag.kind][drag.index];
    shape.points[drag.point] = at(event);
    shape.moved = true;
    drag.moved = true;
    render();
  });

  window.addEventListener("mouseup", function () {
    if (!drag) { return; }
    var was = drag;
    if (was.moved) { selected = { kind: was.kind, index: was.index }; say("Moved; Save writes it."); }
    // The click that follows this mouseup must not select or add anything.
    window.setTimeout(function () { drag = null; }, 0);
    render();
  });

  document.querySelectorAll("button.zone-draw").forEach(function (button) {
    button.addEventListener("click", function () { startDrawing(button.getAttribute("data-kind")); });
  });
  finishButton.addEventListener("click", finishDrawing);
  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && drawing) { drawing = null; finishButton.disabled = true; say(""); render(); }
    var typing = event.target.tagName === "INPUT";
    if (event.key === "Delete" && selected && !drawing && !typing) {
      shapes[selected.kind].splice(selected.index, 1);
      selected = null;
      say("Deleted; Save writes it.");
      render();
    }
  });

  // --- showing -------------------------------------------------------------------------------------

  function element(name, attributes) {
    var node = document.createElementNS(SVG, name);
    Object.keys(attributes).forEach(function (key) { node.setAttribute(key, attributes[key]); });
    return node;
  }

  function pixelsOf(points) {
    var b = box();
    return points.map(function (p) { return (p[0] * b[0]).toFixed(1) + "," + (p[1] * b[1]).toFixed(1); }).join(" ");
  }

  function render() {
    var b = box();
    var rect = svg.getBoundingClientRect();
    var unit = rect.width > 0 ? b[0] / rect.width : 1; // frame pixels per CSS pixel
    svg.setAttribute("viewBox", "0 0 " + b[0] + " " + b[1]);
    svg.setAttribute("preserveAspectRatio", "none");
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    KINDS.forEach(function (kind) {
      shapes[kind].forEach(function (s, i) {
        if (s.points === null) { return; }
        var chosen = selected && selected.kind === kind && selected.index === i;
        var classes = "shape " + kind + (chosen ? " selected" : "") + (s.problems.length ? " bad" : "");
        var tag = kind === "lines" ? "polyline" : "polygon";
        svg.appendChild(element(tag, { points: pixelsOf(s.points), "class": classes, "data-kind": kind, "data-index": i }));
        if (s.name) {
          // Above its first point, or below it where that is the frame's top edge.
          var y = s.points[0][1] * b[1];
          var label = element("text", {
            x: Math.min(s.points[0][0] * b[0] + 6 * unit, b[0] - 60 * unit), y: y < 20 * unit ? y + 18 * unit : y - 6 * unit,
            "class": "shape-name", "font-size": 14 * unit
          });
          label.textContent = s.name;
          svg.appendChild(label);
        }
        if (kind === "lines") { direction(s, b, unit); }
        s.points.forEach(function (p, j) {
          svg.appendChild(element("circle", {
            cx: p[0] * b[0], cy: p[1] * b[1], r: 5 * unit, "class": "handle " + kind,
            "data-kind": kind, "data-index": i, "data-point": j
          }));
        });
      });
    });
    if (drawing && drawing.points.length) {
      svg.appendChild(element("polyline", { points: pixelsOf(drawing.points), "class": "shape drawing" }));
      drawing.points.forEach(function (p, j) {
        svg.appendChild(element("circle", { cx: p[0] * b[0], cy: p[1] * b[1], r: (j === 0 ? 7 : 4) * unit, "class": "handle drawing" }));
      });
    }
    renderTable();
  }

  // A line's `in` side: walking from its first point to its second, crossing from the right to the
  // left is `in` (docs/analytics.md): an arrow from its middle to the left, named.
  function direction(s, b, unit) {
    var a = [s.points[0][0] * b[0], s.points[0][1] * b[1]];
    var z = [s.points[1][0] * b[0], s.points[1][1] * b[1]];
    var length = Math.hypot(z[0] - a[0], z[1] - a[1]);
    if (length === 0) { return; }
    var n = [(z[1] - a[1]) / length, -(z[0] - a[0]) / length]; // the walker's left (y grows downwards)
    var mid = [(a[0] + z[0]) / 2, (a[1] + z[1]) / 2];
    var tip = [mid[0] + n[0] * 28 * unit, mid[1] + n[1] * 28 * unit];
    var back = [-n[0] * 8 * unit, -n[1] * 8 * unit];
    var side = [n[1] * 6 * unit, -n[0] * 6 * unit];
    svg.appendChild(element("polyline", {
      points: [mid, tip, [tip[0] + back[0] + side[0], tip[1] + back[1] + side[1]], tip,
        [tip[0] + back[0] - side[0], tip[1] + back[1] - side[1]]].map(function (p) { return p[0] + "," + p[1]; }).join(" "),
      "class": "direction"
    }));
    var name = element("text", { x: tip[0] + n[0] * 4 * unit, y: tip[1] + n[1] * 4 * unit + 5 * unit, "class": "shape-name", "font-size": 13 * unit, "text-anchor": "middle" });
    name.textContent = s["in"] || "in";
    svg.appendChild(name);
  }

  function cell(row, content) {
    var td = document.createElement("td");
    if (typeof content === "string") { td.textContent = content; } else if (content) { td.appendChild(content); }
    row.appendChild(td);
    return td;
  }

  function input(value, label, onChange) {
    var field = document.createElement("input");
    field.type = "text";
    field.value = value;
    field.setAttribute("aria-label", label);
    field.addEventListener("change", function () { onChange(field.value.trim()); });
    return field;
  }

  function renderTable() {
    while (tbody.firstChild) { tbody.removeChild(tbody.firstChild); }
    KINDS.forEach(function (kind) {
      shapes[kind].forEach(function (s, i) {
        var row = document.createElement("tr");
        row.setAttribute("data-shape", kind + "/" + i);
        if (selected && selected.kind === kind && selected.index === i) { row.className = "selected"; }
        cell(row, TITLES[kind] + " " + (i + 1));
        cell(row, NAMED[kind] ? input(s.name, "name", function (v) { s.name = v; render(); }) : "");
        var labelsText = s.labels ? s.labels.join(", ") : "";
        cell(row, LABELLED[kind] ? input(labelsText, "labels (empty: every one)", function (v) {
          s.labels = v ? v.split(/\s*,\s*/).filter(function (x) { return x; }) : null;
          s.labelsSet = true;
        }) : "");
        var points = s.points === null
          ? "in pixels: shown once a frame came"
          : s.points.map(function (p) { return "[" + round3(p[0]).toFixed(3) + ", " + round3(p[1]).toFixed(3) + "]"; }).join(" ");
        cell(row, points).className = "points";
        cell(row, s.problems.join("; ")).className = "problem";
        var remove = document.createElement("button");
        remove.type = "button";
        remove.textContent = "Delete";
        remove.addEventListener("click", function () {
          shapes[kind].splice(i, 1);
          selected = null;
          say("Deleted; Save writes it.");
          render();
        });
        cell(row, remove);
        row.addEventListener("click", function (event) {
          if (event.target.tagName === "INPUT" || event.target.tagName === "BUTTON") { return; }
          selected = { kind: kind, index: i };
          render();
        });
        tbody.appendChild(row);
      });
    });
    if (!tbody.firstChild) {
      var empty = document.createElement("tr");
      cell(empty, "No zones, lines or masks yet: pick one above and click on the frame.").colSpan = 6;
      tbody.appendChild(empty);
    }
  }

  function say(text) { status.textContent = text; }

  // --- saving --------------------------------------------------------------------------------------

  function payload() {
    var out = {};
    KINDS.forEach(function (kind) {
      out[kind] = shapes[kind].map(function (s) {
        var points = s.points === null ? s.pixels : s.points.map(function (p) { return [round3(p[0]), round3(p[1])]; });
        var item = { points: points, origin: s.origin, moved: s.moved };
        if (NAMED[kind]) { item.name = s.name; }
        if (s.labelsSet) { item.labels = s.labels; }
        return item;
      });
    });
    return out;
  }

  function showProblems(answer) {
    var byShape = answer.shapes || {};
    KINDS.forEach(function (kind) {
      shapes[kind].forEach(function (s, i) { s.problems = byShape[kind + "/" + i] || []; });
    });
    while (problemsList.firstChild) { problemsList.removeChild(problemsList.firstChild); }
    (answer.problems || []).forEach(function (text) {
      var item = document.createElement("li");
      item.textContent = text;
      problemsList.appendChild(item);
    });
  }

  function saved(answer) {
    data.sha256 = answer.sha256 || data.sha256;
    KINDS.forEach(function (kind) {
      shapes[kind].forEach(function (s, i) { s.origin = i; s.moved = false; s.labelsSet = false; });
    });
  }

  saveButton.addEventListener("click", function () {
    if (drawing) { finishDrawing(); if (drawing) { return; } }
    saveButton.disabled = true;
    say("Saving...");
    var body = new URLSearchParams();
    body.set("sha256", data.sha256);
    body.set("shapes", JSON.stringify(payload()));
    window.fetch("/zones/" + encodeURIComponent(data.pipeline), {
      method: "POST", credentials: "same-origin", cache: "no-store", body: body,
      headers: { "X-CSRF-Token": csrf }
    }).then(function (response) {
      if (response.status === 401) { window.location.assign("/login"); return null; }
      return response.json();
    }).then(function (answer) {
      if (answer === null) { return; }
      showProblems(answer);
      snippet.hidden = answer.result !== "fleet";
      if (answer.result === "applied") {
        saved(answer);
        say("Saved and applied.");
      } else if (answer.result === "unchanged") {
        say("Nothing changed: the file already says this.");
      } else if (answer.result === "fleet") {
        snippet.textContent = answer.snippet;
        say("Not saved: the fleet's desired state (" + answer.layer + ") runs this pipeline. Its pipeline for the document is below.");
      } else if (answer.sha256) {
        saved(answer);
        say("Saved, but the reload says: " + answer.result + ".");
      } else {
        var count = (answer.problems || []).length + Object.keys(answer.shapes || {}).length;
        say("Not saved: " + count + " problem" + (count === 1 ? "" : "s") + " (beside the shapes below).");
      }
      render();
    }).catch(function (error) {
      say("Not saved: no answer from the agent (" + error + ").");
    }).then(function () { saveButton.disabled = false; });
  });

  window.addEventListener("resize", render);
  render();
  loadFrame();
})();
