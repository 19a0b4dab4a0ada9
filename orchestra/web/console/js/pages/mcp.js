// MCP servers: everyone sees them and their tools (what workers may choose, named
// <server>.<tool>); administrators add, check and delete them (the workers that block
// a delete are named). Header and env values are secrets: the API shows them masked.
// Whether a server answers is only known at a check: the page says when the last one was
// and what it found, never "reachable" as of now; an administrator's page checks every
// server again when it opens (POST …/refresh: connect and list the tools).
import { html, useState, useEffect, useRef } from '../html.js';
import { api, isAdmin } from '../api.js';
import { TextField, TextArea, Select, ErrorBox, Notice, useLoad, problemsByField, when, ago, ConfirmButton } from '../ui.js';

const EMPTY = { name: '', transport: 'streamable_http', url: '', command: '', args: '', pairs: '', timeout: '' };

/** "NAME=VALUE" lines as an object (blank lines skipped). */
function pairs(text) {
  const out = {};
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    const at = line.indexOf('=');
    out[(at < 0 ? line : line.slice(0, at)).trim()] = at < 0 ? '' : line.slice(at + 1);
  }
  return out;
}

function AddServer({ onAdded }) {
  const [form, setForm] = useState(EMPTY);
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const set = (key) => (value) => setForm({ ...form, [key]: value });
  const problems = problemsByField(error);
  const http = form.transport === 'streamable_http';
  const secretProblem = Object.entries(problems).find(([f]) => f.startsWith(http ? 'headers' : 'env'));
  const submit = async (e) => {
    e.preventDefault();
    const body = { name: form.name, transport: form.transport };
    if (http) Object.assign(body, { url: form.url, headers: pairs(form.pairs) });
    else Object.assign(body, { command: form.command, args: form.args.split('\n').filter((a) => a.trim()), env: pairs(form.pairs) });
    if (form.timeout) body.timeout_seconds = Number(form.timeout);
    setBusy(true);
    try {
      const answer = await api('POST', '/resource/mcp', body);
      setForm(EMPTY);
      setError(null);
      const s = answer.server;
      onAdded(s.last_error ? `MCP server '${s.name}' added, but it could not be reached: ${s.last_error}`
        : `MCP server '${s.name}' added with ${s.tools.length} tool(s).`);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  return html`<form class="card" onSubmit=${submit} aria-labelledby="add-mcp">
    <h2 id="add-mcp">Add an MCP server</h2>
    <div class="grid">
      <${TextField} label="Name" value=${form.name} onInput=${set('name')} required problem=${problems.name}
                    hint="letters, digits, _ or -; prefixes its tools" />
      <${Select} label="Transport" value=${form.transport} onChange=${set('transport')} problem=${problems.transport}
                 options=${[['streamable_http', 'streamable HTTP'], ['stdio', 'stdio (allowed commands only)']]} />
      ${http
        ? html`<${TextField} label="URL" value=${form.url} onInput=${set('url')} type="url" required
                             problem=${problems.url} hint="the server's MCP endpoint, e.g. https://host/mcp" />`
        : html`<${TextField} label="Command" value=${form.command} onInput=${set('command')} required
                             problem=${problems.command} hint="a bare name (no path) listed in ORCHESTRA_MCP_STDIO_COMMANDS" />
               <${TextArea} label="Arguments" value=${form.args} onInput=${set('args')} rows="2"
                            problem=${problems.args} hint="one per line" />`}
      <${TextArea} label=${http ? 'Headers' : 'Environment'} value=${form.pairs} onInput=${set('pairs')} rows="2"
                   autocomplete="off" spellcheck="false" problem=${secretProblem && secretProblem[1]}
                   hint="NAME=VALUE, one per line; stored encrypted, shown masked" />
      <${TextField} label="Timeout (s)" value=${form.timeout} onInput=${set('timeout')} type="number" min="0.1" step="any"
                    problem=${problems.timeout_seconds} hint="connecting and each call; default 30" />
    </div>
    <${ErrorBox} error=${error} />
    <button type="submit" class="primary" disabled=${busy}>${busy ? 'Connecting…' : 'Add MCP server'}</button>
  </form>`;
}

function Tools({ server }) {
  if (!server.tools.length) return html`<p class="hint">No tools listed.</p>`;
  return html`<ul class="mcp-tools">
    ${server.tools.map((t) => html`<li key=${t.name}><code>${t.name}</code> ${t.description}</li>`)}
  </ul>`;
}

export function McpServers() {
  const [data, loadError, reload] = useLoad(() => api('GET', '/resource/mcp'));
  const [results, setResults] = useState({});
  const [notice, setNotice] = useState('');
  const admin = isAdmin();
  const show = (id, result) => setResults((all) => ({ ...all, [id]: result }));
  const refresh = async (s, quiet = false) => {
    show(s.server_id, { busy: true });
    try {
      const answer = await api('POST', `/resource/mcp/${s.server_id}/refresh`);
      show(s.server_id, answer.server.last_error ? (quiet ? {} : { error: answer.server.last_error })
        : quiet ? {} : { ok: `Reached just now: ${answer.server.tools.length} tool(s).` });
      reload();
    } catch (err) {
      show(s.server_id, { error: err });
    }
  };
  // An administrator's page checks each server once when it is first listed here: what a
  // check long ago found is no news of now (a server killed since still looked reachable).
  const checked = useRef(new Set());
  useEffect(() => {
    if (!admin || !data) return;
    for (const s of data.servers) {
      if (checked.current.has(s.server_id)) continue;
      checked.current.add(s.server_id);
      refresh(s, true);
    }
  }, [data]);
  const remove = async (s) => {
    try {
      await api('DELETE', `/resource/mcp/${s.server_id}`);
      setNotice(`MCP server '${s.name}' deleted.`);
      reload();
    } catch (err) {
      show(s.server_id, { error: err });
    }
  };
  return html`<section>
    <h1>MCP servers</h1>
    <p class="hint">Their tools join the catalog as <code>server.tool</code>; choose them for a worker on the Workers page.</p>
    <${Notice} text=${notice} />
    <${ErrorBox} error=${loadError} />
    ${data && data.servers.length === 0 && html`<p>No MCP servers yet${admin ? ': add one below' : ''}.</p>`}
    ${data && data.servers.map((s) => { const r = results[s.server_id] || {};
      const secrets = Object.entries(s.transport === 'stdio' ? s.env : s.headers);
      return html`<article class="card mcp" key=${s.server_id} data-mcp=${s.name} aria-labelledby=${`mcp-${s.server_id}`}>
        <h2 id=${`mcp-${s.server_id}`}>${s.name} <small>${s.transport === 'stdio' ? 'stdio' : 'streamable HTTP'}</small></h2>
        <p><code>${s.url || [s.command, ...s.args].join(' ')}</code></p>
        ${secrets.length > 0 && html`<p><small>${`${s.transport === 'stdio' ? 'env' : 'headers'}: `
          + secrets.map(([k, v]) => `${k}: ${v}`).join(', ')}</small></p>`}
        <p class="mcp-check" data-checked=${s.refreshed_at || ''}>${r.busy
          ? html`<strong>Checking…</strong>`
          : html`<strong class=${s.last_error ? 'check-failed' : 'check-ok'}>${s.last_error ? 'Not reached' : 'Reached'} at the last check</strong>
            <small>${` · ${ago(s.refreshed_at)} (`}<time datetime=${s.refreshed_at}>${when(s.refreshed_at)}</time>${`) · timeout ${s.timeout_seconds} s`}</small>`}</p>
        ${s.last_error && !r.error && html`<p class="error">${s.last_error}</p>`}
        <details><summary>Tools (${s.tools.length})</summary><${Tools} server=${s} /></details>
        ${r.ok && html`<p class="ok" role="status">${r.ok}</p>`}
        <${ErrorBox} error=${r.error} />
        ${r.error && r.error.detail && r.error.detail.workers && html`<ul class="blockers">
          ${r.error.detail.workers.map((w) => html`<li>worker <strong>${w.name}</strong> <code>${w.worker_id}</code></li>`)}
        </ul>`}
        ${admin && html`<p class="actions">
          <button type="button" onClick=${() => refresh(s)} disabled=${r.busy}>${r.busy ? 'Checking…' : 'Check now'}</button>
          <${ConfirmButton} label="Delete" confirm=${`Delete ${s.name}`} onConfirm=${() => remove(s)} />
        </p>`}
      </article>`; })}
    ${admin && html`<${AddServer} onAdded=${(text) => { setNotice(text); reload(); }} />`}
  </section>`;
}
