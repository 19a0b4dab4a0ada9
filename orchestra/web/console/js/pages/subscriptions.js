// Event subscriptions: URLs told of your runs' events, signed (Standard Webhooks). The
// secret is shown once, when added. A subscription's deliveries show each attempt's
// response code; a delivery can be retried.
import { html, useState } from '../html.js';
import { api, apiAll } from '../api.js';
import { TextField, ErrorBox, Notice, useLoad, problemsByField, ConfirmButton, when } from '../ui.js';

const EVENTS = ['run.succeeded', 'run.failed', 'run.cancelled', 'run.waiting_reply'];

function AddSubscription({ onAdded }) {
  const [url, setUrl] = useState('');
  const [events, setEvents] = useState(['run.succeeded', 'run.failed']);
  const [error, setError] = useState(null);
  const problems = problemsByField(error);
  const toggle = (name) => setEvents(events.includes(name) ? events.filter((e) => e !== name) : [...events, name]);
  const submit = async (e) => {
    e.preventDefault();
    try {
      const answer = await api('POST', '/workflow/subscription', { url, events });
      setUrl('');
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
    <fieldset><legend>Events</legend>
      ${EVENTS.map((name) => html`<label key=${name}><input type="checkbox" checked=${events.includes(name)}
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
    ${data && data.deliveries.length > 0 && html`<table class="list">
      <thead><tr><th>Event</th><th>Run</th><th>Status</th><th>Attempts (response codes)</th><th>Next attempt</th><th></th></tr></thead>
      <tbody>${data.deliveries.map((d) => html`<tr key=${d.delivery_id} data-delivery=${d.delivery_id}>
        <td>${d.event}</td>
        <td><a href=${`#/run/${d.trace_id}`}><code>${d.trace_id.slice(0, 8)}</code></a></td>
        <td><span class=${`badge delivery-${d.status}`}>${d.status}</span></td>
        <td class="codes">${d.attempts.map((a, i) => html`<span key=${i} title=${`${when(a.at)}${a.error ? ` · ${a.error}` : ''}`}>
          ${a.response_code === null ? '—' : a.response_code}</span> `)}</td>
        <td>${d.next_attempt_at ? when(d.next_attempt_at) : '–'}</td>
        <td><button type="button" onClick=${() => retry(d)}>Retry</button></td></tr>`)}</tbody></table>`}
    <button type="button" onClick=${reload}>Refresh</button>
  </div>`;
}

export function Subscriptions() {
  const [data, loadError, reload] = useLoad(async () => (await apiAll('/workflow/subscription', 'subscriptions')).subscriptions);
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
      <p><small>${s.events.join(', ')}</small></p>
      <details><summary>Deliveries</summary><${Deliveries} subscription=${s} /></details>
      <p class="actions"><${ConfirmButton} label="Delete" confirm="Delete subscription" onConfirm=${() => remove(s)} /></p>
    </article>`)}
    <${AddSubscription} onAdded=${(value) => { setSecret(value); reload(); }} />
  </section>`;
}
