// "Fork from here" on a run's step (SPEC §13): a new run that reuses everything the run
// finished except this step and what reads it — either running the step again, or
// setting its output (edited in the form of its output_schema, else as text) so that
// only what follows runs. The server checks the output; a 422 shows at its field.
import { html, useState } from './html.js';
import { api } from './api.js';
import { ErrorBox, go, problemsByField } from './ui.js';
import { SchemaFields, draftValue, emptyDraft, formKind } from './schema_form.js';

/** A draft of the schema's form holding `value` (the step's current output). */
export function draftOf(schema, value) {
  const kind = schema ? formKind(schema) : typeof value === 'string' || value === null || value === undefined ? 'text' : 'json';
  if (kind === 'text') return { kind, text: typeof value === 'string' ? value : value == null ? '' : JSON.stringify(value) };
  if (kind === 'json') return { kind, text: value === undefined ? '' : JSON.stringify(value, null, 2) };
  const draft = emptyDraft(schema);
  const given = value && typeof value === 'object' ? value : {};
  for (const [name, prop] of Object.entries(schema.properties)) {
    if (!(name in given)) continue;
    const v = given[name];
    if (Array.isArray(prop.enum)) draft.fields[name] = String(prop.enum.findIndex((e) => JSON.stringify(e) === JSON.stringify(v)));
    else if (prop.type === 'boolean') draft.fields[name] = !!v;
    else draft.fields[name] = v === null ? '' : String(v);
  }
  return draft;
}

export function ForkPanel({ traceId, step, definition, onClose }) {
  const schema = (definition && definition.output_schema) || null;
  const [draft, setDraft] = useState(() => draftOf(schema, step.output));
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const prefix = `outputs.${step.id}`;
  const send = async (body) => {
    setBusy(true);
    try {
      const answer = await api('POST', `/workflow/run/${encodeURIComponent(traceId)}/fork`, body);
      go(`run/${answer.trace_id}`);
    } catch (err) {
      setError(err);
      setBusy(false);
    }
  };
  const withOutput = (e) => {
    e.preventDefault();
    let value;
    try {
      value = draftValue(schema, draft, prefix);
    } catch (err) {
      setError({ status: 422, message: err.message, detail: [{ field: err.field || prefix, problem: err.message }] });
      return;
    }
    send({ outputs: { [step.id]: value } });
  };
  return html`<form class="fork-panel card" onSubmit=${withOutput} data-fork=${step.id} aria-label=${`Fork from ${step.id}`}>
    <p>A new run that reuses what this run finished; only <strong>${step.id}</strong> and the steps that read it run.</p>
    <div class="row">
      <button type="button" class="primary" disabled=${busy} onClick=${() => send({ from_step: step.id })}>Run ${step.id} again</button>
      <button type="button" onClick=${onClose}>Close</button>
    </div>
    <p>Or set its output and run only what follows:</p>
    <${SchemaFields} schema=${schema} draft=${draft} onDraft=${setDraft} prefix=${prefix}
                     label=${`Output of ${step.id}`} problems=${problemsByField(error)} />
    <${ErrorBox} error=${error} />
    <button type="submit" disabled=${busy}>Fork with this output</button>
  </form>`;
}
