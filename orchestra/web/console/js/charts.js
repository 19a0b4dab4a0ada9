// Bar charts of the usage page: one row a key (a label, its bar, its value), in HTML so a
// long name is cut with an ellipsis in its own column (its whole text in the title) and
// never runs over a bar. Rows are sorted: days in order, anything else by size, largest first.
import { html } from './html.js';
import { usd } from './money.js';

/** Horizontal bars of cost (or, when nothing is priced, calls) per row key. `byKey`: keep
 * the keys' own order (days), else largest first. */
export function BarChart({ rows, title, label, byKey = false }) {
  const priced = rows.some((r) => r.cost_usd != null);
  const measure = priced ? (r) => (r.cost_usd != null ? Number(r.cost_usd) : 0) : (r) => r.calls;
  const sorted = [...rows].sort(byKey
    ? (a, b) => String(a.key).localeCompare(String(b.key))
    : (a, b) => measure(b) - measure(a) || String(label(a.key)).localeCompare(String(label(b.key))));
  const top = Math.max(...rows.map(measure), 0) || 1;
  return html`<figure class="chart">
    <figcaption>${title} (${priced ? 'cost, USD' : 'calls'})</figcaption>
    <div class="bars" role="img" aria-label=${title}>
      ${sorted.map((r) => { const name = String(label(r.key));
        return html`<div class="bar-row" key=${String(r.key)} data-key=${String(r.key)}>
          <span class="bar-label" title=${name}>${name}</span>
          <span class="bar-track"><span class="bar" style=${{ width: `${Math.max(0.5, (measure(r) / top) * 100)}%` }}></span></span>
          <span class="bar-value">${priced ? usd(r.cost_usd) : `${r.calls} calls`}</span>
        </div>`; })}
    </div>
  </figure>`;
}
