// A picture of a template's step graph as SVG: one column per dependency depth (one row,
// top to bottom, on a narrow screen), an arrow from each dependency to the step that waits
// for it, each box coloured by its status. The picture shrinks to fit its card.
import { html } from './html.js';

const BOX_W = 150;
const BOX_H = 46;
const GAP_X = 60;
const GAP_Y = 18;
const LEFT = 40;  // room left of the first column for a cycle's arrow coming back

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

/** Narrow screens draw the graph top to bottom (a stage per row) instead of left to right. */
const narrow = () => typeof matchMedia === 'function' && matchMedia('(max-width: 600px)').matches;

function agentLabel(agent) {
  if (!agent) return '';
  if (agent.human) return 'human';
  if (agent.node) return `node ${agent.node}`;
  if (agent.worker) return 'worker';
  return '';
}

/** `steps`: [{id, depends_on, agent}]; `statuses`: {id: status}; `flagged`: ids with a problem. */
export function StepGraph({ steps, statuses = {}, flagged = new Set(), names = {} }) {
  const valid = steps.filter((s) => s && typeof s.id === 'string' && s.id);
  if (!valid.length) return null;
  const depth = depths(valid);
  const columns = [];
  for (const s of valid) {
    const d = depth.get(s.id) ?? 0;
    (columns[d] = columns[d] || []).push(s);
  }
  const at = new Map();
  const down = narrow();
  const [stepX, stepY] = down ? [BOX_W + GAP_Y, BOX_H + GAP_X] : [BOX_W + GAP_X, BOX_H + GAP_Y];
  columns.forEach((col, c) => (col || []).forEach((s, r) => at.set(s.id, down
    ? { x: 10 + r * stepX, y: LEFT / 2 + c * stepY }
    : { x: LEFT + c * stepX, y: 10 + r * stepY })));
  const widest = Math.max(...columns.map((c) => (c ? c.length : 0)));
  const width = down ? 20 + widest * stepX - GAP_Y + 50 : LEFT + 10 + columns.length * stepX - GAP_X;
  const height = down ? LEFT / 2 + 10 + columns.length * stepY - GAP_X : 20 + widest * stepY - GAP_Y;
  const arrows = [];
  let below = 0;  // room under (or, top to bottom, right of) the boxes for backward (cycle) arrows
  for (const s of valid) {
    for (const dep of s.depends_on || []) {
      const from = at.get(dep);
      const to = at.get(s.id);
      if (!from || !to) continue;
      let d;
      if (down) {
        const [x1, y1, x2, y2] = [from.x + BOX_W / 2, from.y + BOX_H, to.x + BOX_W / 2, to.y];
        const back = y2 <= y1;  // a cycle's edge goes upwards: bend it right of the boxes
        d = back
          ? `M${from.x + BOX_W},${from.y + BOX_H / 2} C${from.x + BOX_W + 45},${from.y + BOX_H / 2} ${to.x + BOX_W + 45},${to.y + BOX_H / 2} ${to.x + BOX_W},${to.y + BOX_H / 2}`
          : `M${x1},${y1} C${x1},${(y1 + y2) / 2} ${x2},${(y1 + y2) / 2} ${x2},${y2}`;
      } else {
        const [x1, y1, x2, y2] = [from.x + BOX_W, from.y + BOX_H / 2, to.x, to.y + BOX_H / 2];
        const back = x2 <= x1;  // a cycle's edge goes backwards: bend it below the boxes
        if (back) below = 60;
        d = back
          ? `M${x1},${y1} C${x1 + 40},${y1 + 70} ${x2 - 40},${y2 + 70} ${x2},${y2}`
          : `M${x1},${y1} C${(x1 + x2) / 2},${y1} ${(x1 + x2) / 2},${y2} ${x2},${y2}`;
      }
      arrows.push(html`<path class=${'edge' + (flagged.has(s.id) && flagged.has(dep) ? ' flagged' : '')} d=${d}
                             marker-end="url(#arrow)"><title>${s.id} depends on ${dep}</title></path>`);
    }
  }
  const described = valid.map((s) => `${s.id}${(s.depends_on || []).length ? ` after ${s.depends_on.join(', ')}` : ''}`).join('; ');
  return html`<figure class="graph">
    <svg viewBox=${`0 0 ${width} ${height + below}`} width=${width} height=${height + below} role="img"
         aria-label=${`Step graph: ${described}`}>
      <defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">
        <path d="M0,0 L10,5 L0,10 z" class="arrowhead" /></marker></defs>
      ${arrows}
      ${valid.map((s) => { const p = at.get(s.id); const status = statuses[s.id]; return html`
        <g class=${`node${status ? ` status-${status}` : ''}${flagged.has(s.id) ? ' flagged' : ''}`} data-step=${s.id}
           transform=${`translate(${p.x},${p.y})`}>
          <rect width=${BOX_W} height=${BOX_H} rx="8" />
          <text x="10" y="19" class="id">${s.id.length > 18 ? `${s.id.slice(0, 17)}…` : s.id}</text>
          <text x="10" y="36" class="sub">${status || names[s.id] || agentLabel(s.agent)}</text>
        </g>`; })}
    </svg>
  </figure>`;
}
