// Runs: start one (input, files uploaded with progress), and the run list with a filter.
import { html, useState, useEffect } from '../html.js';
import { api, apiAll, upload, isAdmin } from '../api.js';
import { TextArea, Select, ErrorBox, useLoad, when, duration, StatusBadge, go, useId, problemsByField } from '../ui.js';
import { SchemaFields, emptyDraft, draftValue } from '../schema_form.js';
import { scoped, chosenWorkspace } from '../workspace.js';

const STATUSES = ['queued', 'running', 'waiting_reply', 'succeeded', 'failed', 'cancelled', 'interrupted'];
const KINDS = { schedule: 'schedule', webhook: 'webhook', mcp: 'MCP', experiment: 'experiment' };

/** What started a run (its `trigger`, else its parent, retry or fork source): a short
 * label and, where the page has one, a link. A run with none of them was started directly
 * (this console, the CLI or an API key). */
export function startedBy(run) {
  const trigger = run.trigger;
  if (trigger && trigger.kind) {
    const label = KINDS[trigger.kind] || trigger.kind;
    if (trigger.kind === 'schedule') return { label, href: '#/schedules', title: `schedule ${trigger.schedule_id}, due ${trigger.due_at}` };
    if (trigger.kind === 'webhook') return { label, href: '#/hooks', title: `webhook ${trigger.hook_id}` };
    if (trigger.kind === 'mcp') return { label, detail: trigger.tool, title: `the MCP tool ${trigger.tool}` };
    return { label };
  }
  if (run.parent) return { label: 'parent run', href: `#/run/${run.parent.trace_id}`, title: `step ${run.parent.path} of ${run.parent.trace_id}` };
  if (run.retry_of) return { label: 'retry', href: `#/run/${run.retry_of}`, title: `a retry of ${run.retry_of}` };
  if (run.forked_from) return { label: 'fork', href: `#/run/${run.forked_from.trace_id}`, title: `a fork of ${run.forked_from.trace_id}` };
  return { label: 'direct', title: 'started from the console, the CLI or an API key' };
}

export function StartedBy({ run }) {
  const by = startedBy(run);
  const text = by.detail ? html`${by.label} <code>${by.detail}</code>` : by.label;
  return html`<span class=${`started-by by-${(run.trigger && run.trigger.kind) || by.label.replace(' ', '-')}`} title=${by.title}>${
    by.href ? html`<a href=${by.href}>${text}</a>` : text}</span>`;
}

function StartRun({ templates, preselected }) {
  const [templateId, setTemplateId] = useState(preselected || (templates[0] ? templates[0].template_id : ''));
  const [input, setInput] = useState('');
  const chosen = templates.find((t) => t.template_id === templateId);
  const schema = chosen && chosen.input_schema ? chosen.input_schema : null;
  const [draft, setDraft] = useState({ for: null });  // the input as a form, under an input_schema
  const current = draft.for === templateId ? draft.value : schema ? emptyDraft(schema) : null;
  const [files, setFiles] = useState([]);
  const [progress, setProgress] = useState(null);
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const fileId = useId('files');
  const start = async (e) => {
    e.preventDefault();
    let value = input;
    if (schema) {
      try {
        value = draftValue(schema, current, 'input');
      } catch (err) {
        setError({ status: 422, message: err.message, detail: [{ field: err.field || 'input', problem: err.message }] });
        return;
      }
    }
    setBusy(true);
    setError(null);
    try {
      let fileIds = [];
      if (files.length) {
        setProgress(0);
        fileIds = (await upload(files, setProgress)).map((f) => f.file_id);
      }
      const run = await api('POST', '/workflow/run', { template_id: templateId, input: value, files: fileIds });
      go(`run/${run.trace_id}`);
    } catch (err) {
      setError(err);
      setBusy(false);
    }
  };
  if (!templates.length) {
    return html`<p class="card">No templates yet: <a href="#/templates/new">create one</a> to start a run.</p>`;
  }
  return html`<form class="card" onSubmit=${start} aria-labelledby="start-run">
    <h2 id="start-run">Start a run</h2>
    <${Select} label="Template" value=${templateId} onChange=${setTemplateId}
               options=${templates.map((t) => [t.template_id, t.name])} />
    ${schema
      ? html`<${SchemaFields} schema=${schema} draft=${current} onDraft=${(value) => setDraft({ for: templateId, value })}
                              prefix="input" label="Input" problems=${problemsByField(error)} />`
      : html`<${TextArea} label="Input" value=${input} onInput=${setInput} hint="fills {{input}} in the prompts" />`}
    <div class="field">
      <label for=${fileId}>Files</label>
      <input id=${fileId} type="file" multiple onChange=${(e) => setFiles([...e.target.files])} />
      <small class="hint">uploaded first; steps read them with the read_upload tool</small>
      ${progress !== null && html`<progress max="1" value=${progress} aria-label="Upload progress">${Math.round(progress * 100)}%</progress>`}
    </div>
    <${ErrorBox} error=${error} />
    <button type="submit" class="primary" disabled=${busy}>Start run</button>
  </form>`;
}

