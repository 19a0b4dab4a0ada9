// Templates: the list, and an editor with two faces (a step editor and raw JSON) that
// shows every 422 problem next to the step and field it names, and the step graph.
import { html, useState, useMemo } from '../html.js';
import { api, apiAll, isAdmin } from '../api.js';
import { TextField, TextArea, Select, ErrorBox, Notice, useLoad, when, go, useId, ConfirmButton, setFlash, takeFlash, attempt } from '../ui.js';
import { StepGraph, stages } from '../graph.js';
import { StepPolicies, ContainerControls, ShapeSelect, policyDraft, policyApi, usesAgent, unreadableJson, innerField } from '../step_policies.js';
import { TemplateSettings, SETTINGS_FIELDS } from '../template_settings.js';
import { TemplateVersions } from './versions.js';
import { scoped, inWorkspace, chosenWorkspace } from '../workspace.js';

const NODES = ['planner', 'reviewer', 'summarizer'];
// What each system node does (its description in GET /agent/node; orchestra/services/agents.py).
export const NODE_TEXT = {
  planner: 'breaks a request into ordered, concrete steps',
  reviewer: 'checks work for errors and gaps and says what to fix (verifies arithmetic with the calculator)',
  summarizer: 'condenses text and uploaded files into a short summary',
};

/** `facts & numbers → report`: steps that can run side by side share a stage. */
function StepsInStages({ steps }) {
  const list = stages(steps);
  const said = list.map((stage) => stage.join(' and ')).join(', then ');
  return html`<span class="stages" title=${`${said}${list.some((st) => st.length > 1) ? ' (“&”: side by side)' : ''}`}>
    ${list.map((stage, i) => html`${i ? ' → ' : ''}${stage.join(' & ')}`)}</span>`;
}

export function Templates() {
  const [data, error] = useLoad(() => apiAll(scoped('/workflow/template'), 'templates'));
  return html`<section>
    <h1>Templates</h1>
    <p><a class="button primary" href="#/templates/new">New template</a></p>
    <${ErrorBox} error=${error} />
    <div class="table-wrap"><table class="stack">
      <thead><tr><th>Name</th><th>Steps</th><th>Shared</th><th>Changed</th></tr></thead>
      <tbody>
        ${data && data.templates.length === 0 && html`<tr><td colspan="4">No templates yet.</td></tr>`}
        ${data && data.templates.map((t) => html`<tr key=${t.template_id}>
          <td data-label="Name"><a href=${`#/templates/${t.template_id}`}>${t.name}</a><br /><small>${t.description}</small></td>
          <td data-label="Steps"><${StepsInStages} steps=${t.steps} /></td><td data-label="Shared">${t.shared ? 'yes' : 'no'}</td><td data-label="Changed">${when(t.updated_at)}</td>
        </tr>`)}
      </tbody>
    </table></div>
  </section>`;
}

// --- steps as the editor holds them, and as the API takes them ---------------------------

let nextUid = 0;

/** One step as the editor holds it: a `uid` that survives renames, and `after`: the
 * steps it depends on, by uid (a string: an id no step has, shown so it can be removed);
 * `extra`: its other fields (the language's, and any without a control, kept as they are),
 * with the texts of its JSON fields alongside (js/step_policies.js). */
function toEditable(step, uidOf) {
  const agent = step.agent || {};
  const kind = step.http ? 'http' : step.workflow ? 'workflow' : agent.human ? 'human' : agent.node ? 'node' : 'worker';
  const draft = policyDraft(step);
  // A container's inner steps: edited with the same form, when they are a list of steps.
  const list = draft.shape === 'loop' ? (step.loop || {}).steps : draft.shape === 'foreach' ? step.steps : undefined;
  const inner = Array.isArray(list) && list.every((x) => x && typeof x === 'object' && !Array.isArray(x)) ? fromApi(list) : undefined;
  return { ...draft, inner, uid: uidOf(step.id), id: step.id || '', named: step.id || '', kind, worker: agent.worker || '', node: agent.node || 'planner',
    prompt: step.prompt || '', after: (step.depends_on || []).map((d) => uidOf(d, true)), ...callDraft(step) };
}

