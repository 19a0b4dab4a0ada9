// A picture of a template's step graph as SVG: one column per dependency depth (one row,
// top to bottom, on a narrow screen), an arrow from each dependency to the step that waits
// for it (dashed into a step that runs only `when` a condition holds), each box coloured by
// its status; a foreach or loop is a box around its inner steps. The picture shrinks to fit
// its card.
import { html, useState, useEffect } from './html.js';

const BOX_W = 150;
const BOX_H = 46;
const GAP_X = 60;
const GAP_Y = 18;
const LEFT = 40;  // room left of the first column for a cycle's arrow coming back
// Top to bottom (a phone): one step a row, boxes as wide as a phone allows at full scale,
// so the labels are drawn at their own size (13 and 11 px), never shrunk to fit.
const NARROW_W = 210;
const NARROW_GAP = 28;

/** Depth of each step (0 for steps with no known dependency); cycles are cut, not followed. */
function depths(steps) {
  const byId = new Map(steps.map((s) => [s.id, s]));
  const depth = new Map();
  const visiting = new Set();
  const visit = (id) => {
    if (depth.has(id)) return depth.get(id);
    if (visiting.has(id) || !byId.has(id)) return -1;
    visiting.add(id);
    const deps = (byId.get(id).depends_on || []).map(visit);
    visiting.delete(id);
    const d = 1 + Math.max(-1, ...deps);
    depth.set(id, d);
    return d;
  };
  steps.forEach((s) => visit(s.id));
  return depth;
}

/** The steps in stages, by dependency depth: `[['facts', 'numbers'], ['report']]`; the
 * steps of one stage do not depend on each other and run side by side. */
export function stages(steps) {
  const valid = steps.filter((s) => s && typeof s.id === 'string' && s.id);
  const depth = depths(valid);
  const out = [];
  for (const s of valid) (out[depth.get(s.id) ?? 0] = out[depth.get(s.id) ?? 0] || []).push(s.id);
  return out.filter(Boolean);
}

/** Narrow screens draw the graph top to bottom (a step per row) instead of left to right;
 * drawn again when the screen turns or the window is resized across the width. */
const NARROW = typeof matchMedia === 'function' ? matchMedia('(max-width: 600px)') : null;
function useNarrow() {
  const [narrow, setNarrow] = useState(() => !!(NARROW && NARROW.matches));
  useEffect(() => {
    if (!NARROW) return undefined;
    const changed = () => setNarrow(NARROW.matches);
    NARROW.addEventListener('change', changed);
    changed();
    return () => NARROW.removeEventListener('change', changed);
  }, []);
  return narrow;
}

function agentLabel(agent) {
  if (!agent) return '';
  if (agent.human) return 'human';
  if (agent.node) return `node ${agent.node}`;
  if (agent.worker) return 'worker';
  return '';
}

const PAD = 10;      // a container's inner margin
const HEADER = 40;  // a container's title lines above its inner steps

const isContainer = (s) => !!(s.foreach || s.loop);

/** The steps a container draws inside itself: a loop's or a foreach's small workflow, or
 * for a foreach of one agent per item, one box standing for "each item". */
function innerOf(s) {
  const list = s.loop ? s.loop.steps : s.steps;
  if (Array.isArray(list)) return list.filter((x) => x && typeof x.id === 'string' && x.id);
  if (s.foreach && s.agent) return [{ id: 'each item', agent: s.agent, item: true }];
  return [];
}

/** Where each step goes: `{width, height, nodes: [{s, x, y, w, h, inner}], at}`; a
 * container's box is as large as the layout of its inner steps (nested up to `depth`). */
function layout(steps, down, depth = 0) {
  const valid = steps.filter((s) => s && typeof s.id === 'string' && s.id);
  const depthOf = depths(valid);
  const columns = [];
  for (const s of valid) {
    const d = depthOf.get(s.id) ?? 0;
    (columns[d] = columns[d] || []).push(s);
  }
  const sized = new Map();
  for (const s of valid) {
    const inner = isContainer(s) && depth < 3 ? innerOf(s) : [];
    if (inner.length) {
      const lay = layout(inner, down, depth + 1);
      sized.set(s.id, { w: Math.max(down ? NARROW_W : BOX_W, lay.width + 2 * PAD), h: HEADER + lay.height + PAD, inner: lay });
    } else sized.set(s.id, { w: down ? NARROW_W : BOX_W, h: BOX_H, inner: null });
  }
  const at = new Map();
  // Top to bottom, every step has its own row (in the order of their stages): side by side,
  // two boxes would not fit a phone without shrinking the text.
  const cols = down ? columns.flatMap((c) => (c || []).map((s) => [s])) : columns.map((c) => c || []);
  const gap = down ? NARROW_GAP : GAP_X;
  // Across the flow: each column's width (left to right) or each row's height (top to bottom).
  const across = cols.map((col) => Math.max(0, ...col.map((s) => (down ? sized.get(s.id).h : sized.get(s.id).w))));
  const margin = depth ? 0 : LEFT;
  let flow = down ? margin / 2 : margin;
  let extent = 0;
  cols.forEach((col, c) => {
    let along = down ? (depth ? 16 : 30) : (depth ? 0 : 10);  // top to bottom: room left for arrows past a row
    for (const s of col) {
      const size = sized.get(s.id);
      at.set(s.id, { ...size, s, x: down ? along : flow, y: down ? flow : along });
      along += (down ? size.w : size.h) + GAP_Y;
    }
    extent = Math.max(extent, along - GAP_Y);
    flow += across[c] + gap;
  });
  flow -= gap;
  const width = down ? extent + (depth ? 0 : 46) : flow + (depth ? 0 : 10);
  const height = down ? flow + (depth ? 0 : 10) : extent + (depth ? 0 : 10);
  return { width, height, at, valid };
}

