// Inbound webhooks: list, create (URL and signing secret shown once), delete. Calls are
// signed per Standard Webhooks (docs/api.md, "Inbound webhooks").
import { html, useState } from '../html.js';
import { api, apiAll } from '../api.js';
import { TextField, Select, ErrorBox, Notice, useLoad, problemsByField, when, ConfirmButton } from '../ui.js';
import { scoped, inWorkspace } from '../workspace.js';

function CreateHook({ templates, onCreated }) {
  const [templateId, setTemplateId] = useState('');
  const [input, setInput] = useState('body');
  const [error, setError] = useState(null);
  const problems = problemsByField(error);
  const chosen = templateId || (templates[0] && templates[0].template_id) || '';
  const submit = async (e) => {
    e.preventDefault();
    try {
      const made = await api('POST', '/workflow/hook', inWorkspace({ template_id: chosen, input }));
      setError(null);
      onCreated(made);
    } catch (err) {
      setError(err);
    }
  };
  return html`<form class="card" onSubmit=${submit} aria-labelledby="create-hook">
    <h2 id="create-hook">Create a hook</h2>
    <div class="grid">
      <${Select} label="Template" value=${chosen} onChange=${setTemplateId} problem=${problems.template_id}
                 options=${templates.map((t) => [t.template_id, t.name])} />
      <${TextField} label="Input (CEL)" value=${input} onInput=${setInput} required problem=${problems.input}
                    hint="over body, headers and query; the run's input" />
    </div>
    <${ErrorBox} error=${error} />
    <button type="submit" class="primary" disabled=${!chosen}>Create hook</button>
  </form>`;
}

export function Hooks() {
  const [data, loadError, reload] = useLoad(() => api('GET', scoped('/workflow/hook')));
  const [templates] = useLoad(() => apiAll(scoped('/workflow/template'), 'templates'));
  const [created, setCreated] = useState(null);
  const [notice, setNotice] = useState('');
  const [error, setError] = useState(null);
  const remove = async (h) => {
    try {
      await api('DELETE', `/workflow/hook/${h.hook_id}`);
      setNotice('Hook deleted.');
      reload();
    } catch (err) {
      setError(err);
    }
  };
  return html`<section>
    <h1>Webhooks</h1>
    <${Notice} text=${notice} />
    <${ErrorBox} error=${loadError || error} />
    ${created && html`<div class="card" role="status" data-new-hook>
      <p>Hook created. Senders POST to <code>${created.url}</code>, signed per Standard Webhooks
        with this secret. Copy it now: it will not be shown again.</p>
      <p><code class="secret">${created.secret}</code></p>
      <button type="button" onClick=${() => setCreated(null)}>Done</button>
    </div>`}
    <div class="table-wrap"><table class="stack">
      <thead><tr><th>Template</th><th>Input</th><th>URL</th><th>Created</th><th>Actions</th></tr></thead>
      <tbody>
        ${data && data.hooks.length === 0 && html`<tr><td colspan="5">No hooks yet: create one below.</td></tr>`}
        ${data && data.hooks.map((h) => html`<tr key=${h.hook_id} data-hook=${h.hook_id}>
          <td data-label="Template">${h.template_name}</td>
          <td data-label="Input"><code>${h.input}</code></td>
          <td data-label="URL" class="wrap"><code>${h.url}</code></td>
          <td data-label="Created">${when(h.created_at)}</td>
          <td class="actions" data-label="Actions">
            <${ConfirmButton} label="Delete" confirm="Delete this hook" onConfirm=${() => remove(h)} />
          </td></tr>`)}
      </tbody>
    </table></div>
    ${templates && html`<${CreateHook} templates=${templates.templates} onCreated=${(made) => { setCreated(made); setNotice(''); reload(); }} />`}
  </section>`;
}
