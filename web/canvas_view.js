// The live canvas of a DiffusionGemma run: framework-free, no ComfyUI imports.
//
//   const view = createCanvasView(container);
//   view.start(ev); view.step(ev); view.done(ev);   // payloads of nodes/events.py
//
// It paints inside its own element: a header line (block · step · T · committed), the final
// text of the blocks already finished, then the current canvas with one span per position,
// styled by its state digit, named by the start event's `states` (the engine's names, index = digit) and
// painted in the colours its `palette` carries (the engine's one palette). Model text only ever goes in as text nodes, never as HTML. Spans are reused in place and paints are coalesced to one per
// animation frame, so hundreds of steps cost no more DOM than one.
//
// A list run (a start event with `items` > 1) paints one row per item, each a view of its own fed
// by the steps naming that item, under a header counting the items denoising and settled.

const STYLE_ID = "dgemma-live-view-style";
export const ROW_PX = 50; // least height of a list run's row: its header, its prompt and a line of its text
const NAME = /^[a-z]+$/;

const CSS = `
.dgemma-view { box-sizing: border-box; display: flex; flex-direction: column; width: 100%;
  height: 100%; min-height: 0; flex: 1 1 auto; background: #14161a; color: #e6e6e6; border-radius: 4px;
  font: 12px/1.35 ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; overflow: hidden; }
.dgemma-view .dg-header { flex: none; padding: 3px 6px; color: #9aa4b2; background: #1d2026;
  white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.dgemma-view .dg-asked { flex: none; display: flex; align-items: center; gap: 6px; padding: 2px 6px;
  color: #9aa4b2; background: #181b20; white-space: nowrap; overflow: hidden; }
.dgemma-view .dg-asked[hidden] { display: none; }
.dgemma-view .dg-asked img { height: 24px; max-width: 48px; image-rendering: pixelated; border-radius: 2px; }
.dgemma-view .dg-asked span { overflow: hidden; text-overflow: ellipsis; }
.dgemma-view .dg-body { flex: 1 1 auto; min-height: 0; overflow: auto; padding: 4px 6px;
  white-space: pre-wrap; overflow-wrap: anywhere; word-break: break-all; }
.dgemma-view .dg-prev { color: #c9ced6; }
.dgemma-view .dg-noise { color: var(--dg-noise); }
.dgemma-view .dg-unknown { color: var(--dg-unknown); }
.dgemma-view .dg-settled { color: var(--dg-settled); }
.dgemma-view .dg-pinned { color: var(--dg-pinned); text-decoration: underline dotted; }
.dgemma-view .dg-constrained { color: var(--dg-constrained); text-decoration: underline wavy; }
.dgemma-view .dg-new { color: var(--dg-new); background: color-mix(in srgb, var(--dg-new) 22%, transparent);
  border-radius: 2px; }
.dgemma-view.dg-idle .dg-header { color: #6b7480; }
.dgemma-view.dg-finished .dg-header { color: #8fd19e; }
.dgemma-view.dg-error .dg-header { color: #ff8a80; }
.dgemma-view.dg-interrupted .dg-header { color: #ffcc80; }
.dgemma-view .dg-rows { display: flex; flex-direction: column; gap: 3px; height: 100%; white-space: normal; }
/* a row keeps its header, prompt and a line of text (more when few rows share the view); the rows scroll
   as one, never each on its own, and the browser lays out and paints only the rows in sight (a list may
   hold a thousand) */
.dgemma-view .dg-row { display: flex; flex: 1 0 ${ROW_PX}px; min-height: ${ROW_PX}px;
  content-visibility: auto; contain-intrinsic-size: auto ${ROW_PX}px; }
.dgemma-view .dg-row .dg-header, .dgemma-view .dg-row .dg-asked { padding: 0 6px; }
.dgemma-view .dg-row .dg-asked img { height: 14px; }
.dgemma-view .dg-row .dg-body { overflow: hidden; padding: 0 6px; }
`;

function ensureStyle(doc) {
  if (doc.getElementById(STYLE_ID)) return;
  const style = doc.createElement("style");
  style.id = STYLE_ID;
  style.textContent = CSS;
  (doc.head || doc.documentElement).appendChild(style);
}

const schedule = typeof requestAnimationFrame === "function"
  ? (fn) => requestAnimationFrame(fn)
  : (fn) => setTimeout(fn, 16);
const unschedule = typeof cancelAnimationFrame === "function"
  ? (h) => cancelAnimationFrame(h)
  : (h) => clearTimeout(h);

