// Usage: what the model calls of your runs (an administrator's: everyone's) used and
// cost, from GET /api/v1/usage — a chart by day, a chart by template, and a table.
import { html, useState } from '../html.js';
import { api } from '../api.js';
import { ErrorBox, useLoad } from '../ui.js';
import { usd } from '../money.js';
import { BarChart } from '../charts.js';
import { scoped, workspaceOf } from '../workspace.js';

const GROUPS = ['day', 'template', 'model', 'provider', 'user', 'workspace'];

function query(groupBy, from, to) {
  const params = new URLSearchParams({ group_by: groupBy, ...(from ? { from } : {}), ...(to ? { to } : {}) });
  return scoped(`/usage?${params}`);
}

/** A workspace's name (its id when it is not one of yours: a deleted one). */
function workspaceName(id) {
  const w = workspaceOf(id);
  return w ? w.name : String(id);
}

export function Usage() {
  const [from, setFrom] = useState('');
  const [to, setTo] = useState('');
  const [groupBy, setGroupBy] = useState('model');
  const [days, dayError] = useLoad(() => api('GET', query('day', from, to)), [from, to]);
  const [templates] = useLoad(() => api('GET', query('template', from, to)), [from, to]);
  const [names] = useLoad(() => api('GET', scoped('/workflow/template?limit=1000')).catch(() => ({ templates: [] })), []);
  const [table, tableError] = useLoad(() => api('GET', query(groupBy, from, to)), [groupBy, from, to]);
  const nameOf = (id) => ((names && names.templates.find((t) => t.template_id === id)) || {}).name || (id ? id.slice(0, 8) : 'deleted');
  return html`<section class="usage-page">
    <h1>Usage</h1>
    <p class="hint">Model calls, tokens and their cost (exact USD; "unknown" where a model has no known price). A step counts on the UTC day it finished.</p>
    <form class="filters" onSubmit=${(e) => e.preventDefault()}>
      <label>From <input type="date" value=${from} onInput=${(e) => setFrom(e.target.value)} /></label>
      <label>To <input type="date" value=${to} onInput=${(e) => setTo(e.target.value)} /></label>
    </form>
    <${ErrorBox} error=${dayError || tableError} />
    ${days && (days.rows.length
      ? html`<${BarChart} rows=${days.rows} title="By day" label=${(k) => k} byKey />`
      : html`<p>No model calls in this period.</p>`)}
    ${templates && templates.rows.length > 0 && html`<${BarChart} rows=${templates.rows} title="By template" label=${nameOf} />`}
    <label>Group the table by <select value=${groupBy} onChange=${(e) => setGroupBy(e.target.value)}>
      ${GROUPS.map((g) => html`<option value=${g} selected=${g === groupBy}>${g}</option>`)}</select></label>
    <div class="table-wrap"><table class="stack">
      <thead><tr><th>${groupBy}</th><th>Runs</th><th>Calls</th><th>Input tokens</th><th>Output tokens</th><th>Cost</th></tr></thead>
      <tbody>${table && table.rows.map((r) => html`<tr key=${String(r.key)}>
        <td data-label=${groupBy}>${groupBy === 'template' ? nameOf(r.key) : groupBy === 'workspace' ? workspaceName(r.key) : String(r.key)}</td>
        <td data-label="Runs">${r.runs}</td><td data-label="Calls">${r.calls}</td>
        <td data-label="Input tokens">${r.input_tokens}</td><td data-label="Output tokens">${r.output_tokens}</td>
        <td data-label="Cost">${usd(r.cost_usd)}</td></tr>`)}</tbody>
    </table></div>
  </section>`;
}
