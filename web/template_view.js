// Nodes 2.0 (the Vue node renderer) needs more room than the classic canvas: when it loads a workflow
// laid out for the classic canvas it spreads the layout by 1.2 and zooms out by as much, but then it
// restores the view saved in the workflow, so the graph opens 1.2 times larger than the view it was
// saved with and runs off the window (frontend 1.35.9). For a workflow with this pack's nodes, zoom
// out once more after that restore, as the frontend meant to, so a template opens whole in both renderers.
import { app } from "../../scripts/app.js";

const SPREAD = 1.2; // the frontend's layout scale for Nodes 2.0
let loading = null; // the saved view of the workflow being loaded, when it needs the zoom-out

app.registerExtension({
  name: "DiffusionGemma.TemplateView",

  beforeConfigureGraph(graphData) {
    const extra = graphData?.extra;
    const ours = (graphData?.nodes ?? []).some((n) => String(n.type).startsWith("DGemma"));
    loading = ours && extra?.ds && extra.workflowRendererVersion !== "Vue" ? { scale: extra.ds.scale } : null;
  },

  afterConfigureGraph() {
    const saved = loading;
    loading = null;
    const canvas = app.canvas;
    const graph = canvas?.graph;
    // "Vue" now but not in the file: the layout was spread; an unchanged scale: the saved view was restored.
    if (!saved || graph?.extra?.workflowRendererVersion !== "Vue" || canvas.ds.scale !== saved.scale) return;
    const nodes = graph.nodes ?? [];
    if (!nodes.length) return;
    const left = Math.min(...nodes.map((n) => n.pos[0]));
    const top = Math.min(...nodes.map((n) => n.pos[1]));
    canvas.ds.changeScale(canvas.ds.scale / SPREAD, canvas.ds.convertOffsetToCanvas([left, top]));
    canvas.setDirty(true, true);
  },
});
