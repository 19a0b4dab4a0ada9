// Workers: the caller's own, created and edited with tools from /resource/tool, a skill,
// a provider and a model. Administrators also manage skills and the system nodes.
import { html, useState } from '../html.js';
import { api, apiAll, isAdmin } from '../api.js';
import { TextField, TextArea, Select, ErrorBox, Notice, useLoad, problemsByField, ConfirmButton, attempt } from '../ui.js';
import { NODE_TEXT } from './templates.js';
import { scoped, inWorkspace, chosenWorkspace } from '../workspace.js';

const BLANK = { name: '', description: '', system_prompt: '', provider_id: '', model: '', tools: [], bound_skill: '' };

function WorkerForm({ worker, catalog, onSaved, onCancel }) {
  const [form, setForm] = useState(() => (worker
    ? { ...BLANK, ...worker, model: worker.model || '', bound_skill: worker.bound_skill || '' }
    : { ...BLANK, provider_id: catalog.providers[0] ? catalog.providers[0].provider_id : '' }));
  const [error, setError] = useState(null);
  const set = (key) => (value) => setForm({ ...form, [key]: value });
  const problems = problemsByField(error);
  const toggleTool = (name) => set('tools')(form.tools.includes(name)
    ? form.tools.filter((t) => t !== name) : [...form.tools, name]);
  const submit = async (e) => {
    e.preventDefault();
    const body = {
      name: form.name, description: form.description, system_prompt: form.system_prompt,
      provider_id: form.provider_id, tools: form.tools,
      model: form.model || null, bound_skill: form.bound_skill || null,
    };
    try {
      const saved = worker
        ? await api('PUT', `/agent/worker/${worker.worker_id}`, body)
        : await api('POST', '/agent/worker', inWorkspace(body));
      onSaved(`Worker '${saved.name}' ${worker ? 'saved' : 'created'}.`);
    } catch (err) {
      setError(err);
    }
  };
  const toolProblems = Object.entries(problems).filter(([f]) => f.startsWith('tools'));
  return html`<form class="card" onSubmit=${submit} aria-labelledby="worker-form">
    <h2 id="worker-form">${worker ? `Edit worker ${worker.name}` : 'New worker'}</h2>
    <div class="grid">
      <${TextField} label="Name" value=${form.name} onInput=${set('name')} required problem=${problems.name} />
      <${Select} label="Provider" value=${form.provider_id} onChange=${set('provider_id')} problem=${problems.provider_id}
                 options=${catalog.providers.length ? catalog.providers.map((p) => [p.provider_id, `${p.name} (${p.provider}, ${p.model_id}${p.workspace_id ? ", this workspace's" : ''})`])
                                                    : [['', 'no provider yet: an administrator adds one']]} />
      <${TextField} label="Model" value=${form.model} onInput=${set('model')} problem=${problems.model}
                    hint="empty: the provider's model" />
      <${Select} label="Skill" value=${form.bound_skill} onChange=${set('bound_skill')} problem=${problems.bound_skill}
                 options=${[['', 'none'], ...catalog.skills.map((s) => [s.name, s.name])]} />
    </div>
    <${TextField} label="Description" value=${form.description} onInput=${set('description')} problem=${problems.description} />
    <${TextArea} label="System prompt" value=${form.system_prompt} onInput=${set('system_prompt')} problem=${problems.system_prompt} />
    <fieldset class="tools">
      <legend>Tools</legend>
      ${catalog.tools.map((t) => html`<label class="check" title=${t.description}>
        <input type="checkbox" checked=${form.tools.includes(t.name)} onChange=${() => toggleTool(t.name)} />
        ${t.name} <small>${t.description}</small></label>`)}
      ${toolProblems.map(([, p]) => html`<small class="problem">${p}</small>`)}
    </fieldset>
    <${ErrorBox} error=${error} />
    <div class="row">
      <button type="submit" class="primary">${worker ? 'Save worker' : 'Create worker'}</button>
      ${worker && html`<button type="button" onClick=${onCancel}>Cancel</button>`}
    </div>
  </form>`;
}

function Skills({ skills, onChanged }) {
  const [form, setForm] = useState({ name: '', description: '', instructions: '' });
  const [error, setError] = useState(null);
  const problems = problemsByField(error);
  const set = (key) => (value) => setForm({ ...form, [key]: value });
  const add = async (e) => {
    e.preventDefault();
    try {
      await api('POST', '/resource/skill', form);
      setForm({ name: '', description: '', instructions: '' });
      setError(null);
      onChanged(`Skill '${form.name}' added.`);
    } catch (err) {
      setError(err);
    }
  };
  const remove = (s) => attempt(setError, async () => {
    await api('DELETE', `/resource/skill/${s.skill_id}`);
    onChanged(`Skill '${s.name}' deleted.`);
  });
  return html`<section class="card" aria-labelledby="skills">
    <h2 id="skills">Skills</h2>
    <ul class="plain">${skills.map((s) => html`<li key=${s.skill_id}><strong>${s.name}</strong> ${s.description}
      <${ConfirmButton} label="Delete" confirm=${`Delete ${s.name}`} onConfirm=${() => remove(s)} /></li>`)}</ul>
    <form onSubmit=${add}>
      <div class="grid">
        <${TextField} label="Skill name" value=${form.name} onInput=${set('name')} required problem=${problems.name} />
        <${TextField} label="Skill description" value=${form.description} onInput=${set('description')} problem=${problems.description} />
      </div>
      <${TextArea} label="Instructions" value=${form.instructions} onInput=${set('instructions')} problem=${problems.instructions} />
      <${ErrorBox} error=${error} />
      <button type="submit">Add skill</button>
    </form>
  </section>`;
}

