// durably ui: the live runs table, the run page's live status and its graph (Viz.js).
// No build step and nothing from a CDN: this file, style.css and viz.js are served by the app.
"use strict";

function text(value) {
  return value === null || value === undefined ? "" : String(value);
}

function seconds(s) {
  if (s === null || s === undefined) return "";
  if (s < 1) return Math.round(s * 1000) + " ms";
  if (s < 120) return s.toFixed(2) + " s";
  return s < 7200 ? (s / 60).toFixed(1) + " min" : (s / 3600).toFixed(1) + " h";
}

function when(t) {
  const d = new Date(t * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
    pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
}

function cell(content, cls) {
  const td = document.createElement("td");
  if (cls) td.className = cls;
  if (content instanceof Node) td.appendChild(content); else td.textContent = text(content);
  return td;
}

function badge(status) {
  const span = document.createElement("span");
  span.className = "badge " + status;
  span.textContent = status;
  return span;
}

function progress(row) {
  // a run that executes: its steps so far, against its previous attempt's when it had one
  const wrap = document.createElement("div");
  wrap.className = "progress";
  const bar = document.createElement("div");
  bar.className = "bar";
  const fill = document.createElement("span");
  // (a previous attempt that did not finish got part of the way: a bound, not a total)
  const total = row.expected || (row.before > row.steps ? row.before : null);
  if (total) {
    fill.style.width = Math.min(100, 100 * row.steps / total) + "%";
  } else {
    bar.classList.add("indeterminate");
  }
  bar.appendChild(fill);
  const label = document.createElement("small");
  label.textContent = row.steps.toLocaleString() + (row.expected ?
    " of " + row.expected.toLocaleString() : total ?
    " of at least " + total.toLocaleString() : "") + " steps";
  wrap.append(badge(row.status), bar, label);
  return wrap;
}

// -- the runs page ----------------------------------------------------------------------------
function runsPage(table) {
  const rows = new Map();
  const filters = document.getElementById("filters");
  const live = document.getElementById("live");
  const params = new URLSearchParams(location.search);
  for (const name of ["entrypoint", "status", "since"]) {
    if (params.get(name)) filters.elements[name].value = params.get(name);
  }

  function draw() {
    const want = {
      entrypoint: filters.elements.entrypoint.value,
      status: filters.elements.status.value,
      since: Number(filters.elements.since.value || 0),
    };
    const select = filters.elements.entrypoint;
    const names = [...new Set([...rows.values()].map((r) => r.entrypoint))].sort();
    const have = [...select.options].map((o) => o.value).slice(1);
    if (names.join("\n") !== have.join("\n")) {
      const chosen = select.value;
      select.length = 1;
      for (const name of names) select.add(new Option(name, name));
      select.value = chosen;
    }
    const now = Date.now() / 1000;
    const shown = [...rows.values()]
      .filter((r) => !want.entrypoint || r.entrypoint === want.entrypoint)
      .filter((r) => !want.status || r.status === want.status)
      .filter((r) => !want.since || r.created >= now - want.since)
      .sort((a, b) => b.created - a.created);
    const body = table.tBodies[0];
    const fresh = document.createDocumentFragment();
    for (const r of shown) {
      const tr = document.createElement("tr");
      tr.dataset.run = r.id;
      tr.dataset.status = r.status;
      const link = document.createElement("a");
      link.href = "/runs/" + encodeURIComponent(r.id);
      link.textContent = r.id;
      tr.append(
        cell(link), cell(r.name, "ep"),
        cell(r.status === "running" ? progress(r) : badge(r.status)),
        cell(when(r.created)), cell(seconds(r.duration), "n"),
        cell(r.counts.ran.toLocaleString(), "n"), cell(r.counts.cached.toLocaleString(), "n"),
        cell(r.counts.replayed.toLocaleString(), "n"),
        cell(r.counts.failed.toLocaleString(), r.counts.failed ? "n bad" : "n"),
        // (… while not known: the run executes, or its figure is being computed)
        cell(r.saved === null || r.saved === undefined ? "…" : seconds(r.saved), "n"));
      tr.title = r.entrypoint + (r.error ? "\n" + r.error : "");
      fresh.appendChild(tr);
    }
    body.replaceChildren(fresh);
    document.getElementById("empty").hidden = shown.length > 0;
  }

  filters.addEventListener("submit", (event) => event.preventDefault());
  filters.addEventListener("change", () => {
    const query = new URLSearchParams();
    for (const name of ["entrypoint", "status", "since"]) {
      if (filters.elements[name].value) query.set(name, filters.elements[name].value);
    }
    history.replaceState(null, "", query.toString() ? "?" + query : location.pathname);
    draw();
  });

  // the newest runs live; the older ones a page at a time (?before=T: the runs updated
  // last before T), read once
  const limit = Number(table.dataset.shown);
  const failure = document.getElementById("store-error");
  const more = document.getElementById("more");
  function older(before, text) {
    const link = document.createElement("a");
    link.href = "/?before=" + encodeURIComponent(before);
    link.textContent = text;
    return link;
  }
  function oldest() {
    return Math.min(...[...rows.values()].map((r) => r.updated));
  }
  if (params.get("before")) {
    const before = params.get("before");
    fetch("/api/runs?before=" + encodeURIComponent(before)).then((response) => {
      const total = Number(response.headers.get("x-durably-runs"));
      return response.json().then((found) => {
        if (found.error) throw new Error(found.error);
        for (const row of found) rows.set(row.id, row);
        live.textContent = "older runs: not updated live";
        const newest = document.createElement("a");
        newest.href = "/";
        newest.textContent = "‹ newest runs";
        more.replaceChildren(newest, " · " + found.length.toLocaleString() + " of the " +
          total.toLocaleString() + " runs, updated before " + when(Number(before)) + " ");
        if (found.length >= limit) more.append(older(oldest(), "older ›"));
        more.hidden = false;
        draw();
      });
    }).catch((error) => {
      failure.textContent = "The runs could not be read: " + error.message;
      failure.hidden = false;
    });
    return;
  }
  const stream = new EventSource("/api/stream");
  stream.addEventListener("runs", (event) => {
    const change = JSON.parse(event.data);
    for (const row of change.runs) rows.set(row.id, row);
    for (const id of change.removed) rows.delete(id);
    live.textContent = "live";
    live.className = "live on";
    const waiting = document.getElementById("waiting");
    if (waiting && change.total > 0) waiting.hidden = true;  // (the store was made)
    if (change.total > rows.size) {
      more.replaceChildren("The newest " + rows.size.toLocaleString() + " of " +
        change.total.toLocaleString() + " runs (the most recently updated) ",
        older(oldest(), "older ›"));
      more.hidden = false;
    } else {
      more.hidden = true;
    }
    draw();
  });
  stream.addEventListener("failed", (event) => {
    // the store cannot be read: its message (with its fix), until it can again
    failure.textContent = "The store could not be read: " + JSON.parse(event.data).error;
    failure.hidden = false;
    live.textContent = "store error";
    live.className = "live bad";
  });
  stream.addEventListener("recovered", () => {
    failure.hidden = true;
  });
  stream.addEventListener("error", () => {
    live.textContent = "reconnecting…";
    live.className = "live";
  });
  whenRefused(stream, () => {
    live.textContent = "restarted";
    live.className = "live bad";
  });
}

function whenRefused(stream, then) {
  // The browser reconnects a stream the network cut (the server stopped), and gives up
  // on one the server refused: a restarted dashboard has a new token, so its answer is 403.
  // Said on the page, with what to do, rather than "reconnecting…" forever.
  function probe() {
    // (a request of the page's own: its status says why; none reached: tried again)
    fetch("/static/app.js", { method: "HEAD", cache: "no-store" }).then((response) => {
      const note = document.getElementById("restarted") || document.createElement("p");
      note.id = "restarted";
      note.className = "error";
      note.textContent = response.status === 403 ?
        "The dashboard was restarted: its address changed (a new token). Open the address " +
        "durably ui printed when it started again (" + location.origin + "/?token=…)." :
        "The dashboard stopped sending updates (HTTP " + response.status + "): reload the page.";
      document.querySelector("main").prepend(note);
      then();
    }, () => setTimeout(probe, 2000));
  }
  stream.addEventListener("error", () => {
    if (stream.readyState === EventSource.CLOSED) probe();
  });
}

// -- a run's page -----------------------------------------------------------------------------
function runPage(header) {
  const runId = header.dataset.run;
  const shown = header.dataset.status;
  const stream = new EventSource("/api/stream");
  stream.addEventListener("runs", (event) => {
    const change = JSON.parse(event.data);
    if (change.removed.includes(runId)) {
      document.getElementById("status").textContent = "deleted";
      stream.close();
      return;
    }
    for (const row of change.runs) {
      if (row.id !== runId) continue;
      const status = document.getElementById("status");
      status.replaceChildren(row.status === "running" ? progress(row) : badge(row.status));
      // (the total and its parts together: they never disagree)
      document.getElementById("steps-total").textContent = row.steps.toLocaleString();
      for (const [kind, count] of Object.entries(row.counts)) {
        const part = document.getElementById("steps-" + kind);
        if (part) part.textContent = count.toLocaleString();
      }
      // a big run's time saved, computed apart from its page: from its row once there
      const saved = document.getElementById("time-saved");
      if (saved && saved.dataset.pending && row.saved !== null && row.saved !== undefined) {
        saved.textContent = seconds(row.saved) + (row.saved_by_cache > 0 ?
          " (" + seconds(row.saved_by_cache) + " by the cache)" : "");
        delete saved.dataset.pending;
      }
      const typing = document.activeElement && document.activeElement.tagName === "TEXTAREA";
      if (row.status !== shown && !typing) {
        stream.close();
        location.reload();  // a new status: the page's sections change (questions, errors)
      }
    }
  });
  whenRefused(stream, () => {});
  drawGraph(document.getElementById("graph"), runId, COLLAPSED);
}

// the collapse of a run's graph as first drawn: fan-outs of more calls are one node
const COLLAPSED = 20;

function backToCollapsed(box, runId, why) {
  // a message, and the way back to the graph as first drawn
  const note = document.createElement("p");
  note.className = "hint";
  note.textContent = why;
  const back = document.createElement("button");
  back.type = "button";
  back.className = "collapse";
  back.textContent = "show collapsed";
  back.addEventListener("click", () => drawGraph(box, runId, COLLAPSED));
  note.append(" ", back);
  return note;
}

function layOut(dot, seconds) {
  // the SVG of ``dot`` (text), laid out in a worker that is ended after ``seconds``
  return new Promise((resolve, reject) => {
    const worker = new Worker("/static/graph-worker.js");
    const timer = setTimeout(() => {
      worker.terminate();
      reject(new Error("slow"));
    }, seconds * 1000);
    worker.onmessage = (event) => {
      clearTimeout(timer);
      worker.terminate();
      if (event.data.error) reject(new Error(event.data.error)); else resolve(event.data.svg);
    };
    worker.onerror = (event) => {
      clearTimeout(timer);
      worker.terminate();
      reject(new Error(event.message || "the layout failed"));
    };
    worker.postMessage({ dot: dot });
  });
}

function fitLabels(svg) {
  // Viz measures text with its own font metrics; the browser's font may be wider: a line
  // wider than its node's shape is narrowed to fit inside it
  for (const node of svg.querySelectorAll("g.node")) {
    const shape = node.querySelector("path, polygon, ellipse");
    if (!shape) continue;
    const room = shape.getBBox().width - 8;
    for (const line of node.querySelectorAll("text")) {
      if (room > 0 && line.getComputedTextLength() > room) {
        line.setAttribute("textLength", String(room));
        line.setAttribute("lengthAdjust", "spacingAndGlyphs");
      }
    }
  }
}

function zoomable(svg) {
  // Pan and zoom on the SVG's viewBox: the wheel zooms around the pointer, a drag pans,
  // a double-click (or "fit") shows the whole graph again. Returns the toolbar's buttons.
  const whole = svg.viewBox.baseVal;
  const fit = [whole.x, whole.y, whole.width, whole.height];
  const room = svg.parentElement.clientWidth - 24;
  // (a wide graph keeps a readable height to zoom into, at most most of the window)
  const height = Math.min(Math.max(fit[3] * Math.min(1, room / fit[2]), Math.min(fit[3], 360)),
    window.innerHeight * 0.7);
  svg.removeAttribute("width");
  svg.removeAttribute("height");
  svg.style.width = "100%";
  svg.style.height = height + "px";
  svg.style.maxWidth = "none";
  const view = fit.slice();
  const show = () => svg.setAttribute("viewBox", view.join(" "));
  const at = (clientX, clientY) => {
    const p = svg.createSVGPoint();
    p.x = clientX;
    p.y = clientY;
    return p.matrixTransform(svg.getScreenCTM().inverse());
  };
  const zoom = (factor, x, y) => {
    // (at most the whole graph 4 times over, at least a 50th of it)
    const w = Math.min(Math.max(view[2] * factor, fit[2] / 50), fit[2] * 4);
    const f = w / view[2];
    view[0] = x - (x - view[0]) * f;
    view[1] = y - (y - view[1]) * f;
    view[2] *= f;
    view[3] *= f;
    show();
  };
  const centre = () => [view[0] + view[2] / 2, view[1] + view[3] / 2];
  svg.addEventListener("wheel", (event) => {
    event.preventDefault();
    const p = at(event.clientX, event.clientY);
    zoom(Math.exp(event.deltaY * 0.0015), p.x, p.y);
  }, { passive: false });
  let drag = null;
  let dragged = false;
  svg.addEventListener("pointerdown", (event) => {
    if (event.button !== 0) return;
    drag = { x: event.clientX, y: event.clientY, view: view.slice(),
             scale: 1 / svg.getScreenCTM().a };
    dragged = false;
  });
  svg.addEventListener("pointermove", (event) => {
    if (!drag) return;
    const dx = event.clientX - drag.x;
    const dy = event.clientY - drag.y;
    if (!dragged && Math.abs(dx) + Math.abs(dy) < 4) return;
    if (!dragged) svg.setPointerCapture(event.pointerId);
    dragged = true;
    svg.classList.add("panning");
    view[0] = drag.view[0] - dx * drag.scale;
    view[1] = drag.view[1] - dy * drag.scale;
    show();
  });
  const stop = () => {
    drag = null;
    svg.classList.remove("panning");
  };
  svg.addEventListener("pointerup", stop);
  svg.addEventListener("pointercancel", stop);
  // (a drag that ends on a fan-out's node does not expand it)
  svg.addEventListener("click", (event) => {
    if (dragged) {
      event.stopPropagation();
      dragged = false;
    }
  }, true);
  const reset = () => {
    view.splice(0, 4, ...fit);
    show();
  };
  svg.addEventListener("dblclick", reset);
  const tools = document.createElement("div");
  tools.className = "zoom";
  for (const [label, title, act] of [
    ["+", "zoom in", () => zoom(1 / 1.5, ...centre())],
    ["−", "zoom out", () => zoom(1.5, ...centre())],
    ["fit", "show the whole graph (or double-click it)", reset]]) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "small";
    button.textContent = label;
    button.title = title;
    button.addEventListener("click", act);
    tools.append(button);
  }
  const hint = document.createElement("small");
  hint.textContent = "wheel: zoom · drag: pan · double-click: fit";
  tools.append(hint);
  return tools;
}