export function Runs({ query }) {
  const [all, setAll] = useState(false);
  const [status, setStatus] = useState('');
  const [text, setText] = useState('');
  const [runs, runsError, reload] = useLoad(() => api('GET', scoped(`/workflow/run?limit=200${all && !chosenWorkspace() ? '&all=1' : ''}`)), [all]);
  const [templates, templatesError] = useLoad(() => apiAll(scoped('/workflow/template'), 'templates'));
  const filterId = useId('filter');
  const live = !!runs && runs.runs.some((r) => !r.finished_at);
  useEffect(() => {  // while a run is going, its row follows without a click on Refresh
    if (!live) return undefined;
    const timer = setInterval(reload, 3000);
    return () => clearInterval(timer);
  }, [live, reload]);
  const shown = (runs ? runs.runs : []).filter((r) => (!status || r.status === status)
    && (!text || `${r.template_name} ${r.trace_id}`.toLowerCase().includes(text.toLowerCase())));
  return html`<section>
    <h1>Runs</h1>
    <${ErrorBox} error=${templatesError} />
    ${templates && html`<${StartRun} templates=${templates.templates} preselected=${query && query.get('template')} />`}
    <h2>Recent runs</h2>
    <div class="row filters">
      <${Select} label="Status" value=${status} onChange=${setStatus} options=${[['', 'any'], ...STATUSES.map((s) => [s, s])]} />
      <div class="field"><label for=${filterId}>Filter</label>
        <input id=${filterId} type="search" value=${text} placeholder="template or trace id"
               onInput=${(e) => setText(e.target.value)} /></div>
      ${isAdmin() && !chosenWorkspace() && html`<label class="check"><input type="checkbox" checked=${all} onChange=${(e) => setAll(e.target.checked)} /> every user's</label>`}
      <button type="button" onClick=${reload}>Refresh</button>
    </div>
    <${ErrorBox} error=${runsError} />
    <div class="table-wrap"><table class="stack">
      <thead><tr><th>Template</th><th>Status</th><th>Started by</th><th>Started</th><th>Took</th><th>Cost</th><th>Run</th></tr></thead>
      <tbody>
        ${runs && shown.length === 0 && html`<tr><td colspan="7">No runs${status || text ? ' match the filter' : ' yet'}.</td></tr>`}
        ${shown.map((r) => html`<tr key=${r.trace_id} data-run=${r.trace_id}>
          <td data-label="Template">${r.template_name}</td><td data-label="Status"><${StatusBadge} status=${r.status} />${r.error && html`<br /><small>${r.error}</small>`}</td>
          <td data-label="Started by"><${StartedBy} run=${r} /></td>
          <td data-label="Started">${when(r.started_at || r.created_at)}</td><td data-label="Took">${duration(r.started_at, r.finished_at)}</td>
          <td data-label="Cost">${r.cost_usd != null ? `$${r.cost_usd}` : '–'}${r.budget_usd != null ? html` <small>of $${r.budget_usd}</small>` : ''}</td>
          <td data-label="Run"><a href=${`#/run/${r.trace_id}`}>${r.finished_at ? 'replay' : 'watch'} <code>${r.trace_id.slice(0, 8)}</code></a></td>
        </tr>`)}
      </tbody>
    </table></div>
    ${runs && runs.next_cursor && html`<p class="more">Showing the newest ${runs.runs.length} runs; older ones are listed by <code>orchestra workflow list runs --cursor ${runs.next_cursor}</code>.</p>`}
  </section>`;
}