function NodeRow({ node, providers, onChanged }) {
  const [provider, setProvider] = useState(node.provider || '');
  const [model, setModel] = useState(node.model || '');
  const [error, setError] = useState(null);
  const save = () => attempt(setError, async () => {
    await api('PUT', `/agent/node/${node.name}`, { provider: provider || null, model: model || null });
    onChanged(`System node '${node.name}' saved.`);
  });
  return html`<li class="node">
    <strong>${node.name}</strong> <small>tools: ${node.tools.join(', ')}</small>
    <p class="hint">The ${node.name} ${NODE_TEXT[node.name] || node.description}.</p>
    <div class="grid">
      <${Select} label=${`Provider of ${node.name}`} value=${provider} onChange=${setProvider}
                 options=${[['', 'none (cannot run)'], ...providers.map((p) => [p.provider_id, p.name])]} />
      <${TextField} label=${`Model of ${node.name}`} value=${model} onInput=${setModel} hint="empty: the provider's model" />
    </div>
    <button type="button" onClick=${save}>Save ${node.name}</button>
    <${ErrorBox} error=${error} />
  </li>`;
}

async function loadCatalog() {
  const [workers, providers, own, tools, skills, nodes] = await Promise.all([
    apiAll(scoped('/agent/worker'), 'workers'), api('GET', '/provider'),
    // a worker of the chosen workspace may also use the workspace's own providers (listed first)
    chosenWorkspace() ? api('GET', scoped('/provider')) : { providers: [] },
    api('GET', '/resource/tool'), api('GET', '/resource/skill'), api('GET', '/agent/node'),
  ]);
  return { workers: workers.workers, providers: [...own.providers, ...providers.providers], instanceProviders: providers.providers,
    tools: tools.tools, skills: skills.skills, nodes: nodes.nodes };
}

export function Workers() {
  const [catalog, loadError, reload] = useLoad(loadCatalog);
  const [editing, setEditing] = useState(null);
  const [saves, setSaves] = useState(0);  // a new, empty form after each save
  const [notice, setNotice] = useState('');
  const [error, setError] = useState(null);
  const changed = (text) => { setNotice(text); setEditing(null); setError(null); setSaves((n) => n + 1); reload(); };
  const remove = (w) => attempt(setError, async () => {
    await api('DELETE', `/agent/worker/${w.worker_id}`);
    changed(`Worker '${w.name}' deleted.`);
  });
  return html`<section>
    <h1>Workers</h1>
    <${Notice} text=${notice} />
    <${ErrorBox} error=${loadError || error} />
    ${catalog && html`
      <div class="table-wrap"><table class="stack">
        <thead><tr><th>Name</th><th>Provider</th><th>Model</th><th>Tools</th><th>Skill</th><th>Actions</th></tr></thead>
        <tbody>
          ${catalog.workers.length === 0 && html`<tr><td colspan="6">No workers yet: create one below.</td></tr>`}
          ${catalog.workers.map((w) => html`<tr key=${w.worker_id} data-worker=${w.name}>
            <td data-label="Name">${w.name}<br /><small><code>${w.worker_id}</code></small></td><td data-label="Provider">${w.provider_name}</td>
            <td data-label="Model">${w.model || html`<small>provider's</small>`}</td><td data-label="Tools">${w.tools.join(', ') || '–'}</td>
            <td data-label="Skill">${w.bound_skill || '–'}</td>
            <td class="actions" data-label="Actions"><button type="button" onClick=${() => setEditing(w)}>Edit</button>
              <${ConfirmButton} label="Delete" confirm=${`Delete ${w.name}`} onConfirm=${() => remove(w)} /></td>
          </tr>`)}
        </tbody>
      </table></div>
      <${WorkerForm} key=${editing ? editing.worker_id : `new-${saves}`} worker=${editing} catalog=${catalog}
                     onSaved=${changed} onCancel=${() => setEditing(null)} />
      ${isAdmin() && html`
        <${Skills} skills=${catalog.skills} onChanged=${changed} />
        <section class="card" aria-labelledby="nodes"><h2 id="nodes">System nodes</h2>
          <p class="hint">Built-in agents that a template's step can use instead of a worker (agent “a system
            node”), each with fixed tools. They run only once they have a provider.</p>
          <ul class="plain">${catalog.nodes.map((n) => html`<${NodeRow} key=${n.name + n.updated_at} node=${n}
                                  providers=${catalog.instanceProviders} onChanged=${changed} />`)}</ul>
        </section>`}`}
  </section>`;
}
