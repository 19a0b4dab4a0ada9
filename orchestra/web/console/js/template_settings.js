// Template-level fields of the workflow language (SPEC §7): `input_schema` (a JSON Schema,
// edited as JSON), `limits` {deadline_seconds, max_steps}, `output` (an expression),
// `output_schema` (JSON) and `expose.mcp` (SPEC §14: offered as a tool of /mcp), each with
// the server's 422 problems for it.
import { html, useState } from './html.js';
import { TextField, TextArea, useId } from './ui.js';
import { problemsAt, useStaysOpen } from './step_policies.js';

/** The fields these controls own: their problems are shown here, not in the general list. */
export const SETTINGS_FIELDS = ['input_schema', 'limits', 'output', 'output_schema', 'expose'];

const jsonText = (value) => (value === undefined || value === null ? '' : JSON.stringify(value, null, 2));

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
  // the output schema is edited as text: `rest` takes it once it reads as JSON
  const [outputText, setOutputText] = useState(() => jsonText(rest.output_schema));
  const [outputUnread, setOutputUnread] = useState('');
  const setOutputSchema = (text) => {
    setOutputText(text);
    const { output_schema: _old, ...others } = rest;
    if (!text.trim()) { setOutputUnread(''); setRest(others); return; }
    try { setRest({ ...others, output_schema: JSON.parse(text) }); setOutputUnread(''); }
    catch (e) { setOutputUnread(`not JSON: ${e.message}`); }
  };
  const exposeId = useId('expose');
  const setExposed = (on) => {
    const { expose: _old, ...others } = rest;
    setRest(on ? { ...others, expose: { mcp: true } } : others);
  };
  const open = useStaysOpen(!!(schemaText || rest.limits || rest.output || rest.output_schema || rest.expose)
                            || SETTINGS_FIELDS.some((f) => problemsAt(problems, f)));
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
    <${TextArea} label="Run output" value=${rest.output || ''} onInput=${setOutput} rows="3" fit class="code" spellcheck="false"
                  problem=${problemsAt(problems, 'output')} hint="a CEL expression, e.g. steps.publish.output; default: the last step's output" />
    <${TextArea} label="Schema of the run's output (JSON Schema)" value=${outputText} onInput=${setOutputSchema} rows="1" fit class="code"
                 spellcheck="false" problem=${outputUnread || problemsAt(problems, 'output_schema')}
                 hint="the run's output must satisfy it (else the run fails); an MCP tool's outputSchema" />
    <label class="check" for=${exposeId}><input id=${exposeId} type="checkbox" checked=${!!(rest.expose && rest.expose.mcp)}
           onChange=${(e) => setExposed(e.target.checked)} /> Offer as an MCP tool (<code>/mcp</code>)</label>
    ${problemsAt(problems, 'expose') && html`<p class="problem">${problemsAt(problems, 'expose')}</p>`}
  </details>`;
}