/** An http or workflow call's fields as the editor holds them (texts for headers and body). */
function callDraft(step) {
  const http = step.http || {};
  const body = http.body;
  return {
    method: http.method || 'GET', url: http.url || '',
    headersText: Object.entries(http.headers || {}).map(([k, v]) => `${k}: ${v}`).join('\n'),
    bodyText: body === undefined || body === null ? '' : typeof body === 'string' ? body : JSON.stringify(body, null, 2),
    requestTimeout: http.timeout_seconds === undefined ? '' : String(http.timeout_seconds),
    child: (step.workflow || {}).template || '', childInput: (step.workflow || {}).input || 'input',
  };
}

/** "Name: value" lines as an object (blank lines skipped). */
function headerLines(text) {
  const out = {};
  for (const line of (text || '').split('\n')) {
    if (!line.trim()) continue;
    const at = line.indexOf(':');
    out[(at < 0 ? line : line.slice(0, at)).trim()] = at < 0 ? '' : line.slice(at + 1).trim();
  }
  return out;
}

/** The call a step makes, as the API takes it: an agent and prompt, an http request, or a child workflow. */
function callApi(step) {
  if (step.kind === 'http') {
    const http = { method: step.method, url: step.url };
    const headers = headerLines(step.headersText);
    if (Object.keys(headers).length) http.headers = headers;
    const body = (step.bodyText || '').trim();
    if (body) { try { http.body = /^[[{]/.test(body) ? JSON.parse(body) : step.bodyText; } catch { http.body = step.bodyText; } }
    if (step.requestTimeout !== '') http.timeout_seconds = Number(step.requestTimeout);
    return { http };
  }
  if (step.kind === 'workflow') return { workflow: { template: step.child, input: step.childInput } };
  const agent = step.kind === 'human' ? { human: true } : step.kind === 'node' ? { node: step.node } : { worker: step.worker };
  return { agent, prompt: step.prompt };
}

/** The API's steps as editable ones: dependencies resolved to the uids of their steps. */
function fromApi(steps) {
  const uids = new Map();
  for (const s of steps) if (s && s.id && !uids.has(s.id)) uids.set(s.id, ++nextUid);
  const uidOf = (id, dependency = false) => (uids.has(id) ? uids.get(id) : dependency ? id : ++nextUid);
  return steps.filter((s) => s && typeof s === 'object').map((s) => toEditable(s, uidOf));
}

function idOf(steps, ref) {
  if (typeof ref === 'string') return ref;
  const found = steps.find((s) => s.uid === ref);
  return found ? found.id : '';
}

function toApi(step, steps) {
  const call = usesAgent(step) ? callApi(step) : {};  // a loop, or a foreach of a small workflow, has neither
  const inner = !usesAgent(step) && step.inner ? step.inner.map((s) => toApi(s, step.inner)) : undefined;
  return { id: step.id, ...call, ...policyApi(step, inner), depends_on: step.after.map((r) => idOf(steps, r)) };
}

const escapeRe = (text) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** The step `uid` was given the id `to`: the other steps' `{{steps.<id>…}}` references
 * follow it (their dependencies follow by themselves: they hold the uid). `named` is the
 * id the references use (in prompts' {{ … }} and in expression fields such as `when`):
 * it stays while the id is empty or another step's, half typed, and moves on with the
 * next usable id. */
function renamed(steps, uid, to) {
  const step = steps.find((s) => s.uid === uid);
  const from = step.named;
  if (!to || from === to || steps.some((s) => s.uid !== uid && s.id === to)) return steps;
  // `steps.<id>` in an expression: inside a prompt's {{ … }}, or a field such as `when`.
  const inExpression = from ? new RegExp(`(^|[^\\w.])steps\\.${escapeRe(from)}(?=$|[^\\w-])`, 'g') : null;
  const carry = (s) => {
    if (!s.prompt.includes(from) && !JSON.stringify(s.extra || {}).includes(from)) return s;
    // Expression fields: `when`, `output`, and a container's `foreach.items`, `loop.until`, `loop.output`.
    const follow = (value) => (typeof value === 'string' ? value.replace(inExpression, `$1steps.${to}`)
      : value && typeof value === 'object' && !Array.isArray(value)
        ? Object.fromEntries(Object.entries(value).map(([k, v]) => [k, follow(v)])) : value);
    const extra = Object.fromEntries(Object.entries(s.extra || {}).map(([key, value]) => [key, key === 'steps' ? value : follow(value)]));
    const prompt = s.prompt.replace(/\{\{[^}]*\}\}/g, (inside) => inside.replace(inExpression, `$1steps.${to}`));
    return { ...s, extra, prompt };
  };
  return steps.map((s) => (s.uid === uid ? { ...s, named: to } : from ? carry(s) : s));
}

/** The template's problems: by step index ({field: [problems]}) and the rest ({field: [problems]}). */
function placeProblems(error, steps) {
  const byStep = {};
  const general = {};
  if (!error || error.status !== 422 || !Array.isArray(error.detail)) return { byStep, general, flagged: new Set() };
  const flagged = new Set();
  const add = (bucket, key, problem) => { (bucket[key] = bucket[key] || []).push(problem); };
  for (const { field, problem } of error.detail) {
    const match = /^steps\.(\d+)(?:\.(.+))?$/.exec(field);
    if (match) {
      const index = Number(match[1]);
      (byStep[index] = byStep[index] || {});
      add(byStep[index], match[2] || 'step', problem);
      if (steps[index]) flagged.add(steps[index].id);
      continue;
    }
    const cycle = field === 'steps' && /cycle: (.+)$/.exec(problem);
    if (cycle) {
      // The cycle names step ids, not indexes: show it at every step on the path.
      for (const id of cycle[1].split(' -> ')) {
        const index = steps.findIndex((s) => s.id === id);
        if (index < 0 || flagged.has(id)) continue;
        flagged.add(id);
        add((byStep[index] = byStep[index] || {}), 'depends_on', problem);
      }
      continue;
    }
    add(general, field, problem);
  }
  return { byStep, general, flagged };
}

function Problems({ list }) {
  return list && list.length ? list.map((p) => html`<small class="problem">${p}</small>`) : null;
}

/** The inner steps of a container, edited with the same step form: their problems are
 * the container's under `loop.steps.<n>` or `steps.<n>` (`steps.3.loop.steps.0.prompt`). */
function InnerSteps({ step, workers, problems, onChange }) {
  const list = step.inner;
  const base = innerField(step);
  const detail = [];
  for (const [key, found] of Object.entries(problems)) {
    if (key === base || key.startsWith(`${base}.`)) for (const problem of found) detail.push({ field: `steps${key.slice(base.length)}`, problem });
  }
  const { byStep, general } = placeProblems({ status: 422, detail }, list.map((s) => toApi(s, list)));
  const set = (next) => onChange({ ...step, inner: next });
  const change = (i) => (changed) => set(renamed(list.map((s, j) => (j === i ? changed : s)), changed.uid, changed.id));
  const move = (i) => (delta) => {
    const next = [...list];
    [next[i], next[i + delta]] = [next[i + delta], next[i]];
    set(next);
  };
  const whole = Object.values(general).flat();
  return html`<fieldset class=${'inner-editor' + (detail.length ? ' invalid' : '')}>
    <legend>${step.shape === 'loop' ? 'Steps of each iteration' : 'Steps of each item'}</legend>
    <${Problems} list=${whole} />
    ${list.map((s, i) => html`<${StepEditor} key=${s.uid} step=${s} index=${i} steps=${list} workers=${workers} inner
        problems=${byStep[i] || {}} onChange=${change(i)} onMove=${move(i)} onRemove=${() => set(removed(list, i))} />`)}
    <button type="button" onClick=${() => set([...list, blankStep(list, workers, step.shape)])}>Add an inner step</button>
  </fieldset>`;
}

function StepEditor({ step, index, steps, workers, problems, onChange, onRemove, onMove, inner = false }) {
  const set = (key) => (value) => onChange({ ...step, [key]: value });
  const others = steps.filter((s, i) => i !== index && s.id);
  const first = (field) => (problems[field] || [])[0];
  const legend = useId('step');
  const unknown = step.after.filter((r) => typeof r === 'string' || !others.some((o) => o.uid === r));
  const toggle = (uid, on) => set('after')(on ? [...step.after, uid] : step.after.filter((r) => r !== uid));
  const newInner = (list, shape) => blankStep(list, workers, shape);
  const workerOptions = workers.map((w) => [w.worker_id, w.name]);
  // A template may name its worker by id or by name: either picks the worker in the select.
  const chosen = workers.find((w) => w.worker_id === step.worker) || workers.find((w) => w.name === step.worker);
  if (!chosen) workerOptions.unshift(['', workers.length ? 'choose a worker' : 'no workers yet']);
  return html`<fieldset class=${'step' + (inner ? ' inner' : '') + (Object.keys(problems).length ? ' invalid' : '')}
                        data-step-index=${inner ? undefined : index} data-inner-index=${inner ? index : undefined}
                        aria-labelledby=${legend}>
    <legend><span id=${legend}>${inner ? 'Inner step' : 'Step'} ${index + 1}${step.id ? `: ${step.id}` : ''}</span>
      <span class="step-actions">
        <button type="button" onClick=${() => onMove(-1)} disabled=${index === 0} aria-label=${`Move step ${index + 1} up`}>↑</button>
        <button type="button" onClick=${() => onMove(1)} disabled=${index === steps.length - 1} aria-label=${`Move step ${index + 1} down`}>↓</button>
        <button type="button" onClick=${onRemove} disabled=${inner && steps.length === 1}>Remove step</button>
      </span></legend>
    <${Problems} list=${problems.step} />
    <div class="grid">
      <${TextField} label="Step id" value=${step.id} onInput=${set('id')} problem=${first('id')} />
      <${ShapeSelect} step=${step} onChange=${onChange} problems=${problems} newInner=${newInner} />
      ${usesAgent(step) && html`<${Select} label="Agent" value=${step.kind} onChange=${set('kind')} problem=${first('agent')}
                 options=${[['worker', 'a worker'], ['node', 'a system node'], ['human', 'a human (asks you)'],
                            ['http', 'an HTTP request'], ['workflow', 'another template (a child run)']]} />`}
      ${usesAgent(step) && step.kind === 'http' && html`<${Select} label="Method" value=${step.method} onChange=${set('method')}
          problem=${first('http.method')} options=${HTTP_METHODS.map((m) => [m, m])} />`}
      ${usesAgent(step) && step.kind === 'workflow' && html`<${TextField} label="Template" value=${step.child} onInput=${set('child')}
          problem=${first('workflow.template')} hint="the id or name of a template you may run (not this one)" />`}
      ${usesAgent(step) && step.kind === 'worker' && html`<${Select} label="Worker" value=${chosen ? chosen.worker_id : ''} onChange=${set('worker')}
          problem=${first('agent.worker')} options=${workerOptions}
          hint=${workers.length ? '' : html`<span class="no-workers">Create a worker first, on the <a href="#/workers">Workers</a> page (or let a human or a system node do this step).</span>`} />`}
      ${usesAgent(step) && step.kind === 'node' && html`<${Select} label="System node" value=${step.node} onChange=${set('node')}
          problem=${first('agent.node')} options=${NODES.map((n) => [n, n])}
          hint=${`The ${step.node} ${NODE_TEXT[step.node] || ''}.`} />`}
    </div>
    <${ContainerControls} step=${step} onChange=${onChange} problems=${problems} newInner=${newInner}
        innerEditor=${step.inner && html`<${InnerSteps} step=${step} workers=${workers} problems=${problems} onChange=${onChange} />`} />
    ${usesAgent(step) && step.kind === 'http' && html`<${HttpFields} step=${step} set=${set} problems=${problems} />`}
    ${usesAgent(step) && step.kind === 'workflow' && html`<${TextField} label="Child's input" value=${step.childInput} onInput=${set('childInput')}
        problem=${first('workflow.input')} hint="a CEL expression, e.g. input or steps.plan.output; the child's output is this step's" />`}
    ${usesAgent(step) && !CALLS.includes(step.kind) && html`<${TextArea} label="Prompt" value=${step.prompt} onInput=${set('prompt')} rows="2" fit problem=${(problems.prompt || []).join(' ')}
                 hint=${step.shape === 'foreach' ? 'Use {{item}}, {{index}}, {{input}} and {{ expressions }}.'
                   : index === 0 ? 'Use {{input}}, {{steps.<id>.output}} of a step it depends on, and {{ expressions }}.' : ''} />`}
    <fieldset class=${'depends' + (problems.depends_on ? ' invalid' : '')}>
      <legend>Depends on</legend>
      ${others.length === 0 && unknown.length === 0 && html`<small>no other steps</small>`}
      ${others.map((o) => html`<label class="check"><input type="checkbox" checked=${step.after.includes(o.uid)}
          onChange=${(e) => toggle(o.uid, e.target.checked)} /> ${o.id}</label>`)}
      ${unknown.map((r) => { const name = idOf(steps, r) || '(a removed step)'; return html`<span class="badge unknown">${name} (unknown)
          <button type="button" class="link" aria-label=${`Remove the dependency on ${name}`}
                  onClick=${() => set('after')(step.after.filter((x) => x !== r))}>×</button></span>`; })}
      <${Problems} list=${problems.depends_on} />
    </fieldset>
    <${StepPolicies} step=${step} onChange=${onChange} problems=${problems} />
  </fieldset>`;
}

const HTTP_METHODS = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS'];
const CALLS = ['http', 'workflow'];

/** An HTTP step's request: URL, headers and body may use {{ }}; secrets only in URL and headers. */
function HttpFields({ step, set, problems }) {
  const at = (prefix) => Object.entries(problems).filter(([f]) => f === prefix || f.startsWith(`${prefix}.`))
    .map(([, list]) => list.join(' ')).join(' ') || undefined;
  return html`<div class="grid http-fields">
    <div class="full"><${TextArea} label="URL" value=${step.url} onInput=${(v) => set('url')(v.replace(/[\r\n]+/g, ''))}
        rows="1" fit class="url" spellcheck="false" problem=${at('http.url')}
        hint="http(s)://…; {{ input }}, {{ steps.<id>.output… }} and {{ secrets.NAME }} may be used" /></div>
    <div class="wide"><${TextArea} label="Headers" value=${step.headersText} onInput=${set('headersText')} rows="2" fit class="code"
        spellcheck="false" problem=${at('http.headers')} hint="Name: value, one per line; e.g. Authorization: Bearer {{ secrets.API_KEY }}" /></div>
    <div class="wide"><${TextArea} label="Body" value=${step.bodyText} onInput=${set('bodyText')} rows="2" fit class="code"
        spellcheck="false" problem=${at('http.body')} hint="JSON (sent as JSON) or text; {{ }} allowed, secrets not" /></div>
    <${TextField} label="Request timeout (s)" value=${step.requestTimeout} onInput=${set('requestTimeout')} type="number" min="1" step="any"
        problem=${at('http.timeout_seconds')} hint="default 30" />
  </div>`;
}

/** Step `index` removed: steps that depended on it keep the dependency by its id, shown
 * as unknown (with a button to remove it), so nothing changes without a word. */
function removed(steps, index) {
  const gone = steps[index];
  return steps.filter((_, j) => j !== index)
    .map((s) => (s.after.includes(gone.uid) ? { ...s, after: s.after.map((r) => (r === gone.uid ? gone.id : r)) } : s));
}

/** A new step: done by a worker (the first one; with none yet, the editor says to create
 * one first), after the last step, reading its output. */
function blankStep(steps, workers, container = '') {
  let n = steps.length + 1;
  while (steps.some((s) => s.id === `step${n}`)) n += 1;
  const last = steps[steps.length - 1];
  const first = container === 'foreach' ? '{{item}}' : container === 'loop' ? 'Iteration {{ loop.iteration }} of {{input}}' : '{{input}}';
  return { ...policyDraft({}), ...callDraft({}), uid: ++nextUid, id: `step${n}`, named: `step${n}`, kind: 'worker', worker: workers[0] ? workers[0].worker_id : '', node: 'planner',
    prompt: last && last.id ? `{{steps.${last.id}.output}}` : first, after: last ? [last.uid] : [] };
}

/** Problems the API would answer with a 422, found before sending: a worker step
 * without a worker (the API's "unknown worker ''"). Shaped like the API's 422. */
function missingWorkers(steps, prefix = 'steps') {
  const detail = steps.flatMap((s, i) => (usesAgent(s)
    ? (s.kind === 'worker' && !s.worker ? [{ field: `${prefix}.${i}.agent.worker`, problem: 'choose a worker (or another agent)' }] : [])
    : s.inner ? (missingWorkers(s.inner, `${prefix}.${i}.${innerField(s)}`) || { detail: [] }).detail : []));
  return detail.length ? { status: 422, detail, message: 'Choose a worker for every step done by a worker; none yet? Create one on the Workers page first.' } : null;
}

/** The workers a template's steps may name (SPEC §16: never another workspace's): those of
 * its workspace — an existing template's own, a new one's the chosen workspace (with "All
 * workspaces" it goes to your personal one). A workspace whose workers you may not list
 * (another user's personal one, for an administrator editing a shared template) offers none. */
async function workersOf(template) {
  let where = template ? template.workspace_id : chosenWorkspace();
  if (!where) where = ((await api('GET', '/workspace')).workspaces.find((w) => w.personal) || {}).workspace_id;
  if (!where) return [];
  try {
    return (await apiAll(`/agent/worker?workspace_id=${encodeURIComponent(where)}`, 'workers')).workers;
  } catch (err) {
    if (err.status === 404) return [];
    throw err;
  }
}

async function loadEditor(templateId) {
  const found = templateId === 'new' ? null : await api('GET', `/workflow/template/${encodeURIComponent(templateId)}`);
  const template = found && found.template;
  return { workers: await workersOf(template), template };
}

export function TemplateEditor({ templateId }) {
  const [data, loadError] = useLoad(() => loadEditor(templateId), [templateId]);
  if (loadError) return html`<section><h1>Template</h1><${ErrorBox} error=${loadError} /></section>`;
  if (!data) return html`<p class="loading">Loading…</p>`;
  return html`<${TemplateForm} templateId=${templateId} template=${data.template} workers=${data.workers} />`;
}

const OWN = ['name', 'description', 'shared', 'steps', 'input_schema', 'template_id', 'owner_id', 'created_at', 'updated_at'];
const schemaTextOf = (template) => (template && template.input_schema !== undefined && template.input_schema !== null
  ? JSON.stringify(template.input_schema, null, 2) : '');
const readJson = (text) => { try { return JSON.parse(text); } catch { return text; } };
const unreadable = (text) => { try { JSON.parse(text); return ''; } catch (err) { return err.message; } };
function templateRest(template) {
  return Object.fromEntries(Object.entries(template || {}).filter(([key]) => !OWN.includes(key)));
}

function TemplateForm({ templateId, template, workers }) {
  // Template fields other than name, description, shared, steps and input_schema (limits,
  // output, and any the editor has no control for, kept as they are).
  const [rest, setRest] = useState(() => templateRest(template));
  const [schemaText, setSchemaText] = useState(() => schemaTextOf(template));
  const [name, setName] = useState(template ? template.name : '');
  const [description, setDescription] = useState(template ? template.description : '');
  const [shared, setShared] = useState(template ? template.shared : false);
  const [steps, setSteps] = useState(() => (template ? fromApi(template.steps) : [blankStep([], workers)]));
  const [mode, setMode] = useState('steps');
  const [jsonText, setJsonText] = useState('');
  const [jsonError, setJsonError] = useState('');
  const [error, setError] = useState(null);
  const [notice, setNotice] = useState(takeFlash);
  const sharedId = useId('shared');
  const [saves, setSaves] = useState(0);  // the versions list reloads after each save
  const restored = (saved, text) => {  // a restored version is the template now: show it
    setRest(templateRest(saved));
    setSchemaText(schemaTextOf(saved));
    setName(saved.name);
    setDescription(saved.description);
    setShared(saved.shared);
    setSteps(fromApi(saved.steps));
    setMode('steps');
    setError(null);
    setNotice(text);
    setSaves((n) => n + 1);
  };

  const body = () => ({ ...rest, name, description, shared, ...(schemaText.trim() ? { input_schema: readJson(schemaText) } : {}),
    steps: steps.map((st) => toApi(st, steps)) });
  const jsonBody = () => JSON.parse(jsonText);
  const switchMode = (next) => {
    if (next === mode) return;
    if (next === 'json') {
      setJsonText(JSON.stringify(body(), null, 2));
      setMode('json');
      return;
    }
    try {
      const parsed = jsonBody();
      setRest(templateRest(parsed));
      setSchemaText(schemaTextOf(parsed));
      setName(parsed.name || '');
      setDescription(parsed.description || '');
      setShared(!!parsed.shared);
      setSteps(fromApi(parsed.steps || []));
      setJsonError('');
      setMode('steps');
    } catch (err) {
      setJsonError(`The JSON cannot be read: ${err.message}`);
    }
  };
  const shownSteps = useMemo(() => {
    if (mode === 'steps') return steps.map((st) => toApi(st, steps));
    try { return (jsonBody().steps || []).filter((s) => s && typeof s === 'object'); } catch { return []; }
  }, [mode, steps, jsonText]);
  const { byStep, general, flagged } = placeProblems(error, shownSteps);

  const save = async (e) => {
    e.preventDefault();
    let payload;
    const schemaProblem = mode === 'steps' && schemaText.trim() && unreadable(schemaText)
      && { status: 422, detail: [{ field: 'input_schema', problem: `not JSON: ${unreadable(schemaText)}` }], message: 'The input schema is not JSON.' };
    const missing = mode === 'steps' && (missingWorkers(steps) || unreadableJson(steps) || schemaProblem);
    if (missing) {
      setNotice('');
      setError(missing);
      return;
    }
    try {
      payload = mode === 'json' ? jsonBody() : body();
      setJsonError('');
    } catch (err) {
      setJsonError(`The JSON cannot be read: ${err.message}`);
      return;
    }
    try {
      const saved = templateId === 'new'
        ? await api('POST', '/workflow/template', inWorkspace(payload))
        : await api('PUT', `/workflow/template/${templateId}`, payload);
      setError(null);
      setSaves((n) => n + 1);
      const text = `Template '${saved.template.name}' ${templateId === 'new' ? 'created' : 'saved'}.`;
      setNotice(text);
      if (templateId === 'new') {
        setFlash(text);
        go(`templates/${saved.template_id}`);
      }
    } catch (err) {
      setNotice('');
      setError(err);
    }
  };
  const remove = () => attempt(setError, async () => {
    await api('DELETE', `/workflow/template/${templateId}`);
    go('templates');
  });
  const changeStep = (i) => (step) => setSteps(renamed(steps.map((s, j) => (j === i ? step : s)), step.uid, step.id));
  const moveStep = (i) => (delta) => {
    const next = [...steps];
    [next[i], next[i + delta]] = [next[i + delta], next[i]];
    setSteps(next);
  };
  const settingsOwn = (f) => SETTINGS_FIELDS.some((s) => f === s || f.startsWith(`${s}.`));
  const generalList = Object.entries(general).filter(([f]) => !['name', 'description'].includes(f) && (mode === 'json' || !settingsOwn(f)));
  return html`<section>
    <h1>${templateId === 'new' ? 'New template' : `Template ${name}`}</h1>
    <${Notice} text=${notice} />
    <form onSubmit=${save} novalidate>
      <div class="tabs" role="group" aria-label="Editor">
        <button type="button" aria-pressed=${mode === 'steps'} onClick=${() => switchMode('steps')}>Step editor</button>
        <button type="button" aria-pressed=${mode === 'json'} onClick=${() => switchMode('json')}>JSON</button>
      </div>
      ${mode === 'steps' ? html`
        <div class="grid">
          <${TextField} label="Name" value=${name} onInput=${setName} problem=${(general.name || [])[0]} />
          <${TextField} label="Description" value=${description} onInput=${setDescription} problem=${(general.description || [])[0]} />
        </div>
        ${isAdmin() && html`<label class="check" for=${sharedId}><input id=${sharedId} type="checkbox" checked=${shared}
            onChange=${(e) => setShared(e.target.checked)} /> Shared with every user</label>`}
        <${TemplateSettings} rest=${rest} setRest=${setRest} schemaText=${schemaText} setSchemaText=${setSchemaText} problems=${general} />
        ${steps.map((s, i) => html`<${StepEditor} key=${s.uid} step=${s} index=${i} steps=${steps} workers=${workers}
            problems=${byStep[i] || {}} onChange=${changeStep(i)} onMove=${moveStep(i)}
            onRemove=${() => setSteps(removed(steps, i))} />`)}
        <button type="button" onClick=${() => setSteps([...steps, blankStep(steps, workers)])}>Add a step</button>`
      : html`
        <${TextArea} label="Template as JSON" value=${jsonText} onInput=${setJsonText} rows="18" class="code"
                     problem=${jsonError} spellcheck="false" />
        ${error && Array.isArray(error.detail) && html`<ul class="problems">
          ${error.detail.map((p) => html`<li><code>${p.field}</code> ${p.problem}</li>`)}</ul>`}`}
      ${generalList.map(([f, list]) => list.map((p) => html`<p class="problem" role="alert"><code>${f}</code> ${p}</p>`))}
      <${ErrorBox} error=${error} />
      <div class="row">
        <button type="submit" class="primary">Save template</button>
        ${templateId !== 'new' && html`<a class="button" href=${`#/runs?template=${templateId}`}>Run it</a>
          <${ConfirmButton} label="Delete template" confirm="Delete it" onConfirm=${remove} />`}
      </div>
    </form>
    <h2>Step graph</h2>
    <${StepGraph} steps=${shownSteps} flagged=${flagged} />
    ${templateId !== 'new' && html`<${TemplateVersions} templateId=${templateId} refresh=${saves} onRestored=${restored} />`}
  </section>`;
}
