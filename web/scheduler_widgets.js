// The Advanced sampler shows only the knobs its chosen scheduler reads. The scheduler widget's
// options carry `dgemma_applies` ({scheduler: [knob names]}, built from the engine's adapters), so
// this file keeps no copy. Hidden widgets keep their values: saved graphs load and run unchanged.
import { app } from "../../scripts/app.js";

function setHidden(widget, hidden) {
  if (Boolean(widget.hidden) === hidden) return;
  widget.hidden = hidden;
  if (hidden) {
    widget.dgemmaType = widget.type;
    widget.type = "hidden";
    widget.computeSize = () => [0, -4];
  } else {
    widget.type = widget.dgemmaType ?? widget.type;
    delete widget.computeSize;
  }
}

/** Hide `node`'s knob widgets that the chosen scheduler does not read, now and whenever it changes. */
export function followScheduler(node, applies) {
  const knobs = new Set(Object.values(applies).flat());
  const scheduler = node.widgets?.find((w) => w.name === "scheduler");
  if (!scheduler) return;
  const show = () => {
    const on = new Set(applies[scheduler.value] ?? [...knobs]);
    for (const w of node.widgets) if (knobs.has(w.name)) setHidden(w, !on.has(w.name));
    if (node.size && node.computeSize) node.setSize?.([node.size[0], node.computeSize()[1]]);
    node.setDirtyCanvas?.(true, true);
  };
  const changed = scheduler.callback;
  scheduler.callback = function (...args) {
    const out = changed?.apply(this, args);
    show();
    return out;
  };
  const configure = node.onConfigure; // a saved graph sets the widget values after creation
  node.onConfigure = function (...args) {
    const out = configure?.apply(this, args);
    show();
    return out;
  };
  show();
}

app.registerExtension({
  name: "DiffusionGemma.SchedulerWidgets",

  beforeRegisterNodeDef(nodeType, nodeData) {
    const applies = nodeData?.input?.required?.scheduler?.[1]?.dgemma_applies;
    if (!applies) return;
    const created = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function (...args) {
      const out = created?.apply(this, args);
      followScheduler(this, applies);
      return out;
    };
  },
});