function drawGraph(box, runId, collapse) {
  const expanded = collapse !== COLLAPSED;
  const seconds = Number(box.dataset.layoutSeconds || 20);
  fetch("/api/runs/" + encodeURIComponent(runId) + "/graph?collapse=" + collapse)
    .then((response) => response.json())
    .then((found) => {
      if (found.error) {
        box.replaceChildren(expanded ? backToCollapsed(box, runId, found.error) :
          document.createTextNode(found.error));
        return null;
      }
      return layOut(found.dot, seconds).then((text) => {
        const svg = new DOMParser().parseFromString(text, "image/svg+xml").documentElement;
        box.replaceChildren(document.importNode(svg, true));
        const drawn = box.querySelector("svg");
        fitLabels(drawn);
        box.prepend(zoomable(drawn));
        const groups = Object.entries(found.groups);
        if (expanded) {
          box.prepend(backToCollapsed(box, runId, "Every call of the fan-out is drawn."));
        } else if (groups.length) {
          const note = document.createElement("p");
          note.className = "hint";
          note.textContent = "Fan-outs of more than " + collapse + " calls are drawn as one " +
            "node (box): click one to draw its calls one by one.";
          box.prepend(note);
        }
        for (const g of drawn.querySelectorAll("g.node")) {
          const name = g.querySelector("title").textContent;
          const calls = found.groups[name];
          if (!calls) continue;
          g.classList.add("group");
          g.addEventListener("click", () => {
            box.textContent = "drawing " + calls.toLocaleString() + " calls…";
            drawGraph(box, runId, calls);
          });
        }
      }, (error) => {
        box.replaceChildren(backToCollapsed(box, runId, error.message === "slow" ?
          "This graph (" + found.nodes.toLocaleString() + " nodes) took more than " +
          seconds + " s to lay out, so it was not drawn; the step table lists every call." :
          "the graph could not be drawn: " + error.message));
      });
    })
    .catch((error) => {
      box.replaceChildren(backToCollapsed(box, runId, "the graph could not be drawn: " + error));
    });
}

// -- forms that need a confirmation -----------------------------------------------------------
for (const form of document.querySelectorAll("form.danger")) {
  form.addEventListener("submit", (event) => {
    if (!window.confirm("This cannot be undone. Go on?")) event.preventDefault();
  });
}

const runsTable = document.getElementById("runs");
if (runsTable) runsPage(runsTable);
const runHeader = document.getElementById("run");
if (runHeader) runPage(runHeader);
