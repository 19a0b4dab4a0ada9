// Schedules: your templates run on a clock. Each shows its next fires (in its own zone's
// offset) and its last fire's outcome; add one, enable or disable it, delete it.
import { html, useState } from '../html.js';
import { api, apiAll } from '../api.js';
import { TextField, Select, ErrorBox, Notice, useLoad, problemsByField, ConfirmButton } from '../ui.js';

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
      const answer = await api('POST', '/workflow/schedule', { ...form, input: form.input || null });
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
    schedules: (await apiAll('/workflow/schedule', 'schedules')).schedules,
    templates: (await apiAll('/workflow/template', 'templates')).templates,
  }));
  const [notice, setNotice] = useState('');
  const [error, setError] = useState(null);
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
    ${data && data.schedules.length > 0 && html`<table class="list schedules">
      <thead><tr><th>Template</th><th>Cron</th><th>Zone</th><th>Next fires</th><th>Last fire</th><th></th></tr></thead>
      <tbody>${data.schedules.map((s) => html`<tr key=${s.schedule_id} data-schedule=${s.schedule_id}>
        <td>${names[s.template_id] || s.template_id}</td>
        <td><code>${s.cron}</code></td>
        <td>${s.timezone}</td>
        <td>${s.enabled ? html`<ul class="fires">${s.next_fires.slice(0, 3).map((f) => html`<li key=${f}><time>${f}</time></li>`)}</ul>`
          : html`<em>disabled</em>`}</td>
        <td>${s.last_fire ? html`<time>${s.last_fire.due_at}</time> <span class=${`badge outcome-${s.last_fire.outcome}`}>${s.last_fire.outcome}</span>
          ${s.last_fire.trace_id && html` <a href=${`#/run/${s.last_fire.trace_id}`}>run</a>`}` : '–'}</td>
        <td class="actions">
          <button type="button" onClick=${() => change(s, { enabled: !s.enabled }, s.enabled ? 'Schedule disabled.' : 'Schedule enabled.')}>
            ${s.enabled ? 'Disable' : 'Enable'}</button>
          <${ConfirmButton} label="Delete" confirm="Delete schedule" onConfirm=${() => remove(s)} />
        </td></tr>`)}</tbody></table>`}
    ${data && html`<${AddSchedule} templates=${data.templates} onAdded=${(text) => { setNotice(text); reload(); }} />`}
  </section>`;
}
