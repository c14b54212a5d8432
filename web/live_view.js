// ComfyUI glue for the live canvas: one view per sampler node (Sampler, Denoise, Advanced), fed by the
// dgemma.start / dgemma.step / dgemma.done websocket events (see nodes/events.py).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { ROW_PX, createCanvasView } from "./canvas_view.js";

const NODE_CLASSES = new Set(["DGemmaSampler", "DGemmaDenoise", "DGemmaSamplerAdvanced", "DGemmaDecide"]);
const WIDGET = "dgemma_live_view";
const views = new WeakMap(); // LGraphNode -> canvas view
// The last run per node, kept across workflow tab switches (the frontend makes new nodes on each).
const lastRuns = new Map(); // "workflow|graph|class|id" -> view snapshot
const MIN_PX = 140;
const MAX_PX = 480;

function minHeight(view) {
  return Math.min(MAX_PX, MIN_PX + Math.max(0, view.rows().length - 1) * ROW_PX);
}

// A list run's rows need room: grow the node to show them all (never shrink what the user set).
function fitRows(node, view) {
  if (!view.rows().length) return;
  const [w, h] = node.size;
  const need = node.computeSize()[1];
  if (need > h) {
    node.setSize([w, need]);
    node.setDirtyCanvas?.(true, true);
  }
}

function runKey(node) {
  // A node inside a subgraph may share its id with one outside it: the graph's id tells them apart.
  const wf = app.extensionManager?.workflow?.activeWorkflow;
  return `${wf?.key ?? wf?.path ?? ""}|${node.graph?.id ?? ""}|${node.comfyClass}|${node.id}`;
}

// Events name the node by its execution id: "7", or "12:7" for a node inside subgraph node 12.
// Look it up when the event arrives: node.id is still -1 when nodeCreated runs.
function findNode(id) {
  let graph = app.rootGraph ?? app.graph;
  const parts = String(id).split(":");
  for (let i = 0; graph && i < parts.length; i++) {
    const node = graph.getNodeById?.(parts[i]) ?? graph.getNodeById?.(Number(parts[i]));
    if (i === parts.length - 1) return node ?? null;
    graph = node?.subgraph;
  }
  return null;
}

// A node's run is saved (for a workflow tab that comes back) once per animation frame, not per event: a
// list's snapshot holds every row, and its steps come by the thousand.
export const glueStats = { saves: 0 };
const unsaved = new Map(); // LGraphNode -> its view, saved at the next frame
let saveHandle = null;

function save(node, view) {
  glueStats.saves += 1;
  lastRuns.set(runKey(node), view.snapshot());
}

function saveSoon(node, view) {
  unsaved.set(node, view);
  if (saveHandle !== null) return;
  saveHandle = requestAnimationFrame(() => {
    saveHandle = null;
    for (const [n, v] of unsaved) save(n, v);
    unsaved.clear();
  });
}

function route(method) {
  return (e) => {
    const ev = e?.detail;
    if (!ev || ev.node == null) return;
    const node = findNode(ev.node);
    const view = node && views.get(node);
    if (!view) return;
    view[method](ev);
    if (method === "start") fitRows(node, view);
    saveSoon(node, view);
  };
}

app.registerExtension({
  name: "DiffusionGemma.LiveView",

  setup() {
    api.addEventListener("dgemma.start", route("start"));
    api.addEventListener("dgemma.step", route("step"));
    api.addEventListener("dgemma.done", route("done"));
  },

  nodeCreated(node) {
    if (!NODE_CLASSES.has(node.comfyClass) || views.has(node)) return;
    const box = document.createElement("div");
    // A definite cap: in the Vue node renderer the widget grows with its content otherwise.
    box.style.cssText = `display:flex;flex-direction:column;width:100%;height:100%;min-height:${MIN_PX}px;`
      + `max-height:${MAX_PX}px;overflow:hidden;`;
    const view = createCanvasView(box);
    views.set(node, view);
    const widget = node.addDOMWidget(WIDGET, "dgemma_live_view", box, {
      serialize: false,
      hideOnZoom: false,
      getMinHeight: () => minHeight(view),
    });
    widget.serialize = false; // never part of widgets_values: the Python node has no such input
    const onRemoved = node.onRemoved;
    node.onRemoved = function () {
      if (unsaved.has(this)) save(this, unsaved.get(this)); // a tab switch must not lose this frame's events
      unsaved.delete(this);
      views.get(this)?.destroy();
      views.delete(this);
      return onRemoved?.apply(this, arguments);
    };
    const [w, h] = node.size;
    node.setSize([Math.max(w, 420), Math.max(h, node.computeSize()[1])]);
    // node.id is set once the graph adds the node: restore its last run then, unless a run has
    // already reached this view (a restore must never cover live events).
    setTimeout(() => {
      const now = view.snapshot();
      if (!now.run && !now.last) view.restore(lastRuns.get(runKey(node)));
    }, 0);
  },
});
