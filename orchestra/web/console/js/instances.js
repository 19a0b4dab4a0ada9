// A container's instances in the run view (SPEC §8): foreach items (`research[3]`) and loop
// iterations (`improve#2`), each with its status, output, streamed text and inner steps,
// grouped under their container with counts by status. A large group starts collapsed and
// is shown a page at a time, so a 1,000-item run never puts 1,000 rows in the page.
import { html, useState } from './html.js';
import { StatusBadge, shown } from './ui.js';

export const PAGE_SIZE = 50;
const OPEN_UP_TO = 20;  // a group with more instances than this starts collapsed
const TAIL = /^(.*)(?:\[(\d+)\]|#(\d+))$/;

/** The path an instance belongs to: `research[3]` → `research`, `research[3].fetch` →
 * `research[3]`, `improve#2` → `improve`; null for a top-level step. */
export function parentOf(path) {
  const tail = TAIL.exec(path);
  if (tail) return tail[1];
  const dot = path.lastIndexOf('.');
  return dot < 0 ? null : path.slice(0, dot);
}

/** Item index or iteration number of an item/iteration path, else null. */
function numberOf(path) {
  const tail = TAIL.exec(path);
  return tail ? Number(tail[2] ?? tail[3]) : null;
}

/** {parent path: [child paths]}: items and iterations in number order, inner steps as seen. */
export function childrenOf(paths) {
  const out = new Map();
  for (const path of paths) {
    const parent = parentOf(path);
    if (parent === null) continue;
    if (!out.has(parent)) out.set(parent, []);
    out.get(parent).push(path);
  }
  for (const list of out.values()) {
    if (numberOf(list[0]) !== null) list.sort((a, b) => numberOf(a) - numberOf(b));
  }
  return out;
}


/** A short text of an item's value: a string as it is; of an object, its name, title,
 * topic, label or id, else its first text field; else compact JSON; cut at 40 characters. */
export function shortText(value) {
  let text;
  if (value === null || value === undefined) return '';
  if (typeof value === 'string') text = value;
  else if (typeof value !== 'object' || Array.isArray(value)) text = JSON.stringify(value);
  else {
    const named = ['name', 'title', 'topic', 'label', 'id'].find((k) => ['string', 'number'].includes(typeof value[k]));
    const first = Object.values(value).find((v) => typeof v === 'string' && v.trim());
    text = named ? String(value[named]) : first !== undefined ? first : JSON.stringify(value);
  }
  text = text.replace(/\s+/g, ' ').trim();
  return text.length > 40 ? `${text.slice(0, 39)}…` : text;
}

/** An instance's name: an item by a short text of its value — the label its step_started
 * carries (`item`, the engine's), else the value followed from the template
 * (`view.itemValue`) — its index beside it (the index alone when neither is known); an
 * iteration by its number. */
function Label({ path, view }) {
  const tail = TAIL.exec(path);
  if (!tail) return html`<span class="instance-name">${path.slice(path.lastIndexOf('.') + 1)}</span>`;
  if (tail[2] === undefined) return html`<span class="instance-name">iteration ${tail[3]}</span>`;
  const labelled = (view.steps[path] || {}).itemLabel;
  const known = labelled || (view.itemValue ? view.itemValue(tail[1], Number(tail[2])) : undefined);
  const text = known === undefined || known === null ? '' : shortText(known);
  return text
    ? html`<span class="instance-name" title=${`item ${tail[2]}`}>${text}</span> <small class="instance-index">#${tail[2]}</small>`
    : html`<span class="instance-name">item ${tail[2]}</span>`;
}

function countByStatus(paths, steps) {
  const counts = {};
  for (const p of paths) {
    const status = (steps[p] || {}).status || 'pending';
    counts[status] = (counts[status] || 0) + 1;
  }
  return counts;
}

/** One instance: its line (status, output or text, error), its questions, and below it
 * its inner steps or, for a nested container, its own group. */
function InstanceRow({ path, view }) {
  const step = view.steps[path] || { status: 'pending' };
  const kids = view.children.get(path) || [];
  const text = step.text || (step.output !== null && step.output !== undefined ? shown(step.output) : '');
  return html`<li class=${`instance status-${step.status}`} data-path=${path}>
    <div class="instance-line"><${Label} path=${path} view=${view} /> <${StatusBadge} status=${step.status} />
      ${step.attempt > 1 && html`<small> attempt ${step.attempt}</small>`}
      ${step.skipped && html`<small> (${step.skipped})</small>`}</div>
    ${text && html`<pre class=${step.text && step.status === 'running' ? 'stream' : 'output'}>${text}</pre>`}
    ${step.error && html`<p class="error">${step.error}</p>`}
    ${view.renderQuestions(path)}
    ${kids.length > 0 && (numberOf(kids[0]) !== null
      ? html`<${InstanceGroup} path=${path} view=${view} />`
      : html`<ul class="inner-steps">${kids.map((k) => html`<${InstanceRow} key=${k} path=${k} view=${view} />`)}</ul>`)}
  </li>`;
}

/** The items or iterations of the container at `path`: counts by status (each a filter),
 * collapsed when large, a page of PAGE_SIZE at a time. `view` is {steps, children,
 * renderQuestions(path), itemValue(container path, index)}. */
export function InstanceGroup({ path, view }) {
  const all = view.children.get(path) || [];
  const [open, setOpen] = useState(null);  // null: by size
  const [page, setPage] = useState(0);
  const [only, setOnly] = useState('');
  const counts = countByStatus(all, view.steps);
  const list = only ? all.filter((p) => ((view.steps[p] || {}).status || 'pending') === only) : all;
  const isOpen = open === null ? all.length <= OPEN_UP_TO : open;
  const pages = Math.max(1, Math.ceil(list.length / PAGE_SIZE));
  const at = Math.min(page, pages - 1);
  const rows = list.slice(at * PAGE_SIZE, (at + 1) * PAGE_SIZE);
  const noun = all.length && TAIL.exec(all[0])[3] !== undefined ? 'iterations' : 'items';
  return html`<div class="instances" data-container=${path} data-total=${all.length}>
    <div class="instance-counts" role="group" aria-label=${`${path}: ${noun} by status`}>
      <button type="button" class="link toggle" aria-expanded=${isOpen ? 'true' : 'false'}
              onClick=${() => setOpen(!isOpen)}>${isOpen ? 'Hide' : 'Show'} ${all.length} ${noun}</button>
      ${Object.entries(counts).map(([status, n]) => html`<button type="button" class=${`count status-${status}`}
          data-status=${status} aria-pressed=${only === status ? 'true' : 'false'}
          onClick=${() => { setOnly(only === status ? '' : status); setPage(0); setOpen(true); }}>${status} ${n}</button>`)}
    </div>
    ${isOpen && html`
      <ol class="instance-list">${rows.map((p) => html`<${InstanceRow} key=${p} path=${p} view=${view} />`)}</ol>
      ${pages > 1 && html`<nav class="pager row" aria-label=${`${path} pages`}>
        <button type="button" disabled=${at === 0} onClick=${() => setPage(at - 1)}>Previous ${PAGE_SIZE}</button>
        <span class="page-at">${noun} ${at * PAGE_SIZE + 1}–${at * PAGE_SIZE + rows.length} of ${list.length}</span>
        <button type="button" disabled=${at >= pages - 1} onClick=${() => setPage(at + 1)}>Next ${PAGE_SIZE}</button>
      </nav>`}`}
  </div>`;
}
