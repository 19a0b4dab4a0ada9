// The audit log (SPEC §16): who changed what, newest first, from GET /audit — the chosen
// workspace's chain (its admins and owners), or with "All workspaces" every chain you may
// read (a super administrator's: the instance-level entries too). Filters by actor,
// action, target id and dates; "Load more" follows the cursor.
import { html, useState, useEffect } from '../html.js';
import { api } from '../api.js';
import { TextField, ErrorBox, useId, when, shown } from '../ui.js';
import { scoped } from '../workspace.js';

const PAGE = 50;
// The action names the server writes (docs/api.md, "Audit log"), offered as you type.
export const ACTIONS = [
  'template.create', 'template.update', 'template.delete', 'template.restore',
  'member.add', 'member.update', 'member.remove', 'workspace.create', 'workspace.update', 'workspace.delete',
  'key.create', 'key.revoke', 'secret.create', 'secret.update', 'secret.delete',
  'run.start', 'run.reply', 'run.cancel', 'run.retry', 'run.fork', 'run.top_up',
  'worker.create', 'worker.update', 'worker.delete', 'schedule.create', 'schedule.update', 'schedule.delete',
  'hook.create', 'hook.delete', 'subscription.create', 'subscription.delete', 'file.create', 'file.delete',
  'provider.create', 'provider.update', 'provider.delete', 'skill.create', 'skill.update', 'skill.delete',
  'mcp_server.create', 'mcp_server.update', 'mcp_server.delete', 'node.update',
  'auth.login', 'auth.login_failed', 'user.authority', 'user.delete',
];
const EMPTY = { actor: '', action: '', target_id: '', from: '', to: '' };

function auditPath(filters, cursor) {
  const params = new URLSearchParams({ limit: String(PAGE) });
  for (const [name, value] of Object.entries(filters)) if (value.trim()) params.set(name, value.trim());
  if (cursor) params.set('cursor', cursor);
  return scoped(`/audit?${params}`);
}

function Actor({ actor }) {
  const name = actor.user_name || (actor.via === 'store' ? 'the store (command line)' : '–');
  return html`<span title=${actor.user_id || ''}>${name}</span>${actor.via !== 'token' && html` <small>via ${actor.via}</small>`}`;
}

function Changes({ changes }) {
  const fields = Object.entries(changes || {});
  if (!fields.length) return '–';
  const value = (v) => (v === null || v === undefined ? '–' : shown(v));
  return html`<ul class="plain changes">${fields.map(([field, change]) => html`<li key=${field}>
    <code>${field}</code>: ${change && typeof change === 'object' && 'to' in change  // a {from, to} pair
      ? html`${value(change.from)} → ${value(change.to)}` : value(change)}</li>`)}</ul>`;
}

function Filters({ applied, onApply }) {
  const [form, setForm] = useState(applied);
  const listId = useId('actions');
  const set = (key) => (value) => setForm({ ...form, [key]: value });
  return html`<form class="card filters audit-filters" onSubmit=${(e) => { e.preventDefault(); onApply(form); }}
                    aria-label="Filter the audit log">
    <div class="grid">
      <${TextField} label="Actor" value=${form.actor} onInput=${set('actor')} hint="a user name or user_id" />
      <${TextField} label="Action" value=${form.action} onInput=${set('action')} list=${listId} hint="an exact name, e.g. member.add" />
      <datalist id=${listId}>${ACTIONS.map((a) => html`<option value=${a} />`)}</datalist>
      <${TextField} label="Target id" value=${form.target_id} onInput=${set('target_id')} />
      <${TextField} label="From" type="date" value=${form.from} onInput=${(from) => setForm({ ...form, from })} hint="included (UTC)" />
      <${TextField} label="To" type="date" value=${form.to} onInput=${(to) => setForm({ ...form, to })} hint="excluded (UTC)" />
    </div>
    <div class="row">
      <button type="submit" class="primary">Filter</button>
      <button type="button" onClick=${() => { setForm(EMPTY); onApply(EMPTY); }}>Clear</button>
    </div>
  </form>`;
}

export function Audit() {
  const [filters, setFilters] = useState(EMPTY);
  const [entries, setEntries] = useState(null);
  const [cursor, setCursor] = useState(null);
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const load = async (from) => {
    setBusy(true);
    try {
      const page = await api('GET', auditPath(filters, from));
      setEntries(from ? [...(entries || []), ...page.entries] : page.entries);
      setCursor(page.next_cursor);
      setError(null);
    } catch (err) {
      if (!from) setEntries(null);
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  useEffect(() => { load(null); }, [filters]);
  return html`<section class="audit-page">
    <h1>Audit log</h1>
    <p class="hint">Every change, newest first: who (and through what: a token, an API key, a hook, a schedule), what,
      to which target, and the fields it changed (secret values and keys as ***). A workspace's admins and owners
      read its log; a super administrator reads every one, logins and role changes included.</p>
    <${Filters} applied=${filters} onApply=${setFilters} />
    <${ErrorBox} error=${error} />
    <div class="table-wrap"><table class="stack audit">
      <thead><tr><th>At</th><th>Actor</th><th>Action</th><th>Target</th><th>Changes</th></tr></thead>
      <tbody>
        ${entries && entries.length === 0 && html`<tr><td colspan="5">No entries${Object.values(filters).some((v) => v.trim()) ? ' match the filter' : ' yet'}.</td></tr>`}
        ${(entries || []).map((e) => html`<tr key=${e.audit_id} data-audit=${e.action}>
          <td data-label="At"><time datetime=${e.at}>${when(e.at)}</time></td>
          <td data-label="Actor"><${Actor} actor=${e.actor} /></td>
          <td data-label="Action"><code>${e.action}</code></td>
          <td data-label="Target" class="wrap">${e.target.type} <strong title=${e.target.id || ''}>${e.target.name || e.target.id || ''}</strong></td>
          <td data-label="Changes" class="wrap"><${Changes} changes=${e.changes} /></td>
        </tr>`)}
      </tbody>
    </table></div>
    ${cursor && html`<p><button type="button" onClick=${() => load(cursor)} disabled=${busy}>${busy ? 'Loading…' : 'Load more'}</button></p>`}
  </section>`;
}
