// Providers: the instance-wide ones (administrators), or the chosen workspace's own (its
// admins and owners): list, add, check (the provider's own error), delete (the workers
// and nodes that block it).
import { html, useState } from '../html.js';
import { api } from '../api.js';
import { TextField, Select, ErrorBox, Notice, useLoad, problemsByField, when, ConfirmButton } from '../ui.js';
import { scoped, inWorkspace, workspaceOf } from '../workspace.js';

// The kinds the API accepts (docs/api.md, "Providers"); anything else is its 422.
export const PROVIDER_KINDS = ['openai', 'deepseek', 'anthropic', 'ollama', 'openai_compatible'];

const EMPTY = { name: '', provider: 'openai', model_id: '', base_url: '', api_key: '' };

function AddProvider({ onAdded }) {
  const [form, setForm] = useState(EMPTY);
  const [error, setError] = useState(null);
  const set = (key) => (value) => setForm({ ...form, [key]: value });
  const problems = problemsByField(error);
  const submit = async (e) => {
    e.preventDefault();
    const body = { name: form.name, provider: form.provider, model_id: form.model_id };
    if (form.base_url) body.base_url = form.base_url;
    if (form.api_key) body.api_key = form.api_key;
    try {
      await api('POST', '/provider', inWorkspace(body));
      setForm(EMPTY);
      setError(null);
      onAdded(`Provider '${body.name}' added.`);
    } catch (err) {
      setError(err);
    }
  };
  return html`<form class="card" onSubmit=${submit} aria-labelledby="add-provider">
    <h2 id="add-provider">Add a provider</h2>
    <div class="grid">
      <${TextField} label="Name" value=${form.name} onInput=${set('name')} required problem=${problems.name} />
      <${Select} label="Kind" value=${form.provider} onChange=${set('provider')} problem=${problems.provider}
                 options=${PROVIDER_KINDS.map((k) => [k, k])} />
      <${TextField} label="Model id" value=${form.model_id} onInput=${set('model_id')} required
                    problem=${problems.model_id} hint="e.g. gpt-4o-mini, deepseek-chat" />
      <${TextField} label="Base URL" value=${form.base_url} onInput=${set('base_url')} type="url"
                    problem=${problems.base_url}
                    hint=${form.provider === 'openai_compatible' ? 'required for this kind' : 'optional: overrides the default endpoint'} />
      <${TextField} label="API key" value=${form.api_key} onInput=${set('api_key')} type="password"
                    autocomplete="off" problem=${problems.api_key} hint="stored encrypted; shown masked" />
    </div>
    <${ErrorBox} error=${error} />
    <button type="submit" class="primary">Add provider</button>
  </form>`;
}

export function Providers() {
  const [data, loadError, reload] = useLoad(() => api('GET', scoped('/provider')));
  const workspace = workspaceOf();
  const [results, setResults] = useState({});
  const [notice, setNotice] = useState('');
  const show = (id, result) => setResults({ ...results, [id]: result });
  const check = async (p) => {
    show(p.provider_id, { busy: true });
    try {
      const answer = await api('POST', scoped(`/provider/${p.provider_id}/check`));
      if (!answer.ok) { show(p.provider_id, { error: answer.error }); return; }  // cannot be reached or refuses
      show(p.provider_id, { ok: `Works: ${answer.models.length} models (${answer.models.slice(0, 5).join(', ')}${answer.models.length > 5 ? ', …' : ''}).` });
    } catch (err) {
      show(p.provider_id, { error: err });
    }
  };
  const remove = async (p) => {
    try {
      await api('DELETE', scoped(`/provider/${p.provider_id}`));
      setNotice(`Provider '${p.name}' deleted.`);
      reload();
    } catch (err) {
      show(p.provider_id, { error: err });
    }
  };
  return html`<section>
    <h1>Providers</h1>
    <p class="hint" data-provider-scope>${workspace
      ? html`The providers of the workspace <strong>${workspace.name}</strong> (its admins and owners keep them); its
          workers may also use the instance-wide ones.`
      : html`The instance-wide providers (administrators keep them), usable by every workspace's workers. Choose a
          workspace in the header for its own.`}</p>
    <${Notice} text=${notice} />
    <${ErrorBox} error=${loadError} />
    <div class="table-wrap"><table class="stack">
      <thead><tr><th>Name</th><th>Kind</th><th>Model</th><th>Base URL</th><th>Key</th><th>Added</th><th>Actions</th></tr></thead>
      <tbody>
        ${data && data.providers.length === 0 && html`<tr><td colspan="7">No providers yet: add one below.</td></tr>`}
        ${data && data.providers.map((p) => { const r = results[p.provider_id] || {}; return html`
          <tr key=${p.provider_id} data-provider=${p.name}>
            <td data-label="Name">${p.name}</td><td data-label="Kind">${p.provider}</td><td data-label="Model">${p.model_id}</td>
            <td data-label="Base URL" class="wrap">${p.base_url || '–'}</td>
            <td data-label="Key"><code>${p.api_key || 'none'}</code></td><td data-label="Added">${when(p.created_at)}</td>
            <td class="actions" data-label="Actions">
              <button type="button" onClick=${() => check(p)} disabled=${r.busy}>${r.busy ? 'Checking…' : 'Check'}</button>
              <${ConfirmButton} label="Delete" confirm=${`Delete ${p.name}`} onConfirm=${() => remove(p)} />
            </td>
          </tr>
          ${(r.ok || r.error) && html`<tr class="result"><td colspan="7">
            ${r.ok && html`<p class="ok" role="status">${r.ok}</p>`}
            <${ErrorBox} error=${r.error} />
            ${r.error && r.error.detail && r.error.detail.workers && html`<ul class="blockers">
              ${r.error.detail.workers.map((w) => html`<li>worker <strong>${w.name}</strong> <code>${w.worker_id}</code></li>`)}
              ${(r.error.detail.nodes || []).map((n) => html`<li>system node <strong>${n}</strong></li>`)}
            </ul>`}
          </td></tr>`}`; })}
      </tbody>
    </table></div>
    <${AddProvider} onAdded=${(text) => { setNotice(text); reload(); }} />
  </section>`;
}
