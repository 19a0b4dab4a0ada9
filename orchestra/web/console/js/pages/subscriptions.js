// Event subscriptions: URLs told of your runs' events, signed (Standard Webhooks). The
// secret is shown once, when added. Each card says which runs it hears of (all yours, or
// one template's); its deliveries show each attempt's response code, or why no answer
// came (the error); a delivery can be retried.
import { html, useState } from '../html.js';
import { api, apiAll } from '../api.js';
import { TextField, Select, ErrorBox, Notice, useLoad, problemsByField, ConfirmButton, when } from '../ui.js';
import { scoped, inWorkspace } from '../workspace.js';

const EVENTS = ['run.succeeded', 'run.failed', 'run.cancelled', 'run.waiting_reply'];

function AddSubscription({ templates, onAdded }) {
  const [url, setUrl] = useState('');
  const [events, setEvents] = useState(['run.succeeded', 'run.failed']);
  const [templateId, setTemplateId] = useState('');
  const [error, setError] = useState(null);
  const problems = problemsByField(error);
  const toggle = (name) => setEvents(events.includes(name) ? events.filter((e) => e !== name) : [...events, name]);
  const submit = async (e) => {
    e.preventDefault();
    try {
      const answer = await api('POST', '/workflow/subscription', inWorkspace({ url, events, ...(templateId ? { template_id: templateId } : {}) }));
      setUrl('');
      setTemplateId('');
      setError(null);
      onAdded(answer.secret);
    } catch (err) {
      setError(err);
    }
  };
  return html`<form class="card" onSubmit=${submit} aria-labelledby="add-subscription">
    <h2 id="add-subscription">Add a subscription</h2>
    <${TextField} label="URL" value=${url} onInput=${setUrl} type="url" required problem=${problems.url}
                  hint="deliveries are POSTed here, signed" />
    <${Select} label="Runs of" value=${templateId} onChange=${setTemplateId} problem=${problems.template_id}
               options=${[['', 'every template (all your runs)'], ...templates.map((t) => [t.template_id, t.name])]} />
    <fieldset><legend>Events</legend>
      ${EVENTS.map((name) => html`<label key=${name} class="check"><input type="checkbox" checked=${events.includes(name)}
        onChange=${() => toggle(name)} /> ${name}</label>`)}
    </fieldset>
    <${ErrorBox} error=${error} />
    <button type="submit" class="primary" disabled=${!events.length}>Add subscription</button>
  </form>`;
}

function Deliveries({ subscription }) {
  const [data, loadError, reload] = useLoad(() => api('GET', `/workflow/subscription/${subscription.subscription_id}/deliveries`));
  const [error, setError] = useState(null);
  const retry = async (d) => {
    try {
      await api('POST', `/workflow/subscription/${subscription.subscription_id}/deliveries/${d.delivery_id}/retry`);
      reload();
    } catch (err) {
      setError(err);
    }
  };
  return html`<div class="deliveries">
    <${ErrorBox} error=${loadError || error} />
    ${data && data.deliveries.length === 0 && html`<p class="hint">No deliveries yet.</p>`}
    ${data && data.deliveries.length > 0 && html`<div class="table-wrap"><table class="stack deliveries">
      <thead><tr><th>Event</th><th>Run</th><th>Status</th><th>Attempts (response code or error)</th><th>Next attempt</th><th>Actions</th></tr></thead>
      <tbody>${data.deliveries.map((d) => html`<tr key=${d.delivery_id} data-delivery=${d.delivery_id}>
        <td data-label="Event">${d.event}</td>
        <td data-label="Run">${d.trace_id
          ? html`<a href=${`#/run/${d.trace_id}`}><code>${d.trace_id.slice(0, 8)}</code></a>`
          : '–'}</td>
        <td data-label="Status"><span class=${`badge delivery-${d.status}`}>${d.status}</span></td>
        <td class="codes" data-label="Attempts"><ol class="attempts">${d.attempts.map((a, i) => html`<li key=${i}>
          ${a.response_code === null
            ? html`<span class="attempt-error">${a.error || 'no answer'}</span>`
            : html`<span class=${`code${a.error ? ' failed' : ''}`}>${a.response_code}</span>`}
          <small class="attempt-at"> ${when(a.at)}</small></li>`)}</ol></td>
        <td data-label="Next attempt">${d.next_attempt_at ? when(d.next_attempt_at) : '–'}</td>
        <td class="actions" data-label="Actions"><button type="button" onClick=${() => retry(d)}>Retry</button></td></tr>`)}</tbody></table></div>`}
    <button type="button" onClick=${reload}>Refresh</button>
  </div>`;
}

/** Which runs a subscription hears of: every run of its owner, or one template's. */
function Filter({ subscription, names }) {
  if (!subscription.template_id) return html`<p class="sub-filter">Runs of every template (all your runs)</p>`;
  const name = names[subscription.template_id];
  return html`<p class="sub-filter">Runs of the template ${name
    ? html`<a href=${`#/templates/${subscription.template_id}`}><strong>${name}</strong></a>`
    : html`<code>${subscription.template_id}</code>`} only</p>`;
}

export function Subscriptions() {
  const [data, loadError, reload] = useLoad(async () => (await apiAll(scoped('/workflow/subscription'), 'subscriptions')).subscriptions);
  const [templates] = useLoad(async () => (await apiAll(scoped('/workflow/template'), 'templates')).templates);
  const names = Object.fromEntries((templates || []).map((t) => [t.template_id, t.name]));
  const [secret, setSecret] = useState('');
  const [notice, setNotice] = useState('');
  const [error, setError] = useState(null);
  const remove = async (s) => {
    try {
      await api('DELETE', `/workflow/subscription/${s.subscription_id}`);
      setNotice('Subscription deleted.');
      reload();
    } catch (err) {
      setError(err);
    }
  };
  return html`<section>
    <h1>Subscriptions</h1>
    <p class="hint">Other systems told when your runs end or wait for a person.</p>
    <${Notice} text=${notice} />
    ${secret && html`<p class="notice secret" role="status">Signing secret (shown only now — keep it):
      <code>${secret}</code> <button type="button" onClick=${() => setSecret('')}>Done</button></p>`}
    <${ErrorBox} error=${loadError || error} />
    ${data && data.length === 0 && html`<p>No subscriptions yet.</p>`}
    ${data && data.map((s) => html`<article class="card" key=${s.subscription_id} data-subscription=${s.subscription_id}>
      <h2><code>${s.url}</code></h2>
      <${Filter} subscription=${s} names=${names} />
      <p><small>${s.events.join(', ')}</small></p>
      <details><summary>Deliveries</summary><${Deliveries} subscription=${s} /></details>
      <p class="actions"><${ConfirmButton} label="Delete" confirm="Delete subscription" onConfirm=${() => remove(s)} /></p>
    </article>`)}
    <${AddSubscription} templates=${templates || []} onAdded=${(value) => { setSecret(value); reload(); }} />
  </section>`;
}