function num(x, digits) {
  return typeof x === "number" && isFinite(x) ? x.toFixed(digits) : "?";
}

// A committed share the engine did not send (null) reads "?", never 0.
function pct(x) {
  return typeof x === "number" ? `${num(x * 100, 0)}%` : "?";
}

function joinTokens(tokens) {
  return Array.isArray(tokens) ? tokens.map((t) => String(t ?? "")).join("") : "";
}

export function createCanvasView(container, { idleText = "DiffusionGemma · waiting for a run", label = "",
  follow = true, queued = false } = {}) {
  const doc = container.ownerDocument || document;
  ensureStyle(doc);

  const root = doc.createElement("div");
  root.className = "dgemma-view dg-idle";
  const header = doc.createElement("div");
  header.className = "dg-header";
  // What was asked: the prompt (and the image's thumbnail), so a screenshot says what the run answers.
  const asked = doc.createElement("div");
  asked.className = "dg-asked";
  asked.hidden = true;
  const thumb = doc.createElement("img");
  thumb.alt = "input image";
  const askedText = doc.createElement("span");
  asked.append(thumb, askedText);
  const body = doc.createElement("div");
  body.className = "dg-body";
  const prev = doc.createElement("span");
  prev.className = "dg-prev";
  const prevText = doc.createTextNode("");
  prev.appendChild(prevText);
  const canvas = doc.createElement("span");
  canvas.className = "dg-canvas";
  body.append(prev, canvas);
  root.append(header, asked, body);
  container.appendChild(root);

  // What the latest events say; paint() brings the DOM up to date with it.
  let run = null;        // {blocks, steps, canvasLength}
  let finished = [];     // final text of each finished block, in order
  let last = null;       // latest step event of the current block
  let stateClass = { "0": "dg-noise" };  // digit -> class, from the start event's state names
  let doneEv = null;
  let askedEv = null;    // {prompt, thumbnail} of the run's start event
  let headerText = "";
  let pending = 0;
  let handle = null;
  const spans = [];      // one per canvas position, reused across steps and blocks
  const shownTok = [];
  const shownState = [];
  let shownPrev = "";
  const stats = { events: 0, paints: 0 };
  let rows = null;       // a list run: one child view per item (null for a single run)
  let rowsStart = null;  // the list run's start event, to rebuild the rows on restore
  let rowsBox = null;
  let settled = {};      // item index -> its steps, for the items that have settled

  function openRows(ev) {
    closeRows();
    rowsStart = ev;
    rowsBox = doc.createElement("div");
    rowsBox.className = "dg-rows";
    body.appendChild(rowsBox);
    prev.style.display = canvas.style.display = "none";
    const { items, rows: perItem, ...common } = ev;
    rows = perItem.map((row, i) => {
      const box = doc.createElement("div");
      box.className = "dg-row";
      rowsBox.appendChild(box);
      // A row shows its answer's start: it does not follow the text down as a single view does.
      // A row waits until its first step: a long list runs in batches, and only one batch denoises at a time.
      const child = createCanvasView(box, { idleText: `item ${i + 1} · waiting`, label: `item ${i + 1} · `,
        follow: false, queued: true });
      child.start({ ...common, ...row });
      return child;
    });
  }

  function closeRows() {
    rows?.forEach((child) => child.destroy());
    rowsBox?.remove();
    rows = rowsBox = rowsStart = null;
    settled = {};
    prev.style.display = canvas.style.display = "";
  }

  function settle(map) {
    for (const [i, steps] of Object.entries(map ?? {})) {
      if (!(i in settled) && rows?.[i]) { settled[i] = steps; rows[i].done({ status: "done", steps_used: steps }); }
    }
  }

  function rowsHeader() {
    const n = rows.length, k = Object.keys(settled).length;
    const status = doneEv ? doneEv.status ?? "done" : null;
    if (status === "error") return `error: ${doneEv.message ?? "the run failed"}`;
    if (status === "interrupted") return `interrupted · ${k} of ${n} items settled`;
    if (status === "done") return `done · ${n} items settled, ${doneEv.steps_used ?? "?"} steps`;
    const working = rows.filter((child, i) => child.started() && !(i in settled)).length;
    return `${working} of ${n} items denoising together · ${k} settled`;
  }

  function requestPaint() {
    pending += 1;
    if (handle === null) handle = schedule(() => { handle = null; paint(); });
  }

  function showAsked(a) {
    askedEv = a && typeof a === "object" ? a : null;
    const png = String(askedEv?.thumbnail ?? "");
    asked.hidden = !askedEv;
    askedText.textContent = askedEv ? `asked: ${String(askedEv.prompt ?? "")}` : "";
    asked.title = askedText.textContent;
    thumb.hidden = !/^[A-Za-z0-9+/]+={0,2}$/.test(png); // base64 only: never a URL of the page's choosing
    if (!thumb.hidden) thumb.src = `data:image/png;base64,${png}`;
  }

  function setHeader(text) {
    // The model's LoRAs (" + LoRA name @ 1") end the line, so a screenshot says which adapters answered;
    // a list run's rows leave them to the view above them.
    const adapters = !label && typeof run?.adapters === "string" ? run.adapters : "";
    text = label + text + adapters;
    if (text !== headerText) { header.textContent = text; headerText = text; }
  }

  function paintHeader() {
    if (rows) {
      setHeader(rowsHeader());
      return;
    }
    if (!run && !last) {
      setHeader(idleText);
      return;
    }
    const blocks = last?.blocks ?? run?.blocks;
    const steps = last?.steps ?? run?.steps;
    if (doneEv?.status === "error") {
      setHeader(`error: ${doneEv.message ?? "the run failed"}`);
      return;
    }
    if (!last) {
      setHeader(doneEv?.status === "interrupted" ? "interrupted before the first step"
        : queued ? "waiting for its batch" : `block 1/${blocks ?? "?"} · starting · canvas ${run?.canvasLength ?? "?"}`);
      return;
    }
    const status = doneEv?.status ?? (doneEv ? "done" : null);
    if (status === "done" && doneEv.paused) {
      // The committed share first: a narrow node cuts the end of the line.
      setHeader(`paused · committed ${pct(last.committed)} · block ${last.block + 1} step `
        + `${last.step + 1} · resumable canvas_state`);
      return;
    }
    if (status === "done") {
      setHeader(`done, ${doneEv.steps_used ?? "?"} steps · committed ${pct(last.committed)}`);
      return;
    }
    if (status === "interrupted") {
      setHeader(`interrupted at block ${last.block + 1} step ${last.step + 1}`);
      return;
    }
    if (label) {  // a row of a list run: the committed share first, as a narrow node cuts the line's end
      setHeader(`committed ${pct(last.committed)} · block ${last.block + 1}/${blocks ?? "?"} · `
        + `step ${last.step + 1}/${steps ?? "?"}`);
      return;
    }
    setHeader(last.caption ? String(last.caption) : `block ${last.block + 1}/${blocks ?? "?"} · step ${last.step + 1}/${steps ?? "?"}`);
  }

  function paintCanvas() {
    const tokens = last ? last.tokens || [] : [];
    const state = last ? String(last.state || "") : "";
    const n = tokens.length;
    while (spans.length < n) {
      const span = doc.createElement("span");
      span.appendChild(doc.createTextNode(""));
      canvas.appendChild(span);
      spans.push(span);
      shownTok.push("");
      shownState.push("");
    }
    while (spans.length > n) {
      spans.pop().remove();
      shownTok.pop();
      shownState.pop();
    }
    // A finished run has no "new" tokens: the last step's highlight would read as still changing.
    const settledNow = doneEv && (doneEv.status ?? "done") === "done" && !doneEv.paused;
    for (let i = 0; i < n; i++) {
      const tok = String(tokens[i] ?? "");
      if (tok !== shownTok[i]) { spans[i].firstChild.data = tok; shownTok[i] = tok; }
      const cls = (settledNow && stateClass[state[i]] === "dg-new") ? "dg-settled" : stateClass[state[i]] || "dg-noise";
      if (cls !== shownState[i]) { spans[i].className = cls; shownState[i] = cls; }
    }
  }

  function paint() {
    if (handle !== null) { unschedule(handle); handle = null; }
    pending = 0;
    stats.paints += 1;
    const stick = follow && body.scrollTop + body.clientHeight >= body.scrollHeight - 8;
    root.classList.toggle("dg-idle", !run && !last);
    const status = doneEv ? doneEv.status ?? "done" : null;
    root.classList.toggle("dg-finished", status === "done");
    root.classList.toggle("dg-error", status === "error");
    root.classList.toggle("dg-interrupted", status === "interrupted");
    paintHeader();
    header.title = status === "error" ? String(doneEv.message ?? "") : headerText; // the whole line on hover
    const prevJoined = finished.join("");
    if (prevJoined !== shownPrev) { prevText.data = prevJoined; shownPrev = prevJoined; }
    paintCanvas();
    if (stick) body.scrollTop = body.scrollHeight;
  }

  const view = {
    element: root,
    /** The element holding the painted text (previous blocks, then the current canvas). */
    textElement: body,

    reset() {
      run = null; finished = []; last = null; doneEv = null;
      closeRows();
      requestPaint();
    },

    start(ev) {
      stats.events += 1;
      view.reset();
      run = { blocks: ev?.blocks, steps: ev?.steps, canvasLength: ev?.canvas_length, adapters: ev?.adapters };
      showAsked(ev?.asked);
      const names = Array.isArray(ev?.states) ? ev.states.map(String).filter((n) => NAME.test(n)) : [];
      if (names.length) stateClass = Object.fromEntries(names.map((n, i) => [String(i), `dg-${n}`]));
      for (const [name, colour] of Object.entries(ev?.palette ?? {})) {
        if (NAME.test(name) && /^#[0-9a-f]{6}$/i.test(String(colour))) root.style.setProperty(`--dg-${name}`, colour);
      }
      // A resumed run continues from the canvas where the earlier sampler paused, not from noise.
      if (ev?.items > 1 && Array.isArray(ev.rows)) openRows(ev);
      const resumed = ev?.resumed;
      if (resumed && resumed.step && Array.isArray(resumed.step.tokens)) {
        finished = Array.isArray(resumed.finished) ? resumed.finished.map(String) : [];
        last = { ...resumed.step, block: Number(resumed.step.block) || 0, step: Number(resumed.step.step) || 0 };
      }
    },

    step(ev) {
      if (!ev || !Array.isArray(ev.tokens)) return;
      stats.events += 1;
      if (rows && ev.item != null && !doneEv) {
        rows[Number(ev.item)]?.step(ev);
        settle(ev.settled);
        requestPaint();
        return;
      }
      if (rows) { closeRows(); run = null; }  // a single run's step that came without its start
      const block = Number(ev.block) || 0;
      if (doneEv || (last && block < last.block)) {
        // A step of a new run that came without its start: begin afresh.
        finished = []; last = null; doneEv = null;
      }
      if (last && block > last.block) finished.push(joinTokens(last.tokens));
      last = { ...ev, block, step: Number(ev.step) || 0 };
      requestPaint();
    },

    done(ev) {
      stats.events += 1;
      doneEv = ev || {};
      if (rows) {
        const ends = Array.isArray(doneEv.items) ? doneEv.items : null;
        rows.forEach((child, i) => {
          if (ends) child.done(ends[i]);
          else if (!(i in settled)) child.done({ ...doneEv, steps_used: undefined });
        });
      }
      requestPaint();
    },

    /** What the view shows, to rebuild it in a new view (a workflow tab reopened). */
    snapshot() {
      return { run, finished: [...finished], last, doneEv, asked: askedEv, stateClass: { ...stateClass }, palette: Object.fromEntries(
        Object.values(stateClass).map((cls) => `--${cls}`).map((v) => [v, root.style.getPropertyValue(v)])
          .filter(([, c]) => c)),
      ...(rows ? { rowsStart, settled: { ...settled }, rows: rows.map((child) => child.snapshot()) } : {}) };
    },

    restore(snap) {
      if (!snap) return;
      closeRows();
      if (snap.rows && snap.rowsStart) {
        openRows(snap.rowsStart);
        snap.rows.forEach((child, i) => rows[i]?.restore(child));
        settled = { ...(snap.settled ?? {}) };
      }
      ({ run, last, doneEv } = snap);
      showAsked(snap.asked);
      finished = [...(snap.finished ?? [])];
      if (snap.stateClass) stateClass = { ...snap.stateClass };
      for (const [name, colour] of Object.entries(snap.palette ?? {})) root.style.setProperty(name, colour);
      requestPaint();
    },

    /** Paint now instead of at the next animation frame (tests, or before a screenshot). */
    flush() {
      rows?.forEach((child) => child.flush());
      if (pending || handle !== null) paint();
    },

    /** The text the view shows once painted: previous blocks' text, then the current canvas (a list
     * run: each item's, one line per item). */
    text() {
      if (rows) return rows.map((child) => child.text()).join("\n");
      return finished.join("") + (last ? joinTokens(last.tokens) : "");
    },

    /** Whether a step of this run has come. */
    started() {
      return last !== null;
    },

    /** A list run's row views, one per item (empty for a single run). */
    rows() {
      return rows ? [...rows] : [];
    },

    stats() {
      return { ...stats, spans: spans.length, pending };
    },

    destroy() {
      if (handle !== null) { unschedule(handle); handle = null; }
      closeRows();
      root.remove();
    },
  };

  paint();
  return view;
}
