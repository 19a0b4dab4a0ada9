// Templates: the list, and an editor with two faces (a step editor and raw JSON) that
// shows every 422 problem next to the step and field it names, and the step graph.
import { html, useState, useMemo } from '../html.js';
import { api, apiAll, isAdmin } from '../api.js';
import { TextField, TextArea, Select, ErrorBox, Notice, useLoad, when, go, useId, ConfirmButton, setFlash, takeFlash, attempt } from '../ui.js';
import { StepGraph } from '../graph.js';

const NODES = ['planner', 'reviewer', 'summarizer'];

export function Templates() {
  const [data, error] = useLoad(() => apiAll('/workflow/template', 'templates'));
  return html`<section>
    <h1>Templates</h1>
    <p><a class="button primary" href="#/templates/new">New template</a></p>
    <${ErrorBox} error=${error} />
    <div class="table-wrap"><table>
      <thead><tr><th>Name</th><th>Steps</th><th>Shared</th><th>Changed</th></tr></thead>
      <tbody>
        ${data && data.templates.length === 0 && html`<tr><td colspan="4">No templates yet.</td></tr>`}
        ${data && data.templates.map((t) => html`<tr key=${t.template_id}>
          <td><a href=${`#/templates/${t.template_id}`}>${t.name}</a><br /><small>${t.description}</small></td>
          <td>${t.steps.map((s) => s.id).join(' → ')}</td><td>${t.shared ? 'yes' : 'no'}</td><td>${when(t.updated_at)}</td>
        </tr>`)}
      </tbody>
    </table></div>
  </section>`;
}

// --- steps as the editor holds them, and as the API takes them ---------------------------

function toEditable(step) {
  const agent = step.agent || {};
  const kind = agent.human ? 'human' : agent.node ? 'node' : 'worker';
  return { id: step.id || '', kind, worker: agent.worker || '', node: agent.node || 'planner',
    prompt: step.prompt || '', depends_on: step.depends_on || [] };
}

