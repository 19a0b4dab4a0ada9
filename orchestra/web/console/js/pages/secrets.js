// Secrets: values HTTP steps send as {{ secrets.NAME }}, to the secret's hosts only —
// the instance-wide ones (administrators), or the chosen workspace's (its admins and
// owners). The API never returns a value: the list shows names, hints (…abcd) and
// hosts; a value is typed once, hidden.
import { html, useState } from '../html.js';
import { api } from '../api.js';
import { TextField, ErrorBox, Notice, useLoad, when, problemsByField, ConfirmButton } from '../ui.js';
import { scoped, inWorkspace, workspaceOf } from '../workspace.js';

function SetSecret({ onSet }) {
  const [form, setForm] = useState({ name: '', value: '', hosts: '' });
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const problems = problemsByField(error);
  const submit = async (e) => {
    e.preventDefault();
    setBusy(true);
    try {
      let answer;
      const hosts = form.hosts.split(/[\s,]+/).filter((h) => h);
      const change = hosts.length ? { value: form.value, hosts } : { value: form.value };
      try {
        answer = await api('POST', '/resource/secret', inWorkspace({ name: form.name, value: form.value, hosts }));
      } catch (err) {
        if (err.status !== 409) throw err;  // the name exists: set means replace its value (and hosts)
        answer = await api('PUT', scoped(`/resource/secret/${encodeURIComponent(form.name)}`), change);
      }
      setForm({ name: '', value: '', hosts: '' });
      setError(null);
      onSet(`Secret '${answer.name}' stored (${answer.hint}), sent only to ${(answer.hosts || []).join(', ')}. `
            + `Use it as {{ secrets.${answer.name} }} in an HTTP step's URL or headers.`);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  return html`<form class="card" onSubmit=${submit} aria-labelledby="set-secret">
    <h2 id="set-secret">Store a secret</h2>
    <div class="grid">
      <${TextField} label="Name" value=${form.name} onInput=${(name) => setForm({ ...form, name })} required
                    problem=${problems.name} hint="letters, digits or _; an existing name gets the new value" />
      <${TextField} label="Value" type="password" value=${form.value} onInput=${(value) => setForm({ ...form, value })}
                    required autocomplete="off" problem=${problems.value} hint="encrypted at rest, never shown again" />
      <${TextField} label="Hosts" value=${form.hosts} onInput=${(hosts) => setForm({ ...form, hosts })}
                    problem=${problems.hosts}
                    hint="where HTTP steps may send it, separated by spaces or commas: api.example.com, *.example.com, 10.0.0.5:8443 (no port: any port); needed for a new secret" />
    </div>
    <${ErrorBox} error=${error} />
    <button type="submit" class="primary" disabled=${busy}>${busy ? 'Storing…' : 'Store secret'}</button>
  </form>`;
}

export function Secrets() {
  const [data, loadError, reload] = useLoad(() => api('GET', scoped('/resource/secret')));
  const [notice, setNotice] = useState('');
  const [error, setError] = useState(null);
  const remove = async (s) => {
    try {
      await api('DELETE', scoped(`/resource/secret/${encodeURIComponent(s.name)}`));
      setNotice(`Secret '${s.name}' deleted.`);
      reload();
    } catch (err) {
      setError(err);
    }
  };
  const workspace = workspaceOf();
  return html`<section>
    <h1>Secrets</h1>
    <p class="hint" data-secret-scope>${workspace
      ? html`The secrets of the workspace <strong>${workspace.name}</strong> (its admins and owners keep them); its
          templates may also use the instance-wide ones.`
      : html`The instance-wide secrets (administrators keep them), usable by every workspace. Choose a workspace in
          the header for its own.`}</p>
    <p class="hint">HTTP steps send them as <code>{{ secrets.NAME }}</code> in their URL or header values, and only
      to the secret's hosts (compared with the host as written in the URL, redirects included); anywhere else a
      template is refused. Runs show <code>***</code> wherever a value could appear. A secret without hosts (stored
      before hosts existed) goes nowhere until its hosts are set.</p>
    <${Notice} text=${notice} />
    <${ErrorBox} error=${loadError || error} />
    <div class="table-wrap"><table class="stack secrets">
      <thead><tr><th>Name</th><th>Value</th><th>Hosts</th><th>Changed</th><th></th></tr></thead>
      <tbody>
        ${data && data.secrets.length === 0 && html`<tr><td colspan="5">No secrets yet.</td></tr>`}
        ${data && data.secrets.map((s) => html`<tr key=${s.name} data-secret=${s.name}>
          <td data-label="Name"><code>${s.name}</code></td><td data-label="Value">${s.hint}</td>
          <td data-label="Hosts">${s.hosts && s.hosts.length ? s.hosts.join(', ') : 'none: set its hosts to use it'}</td>
          <td data-label="Changed">${when(s.updated_at)}</td>
          <td><${ConfirmButton} label="Delete" confirm=${`Delete ${s.name}`} onConfirm=${() => remove(s)} /></td>
        </tr>`)}
      </tbody>
    </table></div>
    <${SetSecret} onSet=${(text) => { setNotice(text); reload(); }} />
  </section>`;
}
