// Schedules: your templates run on a clock. Each shows its next fires (in its own zone's
// offset) and its last fire's outcome, and opens its fire history (each handled due time's
// outcome and the run it started, newest first, paged); add one, enable or disable it,
// delete it.
import { html, useState, useEffect } from '../html.js';
import { api, apiAll } from '../api.js';
import { TextField, Select, ErrorBox, Notice, useLoad, problemsByField, ConfirmButton, StatusBadge } from '../ui.js';
import { scoped, inWorkspace } from '../workspace.js';

const FIRES_PAGE = 20;

/** A time of the schedule's zone as the API gives it (ISO 8601 with its offset), readable:
 * `2026-03-06 09:00:00 -05:00` (whole seconds), in a <time> carrying the exact value. */
function Zoned({ iso }) {
  if (!iso) return '–';
  const m = /^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2}:\d{2})(?:\.\d+)?(Z|[+-]\d{2}:\d{2})$/.exec(iso);
  const text = m ? `${m[1]} ${m[2]} ${m[3] === 'Z' ? '+00:00' : m[3]}` : iso;
  return html`<time datetime=${iso} class="zoned">${text}</time>`;
}

/** A schedule's fires, newest first, FIRES_PAGE at a time ("Older fires" reads the next page). */
function Fires({ schedule }) {
  const [pages, setPages] = useState([]);
  const [cursor, setCursor] = useState(null);
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const read = async (after, previous) => {
    setBusy(true);
    try {
      const page = await api('GET', `/workflow/schedule/${schedule.schedule_id}/fires?limit=${FIRES_PAGE}`
        + (after ? `&cursor=${encodeURIComponent(after)}` : ''));
      setPages([...previous, ...page.fires]);
      setCursor(page.next_cursor);
      setError(null);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  useEffect(() => { read(null, []); }, [schedule.schedule_id]);
  return html`<div class="fires-history" data-fires=${schedule.schedule_id}>
    <h3>Fires <small>(${schedule.timezone})</small></h3>
    <${ErrorBox} error=${error} />
    ${!error && !busy && pages.length === 0 && html`<p class="hint">No fires yet: its first due time has not come.</p>`}
    ${pages.length > 0 && html`<table class="stack fires">
      <thead><tr><th>Due</th><th>Fired</th><th>Outcome</th><th>Run</th></tr></thead>
      <tbody>${pages.map((f) => html`<tr key=${f.due_at} data-due=${f.due_at} data-outcome=${f.outcome}>
        <td data-label="Due"><${Zoned} iso=${f.due_at} /></td>
        <td data-label="Fired"><${Zoned} iso=${f.fired_at} /></td>
        <td data-label="Outcome"><span class=${`badge outcome-${f.outcome}`}>${f.outcome}</span>
          ${f.error && html`<br /><small class="fire-error">${f.error}</small>`}</td>
        <td data-label="Run">${f.trace_id
          ? html`<a href=${`#/run/${f.trace_id}`}><code>${f.trace_id.slice(0, 8)}</code></a>
            ${f.run_status ? html` <${StatusBadge} status=${f.run_status} />` : html` <small>(deleted)</small>`}`
          : '–'}</td></tr>`)}</tbody></table>`}
    <p class="row">
      ${cursor && html`<button type="button" disabled=${busy} onClick=${() => read(cursor, pages)}>Older fires</button>`}
      <button type="button" disabled=${busy} onClick=${() => read(null, [])}>Refresh fires</button>
    </p>
  </div>`;
}

const EMPTY = { template_id: '', cron: '0 9 * * 1-5', timezone: Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC',
  input: '', overlap: 'skip', catchup: 'latest' };

function AddSchedule({ templates, onAdded }) {
  const [form, setForm] = useState({ ...EMPTY, template_id: templates[0] ? templates[0].template_id : '' });
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const set = (key) => (value) => setForm({ ...form, [key]: value });
  const problems = problemsByField(error);
  const submit = async (e) => {
    e.preventDefault();
    setBusy(true);
    try {
      const answer = await api('POST', '/workflow/schedule', inWorkspace({ ...form, input: form.input || null }));
      setError(null);
      onAdded(`Schedule added; next fire ${answer.schedule.next_fires[0] || '–'}.`);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  return html`<form class="card" onSubmit=${submit} aria-labelledby="add-schedule">
    <h2 id="add-schedule">Add a schedule</h2>
    <div class="grid">
      <${Select} label="Template" value=${form.template_id} onChange=${set('template_id')} problem=${problems.template_id}
                 options=${templates.map((t) => [t.template_id, t.name])} />
      <${TextField} label="Cron" value=${form.cron} onInput=${set('cron')} required problem=${problems.cron}
                    hint="five fields: minute hour day month weekday" />
      <${TextField} label="Time zone" value=${form.timezone} onInput=${set('timezone')} required
                    problem=${problems.timezone} hint="IANA name, e.g. Europe/Paris" />
      <${TextField} label="Input" value=${form.input} onInput=${set('input')} problem=${problems.input} />
      <${Select} label="While the last run is active" value=${form.overlap} onChange=${set('overlap')}
                 options=${[['skip', 'skip the fire'], ['allow', 'start another'], ['cancel_previous', 'cancel it, start']]} />
      <${Select} label="Missed fires" value=${form.catchup} onChange=${set('catchup')}
                 options=${[['latest', 'make up the latest'], ['all', 'make up all'], ['none', 'skip them']]} />
    </div>
    <${ErrorBox} error=${error} />
    <button type="submit" class="primary" disabled=${busy || !templates.length}>Add schedule</button>
  </form>`;
}

export function Schedules() {
  const [data, loadError, reload] = useLoad(async () => ({
    schedules: (await apiAll(scoped('/workflow/schedule'), 'schedules')).schedules,
    templates: (await apiAll(scoped('/workflow/template'), 'templates')).templates,
  }));
  const [notice, setNotice] = useState('');
  const [error, setError] = useState(null);
  const [opened, setOpened] = useState(null);  // the schedule whose fires are shown
  const names = Object.fromEntries(((data && data.templates) || []).map((t) => [t.template_id, t.name]));
  const change = async (s, fields, text) => {
    try {
      const body = { template_id: s.template_id, cron: s.cron, timezone: s.timezone, input: s.input, overlap: s.overlap,
        catchup: s.catchup, catchup_window_seconds: s.catchup_window_seconds, enabled: s.enabled, ...fields };
      await api('PUT', `/workflow/schedule/${s.schedule_id}`, body);
      setNotice(text);
      reload();
    } catch (err) {
      setError(err);
    }
  };
  const remove = async (s) => {
    try {
      await api('DELETE', `/workflow/schedule/${s.schedule_id}`);
      setNotice('Schedule deleted.');
      reload();
    } catch (err) {
      setError(err);
    }
  };
  return html`<section>
    <h1>Schedules</h1>
    <p class="hint">Runs of your templates on a clock, as you. Times are shown in each schedule's own zone.</p>
    <${Notice} text=${notice} />
    <${ErrorBox} error=${loadError || error} />
    ${data && data.schedules.length === 0 && html`<p>No schedules yet.</p>`}
    ${data && data.schedules.length > 0 && html`<div class="table-wrap"><table class="stack schedules">
      <thead><tr><th>Template</th><th>Cron</th><th>Zone</th><th>Next fires</th><th>Last fire</th><th>Actions</th></tr></thead>
      <tbody>${data.schedules.map((s) => html`<tr key=${s.schedule_id} data-schedule=${s.schedule_id}>
        <td data-label="Template">${names[s.template_id] || s.template_id}</td>
        <td data-label="Cron"><code>${s.cron}</code></td>
        <td data-label="Zone">${s.timezone}</td>
        <td data-label="Next fires">${s.enabled ? html`<ul class="fires">${s.next_fires.slice(0, 3).map((f) => html`<li key=${f}><${Zoned} iso=${f} /></li>`)}</ul>`
          : html`<em>disabled</em>`}</td>
        <td data-label="Last fire">${s.last_fire ? html`<${Zoned} iso=${s.last_fire.due_at} /> <span class=${`badge outcome-${s.last_fire.outcome}`}>${s.last_fire.outcome}</span>
          ${s.last_fire.trace_id && html` <a href=${`#/run/${s.last_fire.trace_id}`}>run</a>`}` : '–'}</td>
        <td class="actions" data-label="Actions">
          <button type="button" aria-expanded=${opened === s.schedule_id ? 'true' : 'false'}
                  onClick=${() => setOpened(opened === s.schedule_id ? null : s.schedule_id)}>Fires</button>
          <button type="button" onClick=${() => change(s, { enabled: !s.enabled }, s.enabled ? 'Schedule disabled.' : 'Schedule enabled.')}>
            ${s.enabled ? 'Disable' : 'Enable'}</button>
          <${ConfirmButton} label="Delete" confirm="Delete schedule" onConfirm=${() => remove(s)} />
        </td></tr>`)}</tbody></table></div>`}
    ${data && opened && data.schedules.some((s) => s.schedule_id === opened) && html`<section class="card">
      <${Fires} key=${opened} schedule=${data.schedules.find((s) => s.schedule_id === opened)} /></section>`}
    ${data && html`<${AddSchedule} templates=${data.templates} onAdded=${(text) => { setNotice(text); reload(); }} />`}
  </section>`;
}