function toApi(step) {
  const agent = step.kind === 'human' ? { human: true } : step.kind === 'node' ? { node: step.node } : { worker: step.worker };
  return { id: step.id, agent, prompt: step.prompt, depends_on: step.depends_on };
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

function StepEditor({ step, index, steps, workers, problems, onChange, onRemove, onMove }) {
  const set = (key) => (value) => onChange({ ...step, [key]: value });
  const others = steps.filter((s, i) => i !== index && s.id);
  const first = (field) => (problems[field] || [])[0];
  const legend = useId('step');
  return html`<fieldset class=${'step' + (Object.keys(problems).length ? ' invalid' : '')} data-step-index=${index}
                        aria-labelledby=${legend}>
    <legend id=${legend}>Step ${index + 1}${step.id ? `: ${step.id}` : ''}</legend>
    <${Problems} list=${problems.step} />
    <div class="grid">
      <${TextField} label="Step id" value=${step.id} onInput=${set('id')} problem=${first('id')} />
      <${Select} label="Agent" value=${step.kind} onChange=${set('kind')} problem=${first('agent')}
                 options=${[['worker', 'a worker'], ['node', 'a system node'], ['human', 'a human (asks you)']]} />
      ${step.kind === 'worker' && html`<${Select} label="Worker" value=${step.worker} onChange=${set('worker')}
          problem=${first('agent.worker')}
          options=${[['', 'choose a worker'], ...workers.map((w) => [w.worker_id, w.name])]} />`}
      ${step.kind === 'node' && html`<${Select} label="System node" value=${step.node} onChange=${set('node')}
          problem=${first('agent.node')} options=${NODES.map((n) => [n, n])} />`}
    </div>
    <${TextArea} label="Prompt" value=${step.prompt} onInput=${set('prompt')} problem=${(problems.prompt || []).join(' ')}
                 hint="Use {{input}} and {{steps.<id>.output}} of a step it depends on." />
    <fieldset class=${'depends' + (problems.depends_on ? ' invalid' : '')}>
      <legend>Depends on</legend>
      ${others.length === 0 && html`<small>no other steps</small>`}
      ${others.map((o) => html`<label class="check"><input type="checkbox" checked=${step.depends_on.includes(o.id)}
          onChange=${(e) => set('depends_on')(e.target.checked ? [...step.depends_on, o.id] : step.depends_on.filter((d) => d !== o.id))} />
          ${o.id}</label>`)}
      ${step.depends_on.filter((d) => !others.some((o) => o.id === d)).map((d) => html`<span class="badge">${d} (unknown)</span>`)}
      <${Problems} list=${problems.depends_on} />
    </fieldset>
    <div class="row">
      <button type="button" onClick=${() => onMove(-1)} disabled=${index === 0} aria-label=${`Move step ${index + 1} up`}>↑</button>
      <button type="button" onClick=${() => onMove(1)} disabled=${index === steps.length - 1} aria-label=${`Move step ${index + 1} down`}>↓</button>
      <button type="button" onClick=${onRemove}>Remove step</button>
    </div>
  </fieldset>`;
}

function blankStep(steps) {
  let n = steps.length + 1;
  while (steps.some((s) => s.id === `step${n}`)) n += 1;
  const last = steps[steps.length - 1];
  return { id: `step${n}`, kind: 'human', worker: '', node: 'planner',
    prompt: last && last.id ? `{{steps.${last.id}.output}}` : '{{input}}', depends_on: last && last.id ? [last.id] : [] };
}

async function loadEditor(templateId) {
  const [workers, template] = await Promise.all([
    apiAll('/agent/worker', 'workers'),
    templateId === 'new' ? null : api('GET', `/workflow/template/${encodeURIComponent(templateId)}`),
  ]);
  return { workers: workers.workers, template: template && template.template };
}

export function TemplateEditor({ templateId }) {
  const [data, loadError] = useLoad(() => loadEditor(templateId), [templateId]);
  if (loadError) return html`<section><h1>Template</h1><${ErrorBox} error=${loadError} /></section>`;
  if (!data) return html`<p class="loading">Loading…</p>`;
  return html`<${TemplateForm} templateId=${templateId} template=${data.template} workers=${data.workers} />`;
}

function TemplateForm({ templateId, template, workers }) {
  const [name, setName] = useState(template ? template.name : '');
  const [description, setDescription] = useState(template ? template.description : '');
  const [shared, setShared] = useState(template ? template.shared : false);
  const [steps, setSteps] = useState(() => (template ? template.steps.map(toEditable) : [blankStep([])]));
  const [mode, setMode] = useState('steps');
  const [jsonText, setJsonText] = useState('');
  const [jsonError, setJsonError] = useState('');
  const [error, setError] = useState(null);
  const [notice, setNotice] = useState(takeFlash);
  const sharedId = useId('shared');

  const body = () => ({ name, description, shared, steps: steps.map(toApi) });
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
      setName(parsed.name || '');
      setDescription(parsed.description || '');
      setShared(!!parsed.shared);
      setSteps((parsed.steps || []).map(toEditable));
      setJsonError('');
      setMode('steps');
    } catch (err) {
      setJsonError(`The JSON cannot be read: ${err.message}`);
    }
  };
  const shownSteps = useMemo(() => {
    if (mode === 'steps') return steps.map(toApi);
    try { return (jsonBody().steps || []).filter((s) => s && typeof s === 'object'); } catch { return []; }
  }, [mode, steps, jsonText]);
  const { byStep, general, flagged } = placeProblems(error, shownSteps);

  const save = async (e) => {
    e.preventDefault();
    let payload;
    try {
      payload = mode === 'json' ? jsonBody() : body();
      setJsonError('');
    } catch (err) {
      setJsonError(`The JSON cannot be read: ${err.message}`);
      return;
    }
    try {
      const saved = templateId === 'new'
        ? await api('POST', '/workflow/template', payload)
        : await api('PUT', `/workflow/template/${templateId}`, payload);
      setError(null);
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
  const changeStep = (i) => (step) => setSteps(steps.map((s, j) => (j === i ? step : s)));
  const moveStep = (i) => (delta) => {
    const next = [...steps];
    [next[i], next[i + delta]] = [next[i + delta], next[i]];
    setSteps(next);
  };
  const generalList = Object.entries(general).filter(([f]) => !['name', 'description'].includes(f));
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
        ${steps.map((s, i) => html`<${StepEditor} key=${i} step=${s} index=${i} steps=${steps} workers=${workers}
            problems=${byStep[i] || {}} onChange=${changeStep(i)} onMove=${moveStep(i)}
            onRemove=${() => setSteps(steps.filter((_, j) => j !== i))} />`)}
        <button type="button" onClick=${() => setSteps([...steps, blankStep(steps)])}>Add a step</button>`
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
  </section>`;
}
