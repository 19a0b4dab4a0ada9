// Template-level fields of the workflow language (SPEC §7): `input_schema` (a JSON Schema,
// edited as JSON), `limits` {deadline_seconds, max_steps} and `output` (an expression),
// each with the server's 422 problems for it.
import { html } from './html.js';
import { TextField, TextArea } from './ui.js';
import { problemsAt, useStaysOpen } from './step_policies.js';

/** The fields these controls own: their problems are shown here, not in the general list. */
export const SETTINGS_FIELDS = ['input_schema', 'limits', 'output'];

export function TemplateSettings({ rest, setRest, schemaText, setSchemaText, problems }) {
  const limits = rest.limits || {};
  const setLimit = (key, text) => {
    const next = { ...limits, [key]: text === '' ? undefined : Number(text) };
    if (next[key] === undefined) delete next[key];
    const { limits: _old, ...others } = rest;
    setRest(Object.keys(next).length ? { ...others, limits: next } : others);
  };
  const setOutput = (value) => {
    const { output: _old, ...others } = rest;
    setRest(value ? { ...others, output: value } : others);
  };
  const open = useStaysOpen(!!(schemaText || rest.limits || rest.output) || SETTINGS_FIELDS.some((f) => problemsAt(problems, f)));
  return html`<details class="template-settings" open=${open}>
    <summary>Input, limits and output</summary>
    <${TextArea} label="Input schema (JSON Schema)" value=${schemaText} onInput=${setSchemaText} rows="1" fit class="code"
                 spellcheck="false" problem=${problemsAt(problems, 'input_schema')}
                 hint="with one, a run's input is JSON of this shape (a form when it is an object of simple fields); without, text" />
    <div class="grid">
      <${TextField} label="Deadline (seconds)" type="number" inputmode="numeric" min="1" value=${limits.deadline_seconds ?? ''}
                    onInput=${(v) => setLimit('deadline_seconds', v)} problem=${problemsAt(problems, 'limits.deadline_seconds', '=limits')}
                    hint="limits: the run fails past it, waits included" />
      <${TextField} label="Max steps" type="number" inputmode="numeric" min="1" value=${limits.max_steps ?? ''}
                    onInput=${(v) => setLimit('max_steps', v)} problem=${problemsAt(problems, 'limits.max_steps')}
                    hint="step executions in all: attempts, items and iterations count" />
    </div>
    <${TextArea} label="Run output" value=${rest.output || ''} onInput=${setOutput} rows="1" fit class="code" spellcheck="false"
                  problem=${problemsAt(problems, 'output')} hint="a CEL expression, e.g. steps.publish.output; default: the last step's output" />
  </details>`;
}