function edgesOf(lay, down, flagged) {
  const arrows = [];
  let below = 0;  // room under (or, top to bottom, right of) the boxes for backward (cycle) arrows
  for (const s of lay.valid) {
    for (const dep of s.depends_on || []) {
      const from = lay.at.get(dep);
      const to = lay.at.get(s.id);
      if (!from || !to) continue;
      let d;
      if (down) {
        const [x1, y1, x2, y2] = [from.x + from.w / 2, from.y + from.h, to.x + to.w / 2, to.y];
        const back = y2 <= y1;  // a cycle's edge goes upwards: bend it right of the boxes
        const skips = y2 > y1 + NARROW_GAP + 1;  // past rows between them: bend it left of the boxes
        d = back
          ? `M${from.x + from.w},${from.y + from.h / 2} C${from.x + from.w + 45},${from.y + from.h / 2} ${to.x + to.w + 45},${to.y + to.h / 2} ${to.x + to.w},${to.y + to.h / 2}`
          : skips
            ? `M${from.x},${from.y + from.h / 2} C${from.x - 24},${from.y + from.h / 2} ${to.x - 24},${to.y + to.h / 2} ${to.x},${to.y + to.h / 2}`
            : `M${x1},${y1} C${x1},${(y1 + y2) / 2} ${x2},${(y1 + y2) / 2} ${x2},${y2}`;
      } else {
        const [x1, y1, x2, y2] = [from.x + from.w, from.y + from.h / 2, to.x, to.y + to.h / 2];
        const back = x2 <= x1;  // a cycle's edge goes backwards: bend it below the boxes
        if (back) below = 60;
        d = back
          ? `M${x1},${y1} C${x1 + 40},${y1 + 70} ${x2 - 40},${y2 + 70} ${x2},${y2}`
          : `M${x1},${y1} C${(x1 + x2) / 2},${y1} ${(x1 + x2) / 2},${y2} ${x2},${y2}`;
      }
      const cls = `edge${s.when ? ' conditional' : ''}${flagged.has(s.id) && flagged.has(dep) ? ' flagged' : ''}`;
      arrows.push(html`<path class=${cls} d=${d} marker-end="url(#arrow)"><title>${s.id} depends on ${dep}${
        s.when ? ` and runs only when ${s.when}` : ''}</title></path>`);
    }
  }
  return { arrows, below };
}

const short = (text, n) => (text.length > n ? `${text.slice(0, n - 1)}…` : text);

function containerLabel(s) {
  if (s.loop) return `loop${s.loop.max_iterations ? ` · up to ${s.loop.max_iterations}` : ''}`;
  return `foreach${s.foreach && s.foreach.items ? ` · ${s.foreach.items}` : ''}`;
}

/** The boxes (and inner graphs) of a layout. */
function drawn(lay, down, { statuses, flagged, names }) {
  const { arrows } = edgesOf(lay, down, flagged);
  return [arrows, lay.valid.map((s) => {
    const p = lay.at.get(s.id);
    const status = statuses[s.id];
    const cls = `node${isContainer(s) ? ' container' : ''}${s.item ? ' item' : ''}${s.when ? ' conditional' : ''}${
      status ? ` status-${status}` : ''}${flagged.has(s.id) ? ' flagged' : ''}`;
    return html`<g class=${cls} data-step=${s.item ? undefined : s.id} data-kind=${s.foreach ? 'foreach' : s.loop ? 'loop' : undefined}
                   transform=${`translate(${p.x},${p.y})`}>
      <rect width=${p.w} height=${p.h} rx="8" />
      <text x="10" y="19" class="id">${short(s.id, Math.floor(p.w / 8.5))}</text>
      <text x="10" y="36" class="sub">${isContainer(s) ? short(`${status ? `${status} · ` : ''}${containerLabel(s)}`, Math.floor(p.w / 6.5))
        : status || names[s.id] || agentLabel(s.agent)}</text>
      ${s.when && html`<text x=${p.w - 10} y="19" class="cond" text-anchor="end"><title>runs only when ${s.when}</title>if</text>`}
      ${p.inner && html`<g transform=${`translate(${PAD},${HEADER})`}>${drawn(p.inner, down, { statuses, flagged, names })}</g>`}
    </g>`;
  })];
}

/** `steps`: [{id, depends_on, agent, when?, foreach?, loop?, steps?}]; `statuses`: {id:
 * status}; `flagged`: ids with a problem. A step with `when` has dashed arrows and an "if"
 * mark; a foreach or loop is a box holding its inner steps. */
export function StepGraph({ steps, statuses = {}, flagged = new Set(), names = {} }) {
  const down = useNarrow();
  const lay = layout(steps, down);
  if (!lay.valid.length) return null;
  const { below } = edgesOf(lay, down, flagged);
  const width = lay.width;
  const height = lay.height + below;
  const described = lay.valid.map((s) => `${s.id}${isContainer(s) ? ` (${s.loop ? 'loop' : 'foreach'})` : ''}${
    (s.depends_on || []).length ? ` after ${s.depends_on.join(', ')}` : ''}${s.when ? ` when ${s.when}` : ''}`).join('; ');
  return html`<figure class="graph">
    <svg viewBox=${`0 0 ${width} ${height}`} width=${width} height=${height} role="img"
         aria-label=${`Step graph: ${described}`}>
      <defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">
        <path d="M0,0 L10,5 L0,10 z" class="arrowhead" /></marker></defs>
      ${drawn(lay, down, { statuses, flagged, names })}
    </svg>
  </figure>`;
}
