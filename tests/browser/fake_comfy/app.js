// Stand-in for ComfyUI's /scripts/app.js in the browser test: just enough of `app` for
// web/live_view.js (registerExtension, a root graph with getNodeById, nodes with addDOMWidget).
export class FakeGraph {
  constructor() { this.nodes = new Map(); }
  add(node) { this.nodes.set(String(node.id), node); return node; }
  getNodeById(id) { return this.nodes.get(String(id)) ?? null; }
}

export class FakeNode {
  constructor(comfyClass, id, host) {
    this.comfyClass = comfyClass;
    this.id = -1; // as in nodeCreated; the real id is given when the node joins the graph
    this.pendingId = id;
    this.widgets = [];
    this.size = [300, 100];
    this.host = host;
  }
  addDOMWidget(name, type, element, options = {}) {
    const widget = { name, type, element, options, serialize: options.serialize };
    this.widgets.push(widget);
    this.host.appendChild(element);
    return widget;
  }
  // As the frontend does: the node's height holds its DOM widgets' minimum heights.
  computeSize() { return [300, 100 + Math.max(0, ...this.widgets.map((w) => w.options.getMinHeight?.() ?? 0))]; }
  setSize(size) { this.size = size; }
}

export const app = {
  extensions: [],
  rootGraph: new FakeGraph(),
  registerExtension(ext) { this.extensions.push(ext); },
};
