// A template's versions (SPEC §13): every save made one. The list, a side-by-side diff of
// any two (steps matched by id, inner steps of foreach and loop by their own ids, the
// server's diff naming what changed), and restore (the chosen version's content saved as
// the newest version).
import { html, useState } from '../html.js';
import { api } from '../api.js';
import { ConfirmButton, ErrorBox, Select, attempt, useLoad, when } from '../ui.js';

/** Every step by id, inner steps included, with only its own keys (a container without its inner steps). */
export function ownSteps(steps) {
  const out = new Map();
  const walk = (list) => {
    for (const s of Array.isArray(list) ? list : []) {
      if (!s || typeof s !== 'object') continue;
      const own = { ...s };
      if (s.foreach) delete own.steps;
      if (s.loop && typeof s.loop === 'object') own.loop = Object.fromEntries(Object.entries(s.loop).filter(([k]) => k !== 'steps'));
      out.set(s.id, own);
      walk(s.foreach ? s.steps : null);
      walk(s.loop && s.loop.steps);
    }
  };
  walk(steps);
  return out;
}

const pretty = (value) => (value === undefined ? '' : JSON.stringify(value, null, 2));

/** One row per step id: the older version's step on the left, the newer's on the right. */
function SideBySide({ diff, older, newer }) {
  const [all, setAll] = useState(false);
  const left = ownSteps(older.steps);
  const right = ownSteps(newer.steps);
  const changed = new Map(diff.changed.map((c) => [c.step_id, c.fields]));
  const ids = [...left.keys(), ...diff.added];
  const kind = (id) => (diff.added.includes(id) ? 'added' : diff.removed.includes(id) ? 'removed' : changed.has(id) ? 'changed' : 'same');
  const shownIds = all ? ids : ids.filter((id) => kind(id) !== 'same');
  const same = ids.length - ids.filter((id) => kind(id) !== 'same').length;
  const meta = (v) => Object.fromEntries(['name', 'description', 'input_schema', 'limits', 'output']
    .filter((k) => v[k] !== undefined && v[k] !== null).map((k) => [k, v[k]]));
  return html`<div class="version-diff" data-from=${diff.from} data-to=${diff.to}>
    <p class="meta">Version ${diff.from} → ${diff.to}: ${diff.added.length} added, ${diff.removed.length} removed,
      ${diff.changed.length} changed${diff.template_fields.length ? `; template: ${diff.template_fields.join(', ')}` : ''}.</p>
    ${diff.template_fields.length > 0 && html`<div class="diff-row changed" data-step="(template)">
      <h4>Template <small>${diff.template_fields.join(', ')}</small></h4>
      <div class="diff-sides"><pre class="diff-old">${pretty(meta(older))}</pre><pre class="diff-new">${pretty(meta(newer))}</pre></div></div>`}
    ${shownIds.map((id) => html`<div key=${id} class=${`diff-row ${kind(id)}`} data-step=${id}>
      <h4>${id} <small>${kind(id) === 'changed' ? changed.get(id).join(', ') : kind(id)}</small></h4>
      <div class="diff-sides">
        <pre class="diff-old" aria-label=${`${id} in version ${diff.from}`}>${left.has(id) ? pretty(left.get(id)) : '—'}</pre>
        <pre class="diff-new" aria-label=${`${id} in version ${diff.to}`}>${right.has(id) ? pretty(right.get(id)) : '—'}</pre>
      </div></div>`)}
    ${same > 0 && html`<button type="button" class="link" onClick=${() => setAll(!all)}>
      ${all ? 'Hide' : 'Show'} ${same} unchanged step${same === 1 ? '' : 's'}</button>`}
  </div>`;
}

async function loadDiff(templateId, from, to) {
  const base = `/workflow/template/${encodeURIComponent(templateId)}`;
  const [diff, older, newer] = await Promise.all([
    api('GET', `${base}/diff?from=${from}&to=${to}`),
    api('GET', `${base}/versions/${from}`), api('GET', `${base}/versions/${to}`)]);
  return { diff, older: older.version, newer: newer.version };
}

const VERSIONS_SHOWN = 3;  // the list's rows before "Show all"

export function TemplateVersions({ templateId, refresh = 0, onRestored }) {
  const [list, error] = useLoad(() => api('GET', `/workflow/template/${encodeURIComponent(templateId)}/versions`), [templateId, refresh]);
  const [pick, setPick] = useState(null);  // {from, to} chosen; default the last two
  const [actionError, setActionError] = useState(null);
  const versions = list ? list.versions : [];
  const latest = versions.length ? versions[0].version : 0;
  const chosen = pick || { from: Math.max(1, latest - 1), to: latest };
  const [compared, diffError] = useLoad(() => (latest > 0 ? loadDiff(templateId, chosen.from, chosen.to) : Promise.resolve(null)),
    [templateId, latest, chosen.from, chosen.to]);
  const restore = (n) => attempt(setActionError, async () => {
    const answer = await api('POST', `/workflow/template/${encodeURIComponent(templateId)}/versions/${n}/restore`);
    onRestored(answer.template, `Version ${n} restored as version ${answer.version}.`);  // the editor shows it
  });
  const [everyVersion, setEveryVersion] = useState(false);
  const listed = everyVersion ? versions : versions.slice(0, VERSIONS_SHOWN);  // the newest first
  const options = versions.map((v) => [String(v.version), `version ${v.version}`]);
  return html`<section class="versions" aria-labelledby="versions-title">
    <h2 id="versions-title">Versions</h2>
    <${ErrorBox} error=${error || actionError} />
    <table class="version-list"><thead><tr><th>Version</th><th>Saved</th><th>Steps</th><th></th></tr></thead>
      <tbody>${listed.map((v) => html`<tr key=${v.version} data-version=${v.version}>
        <td>${v.version}${v.version === latest ? ' (latest)' : ''}</td><td>${when(v.created_at)}</td><td>${v.step_count}</td>
        <td>${v.version !== latest && html`<${ConfirmButton} label=${`Restore version ${v.version}`} confirm="Restore it"
              onConfirm=${() => restore(v.version)} />`}</td></tr>`)}</tbody></table>
    ${versions.length > VERSIONS_SHOWN && html`<button type="button" class="link" aria-expanded=${everyVersion ? 'true' : 'false'}
        onClick=${() => setEveryVersion(!everyVersion)}>${everyVersion ? `Show the newest ${VERSIONS_SHOWN}` : `Show all ${versions.length} versions`}</button>`}
    ${latest > 1 && html`<div class="grid compare">
      <${Select} label="Compare version" value=${String(chosen.from)} options=${options}
                 onChange=${(v) => setPick({ ...chosen, from: Number(v) })} />
      <${Select} label="with version" value=${String(chosen.to)} options=${options}
                 onChange=${(v) => setPick({ ...chosen, to: Number(v) })} />
    </div>`}
    <${ErrorBox} error=${diffError} />
    ${latest > 1 && compared && html`<${SideBySide} ...${compared} />`}
  </section>`;
}
