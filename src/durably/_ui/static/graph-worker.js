// durably ui: lays a graph out with Viz.js (Graphviz in WebAssembly) off the page's thread,
// so that a graph too hard to lay out never freezes the tab: the page terminates this worker
// when it takes too long. Message in: {dot}; out: {svg} (its text) or {error}.
"use strict";
importScripts("/static/viz.js");

self.onmessage = (event) => {
  Viz.instance()
    .then((viz) => self.postMessage({ svg: viz.renderString(event.data.dot, { format: "svg" }) }))
    .catch((error) => self.postMessage({ error: String(error) }));
};
