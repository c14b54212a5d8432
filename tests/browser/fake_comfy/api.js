// Stand-in for ComfyUI's /scripts/api.js: an EventTarget that the test dispatches
// CustomEvents on, the way the real api re-dispatches websocket messages.
export const api = new EventTarget();
