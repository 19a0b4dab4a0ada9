// API keys: list (with each key's last use), create (the secret shown once, to copy),
// revoke. Keys act as you, narrowed to their scopes (docs/api.md, "API keys").
import { html, useState } from '../html.js';
import { api, apiAll } from '../api.js';
import { TextField, ErrorBox, Notice, useLoad, problemsByField, when, ConfirmButton } from '../ui.js';
import { scoped, inWorkspace } from '../workspace.js';

export const SCOPES = ['run:start', 'run:read', 'run:reply', 'run:cancel', 'template:read', 'template:write'];

/** The templates a key may start, chosen by name from those you may run; none: any. */
function TemplateChoice({ templates, chosen, setChosen, problem }) {
  const toggle = (id) => setChosen(chosen.includes(id) ? chosen.filter((t) => t !== id) : [...chosen, id]);
  return html`<fieldset class=${`key-templates${problem ? ' invalid' : ''}`}>
    <legend>Templates it may start <small>(none chosen: any you may run)</small></legend>
    ${templates.length === 0 && html`<p class="hint">No templates yet: the key may start any you make or are shared.</p>`}
    <div class="choices">${templates.map((t) => html`<label key=${t.template_id} class="check">
      <input type="checkbox" checked=${chosen.includes(t.template_id)} onChange=${() => toggle(t.template_id)} />
      ${t.name}</label>`)}</div>
    ${problem && html`<p class="problem">${problem}</p>`}
  </fieldset>`;
}

function CreateKey({ templates, onCreated }) {
  const [name, setName] = useState('');
  const [scopes, setScopes] = useState(['run:start', 'run:read']);
  const [chosen, setChosen] = useState([]);
  const [expires, setExpires] = useState('');
  const [error, setError] = useState(null);
  const problems = problemsByField(error);
  const templateProblem = Object.entries(problems).find(([field]) => field === 'templates' || field.startsWith('templates.'));
  const toggle = (scope) => setScopes(scopes.includes(scope) ? scopes.filter((s) => s !== scope) : [...scopes, scope]);
  const submit = async (e) => {
    e.preventDefault();
    const body = { name, scopes };
    if (chosen.length) body.templates = chosen;
    if (expires) body.expires_at = new Date(expires).toISOString();
    try {
      const made = await api('POST', '/auth/key', inWorkspace(body));
      setName(''); setChosen([]); setExpires(''); setError(null);
      onCreated(made);
    } catch (err) {
      setError(err);
    }
  };
  return html`<form class="card" onSubmit=${submit} aria-labelledby="create-key">
    <h2 id="create-key">Create a key</h2>
    <div class="grid">
      <${TextField} label="Name" value=${name} onInput=${setName} required problem=${problems.name} />
      <${TextField} label="Expires (optional)" value=${expires} onInput=${setExpires} type="datetime-local"
                    problem=${problems.expires_at} />
    </div>
    <fieldset><legend>Scopes</legend>
      ${SCOPES.map((scope) => html`<label key=${scope} class="check">
        <input type="checkbox" checked=${scopes.includes(scope)} onChange=${() => toggle(scope)} /> ${scope}</label>`)}
      ${problems.scopes && html`<p class="error">${problems.scopes}</p>`}
    </fieldset>
    <${TemplateChoice} templates=${templates} chosen=${chosen} setChosen=${setChosen} problem=${templateProblem && templateProblem[1]} />
    <${ErrorBox} error=${error} />
    <button type="submit" class="primary">Create key</button>
  </form>`;
}

export function Keys() {
  const [data, loadError, reload] = useLoad(() => api('GET', scoped('/auth/key')));
  const [templates] = useLoad(async () => (await apiAll(scoped('/workflow/template'), 'templates')).templates);
  const names = Object.fromEntries((templates || []).map((t) => [t.template_id, t.name]));
  const [created, setCreated] = useState(null);
  const [notice, setNotice] = useState('');
  const [error, setError] = useState(null);
  const revoke = async (k) => {
    try {
      await api('DELETE', `/auth/key/${k.key_id}`);
      setNotice(`Key '${k.name}' revoked.`);
      reload();
    } catch (err) {
      setError(err);
    }
  };
  return html`<section>
    <h1>API keys</h1>
    <${Notice} text=${notice} />
    <${ErrorBox} error=${loadError || error} />
    ${created && html`<div class="card" role="status" data-new-key>
      <p>Key <strong>${created.key_info.name}</strong> created. Copy it now: it will not be shown again.</p>
      <p><code class="secret">${created.key}</code></p>
      <button type="button" onClick=${() => setCreated(null)}>Done</button>
    </div>`}
    <div class="table-wrap"><table class="stack">
      <thead><tr><th>Name</th><th>Key</th><th>Scopes</th><th>Templates</th><th>Last used</th><th>Expires</th><th>Created</th><th>Actions</th></tr></thead>
      <tbody>
        ${data && data.keys.length === 0 && html`<tr><td colspan="8">No keys yet: create one below.</td></tr>`}
        ${data && data.keys.map((k) => html`<tr key=${k.key_id} data-key=${k.name}>
          <td data-label="Name">${k.name}</td>
          <td data-label="Key"><code>orc_${k.prefix}…</code></td>
          <td data-label="Scopes">${k.scopes.join(' ')}</td>
          <td data-label="Templates" class="wrap">${k.templates ? k.templates.map((id, i) => html`${i ? ', ' : ''}${names[id]
            ? html`<span title=${id}>${names[id]}</span>` : html`<code>${id}</code>`}`) : 'any'}</td>
          <td data-label="Last used">${k.last_used_at ? when(k.last_used_at) : 'never'}</td>
          <td data-label="Expires">${k.expires_at ? when(k.expires_at) : 'never'}</td>
          <td data-label="Created">${when(k.created_at)}</td>
          <td class="actions" data-label="Actions">
            <${ConfirmButton} label="Revoke" confirm=${`Revoke ${k.name}`} onConfirm=${() => revoke(k)} />
          </td></tr>`)}
      </tbody>
    </table></div>
    <${CreateKey} templates=${templates || []} onCreated=${(made) => { setCreated(made); setNotice(''); reload(); }} />
  </section>`;
}
