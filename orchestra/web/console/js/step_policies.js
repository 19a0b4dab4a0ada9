// The workflow language's controls in the step editor (SPEC §7, §8): a step's `when`,
// `timeout_seconds`, `retry`, `on_error`, `output_schema`, a human step's `default`; and a
// container's `foreach` (items, max_concurrency, on_error; one agent per item or a small
// workflow as JSON) or `loop` (its steps as JSON, until, max_iterations, output). Each
// control shows the server's 422 problems for its field and the fields below it.
import { html, useRef } from './html.js';
import { TextField, TextArea, Select } from './ui.js';

/** Open when `wanted` is or ever was true: a disclosure that never folds up under the
 * hands of someone fixing the problem that opened it (a user may still close it). */
export function useStaysOpen(wanted) {
  const ever = useRef(false);
  if (wanted) ever.current = true;
  return ever.current || undefined;
}

/** The problems of `field` and every field under it (`retry` → `retry.max_attempts: …`);
 * a field written `=retry` is that field alone. */
export function problemsAt(problems, ...fields) {
  const out = [];
  for (const [key, list] of Object.entries(problems || {})) {
    for (const named of fields) {
      const field = named.replace(/^=/, '');
      if (key === field) out.push(...list);
      else if (named.startsWith('=')) continue;
      else if (key.startsWith(`${field}.`)) out.push(...list.map((p) => `${key.slice(field.length + 1)}: ${p}`));
    }
  }
  return out.length ? out.join(' ') : undefined;
}

const pretty = (value) => JSON.stringify(value, null, 2);
const without = (object, ...keys) => Object.fromEntries(Object.entries(object || {}).filter(([k]) => !keys.includes(k)));
const numberOr = (text) => (text === '' || text === undefined || text === null ? undefined : Number(text));
const parsed = (text) => { try { return JSON.parse(text); } catch { return text; } };  // a raw string: the server says what is wrong

/** The editor's own fields for what has no plain control: the texts of JSON values
 * (so half-typed JSON survives) and the step's shape. `extra` loses what they hold. */
export function policyDraft(step) {
  const extra = without(step, 'id', 'agent', 'prompt', 'depends_on', 'output_schema', 'default', 'http', 'workflow');
  const shape = step.loop ? 'loop' : step.foreach ? 'foreach' : 'step';
  const inner = shape === 'loop' ? (step.loop || {}).steps : step.steps;
  const schema = step.output_schema;
  return { extra, shape,
    schemaText: schema === undefined ? '' : pretty(schema),
    defaultText: step.default === undefined ? '' : typeof step.default === 'string' && schema === undefined ? step.default : JSON.stringify(step.default),
    innerText: inner === undefined ? '' : pretty(inner) };
}

/** True when the step is one agent call (or one per item): it has `agent` and `prompt`. */
export function usesAgent(step) {
  return step.shape !== 'loop' && !(step.shape === 'foreach' && (step.extra || {}).steps !== undefined);
}

/** The step's language fields as the API takes them (on top of `extra`); `inner`: the
 * container's inner steps as the API takes them, when they are edited as steps (else
 * their JSON text is sent). */
export function policyApi(step, inner) {
  const out = { ...(step.extra || {}) };
  if (step.schemaText && step.schemaText.trim()) out.output_schema = parsed(step.schemaText);
  if (step.defaultText !== undefined && step.defaultText !== '') {
    out.default = out.output_schema !== undefined ? parsed(step.defaultText) : step.defaultText;
  }
  const steps = () => (inner !== undefined ? inner : parsed(step.innerText || '[]'));
  if (step.shape === 'loop') out.loop = { ...(out.loop || {}), steps: steps() };
  else if (step.shape === 'foreach' && out.steps !== undefined) out.steps = steps();
  return out;
}

/** Where a container's inner steps are, as the API names the field. */
export const innerField = (step) => (step.shape === 'loop' ? 'loop.steps' : 'steps');

/** JSON that cannot be read, found before sending (inner steps too); shaped like the API's 422 detail. */
export function unreadableJson(steps, prefix = 'steps', detail = []) {
  steps.forEach((s, i) => {
    const check = (text, field) => {
      if (!text || !text.trim()) return;
      try { JSON.parse(text); } catch (err) { detail.push({ field: `${prefix}.${i}.${field}`, problem: `not JSON: ${err.message}` }); }
    };
    check(s.schemaText, 'output_schema');
    if (s.defaultText && s.schemaText && s.schemaText.trim()) check(s.defaultText, 'default');
    if (!usesAgent(s) && s.inner) unreadableJson(s.inner, `${prefix}.${i}.${innerField(s)}`, detail);
    else if (!usesAgent(s)) check(s.innerText, innerField(s));
  });
  return detail.length ? { status: 422, detail, message: 'Some JSON in the steps cannot be read; see the fields marked.' } : null;
}

const NUMBER = { type: 'number', inputmode: 'numeric' };

/** when, timeout, retry, on_error, output_schema, default: in a disclosure, open when any is set. */
export function StepPolicies({ step, onChange, problems }) {
  const extra = step.extra || {};
  const setExtra = (key, value) => onChange({ ...step, extra: value === undefined || value === ''
    ? without(extra, key) : { ...extra, [key]: value } });
  const retry = extra.retry || {};
  const setRetry = (key, text) => {
    const next = { ...retry, [key]: numberOr(text) };
    if (next[key] === undefined) delete next[key];
    setExtra('retry', Object.keys(next).length ? next : undefined);
  };
  const keys = ['when', 'timeout_seconds', 'retry', 'on_error', 'output_schema', 'default'];
  const open = useStaysOpen(keys.some((k) => extra[k] !== undefined) || !!step.schemaText || !!step.defaultText
    || keys.some((k) => problemsAt(problems, k)));
  const human = step.kind === 'human' && usesAgent(step);
  return html`<details class="policies" open=${open}>
    <summary>Conditions and policies</summary>
    <div class="grid">
      <div class="wide"><${TextField} label="Run only when" value=${extra.when || ''} onInput=${(v) => setExtra('when', v)}
                  problem=${problemsAt(problems, 'when')} class="code" spellcheck="false"
                  hint="a CEL condition, e.g. steps.review.output.approved; false skips the step" /></div>
      <${TextField} label="Timeout (seconds)" ...${NUMBER} min="1" max="86400" value=${extra.timeout_seconds ?? ''}
                    onInput=${(v) => setExtra('timeout_seconds', numberOr(v))} problem=${problemsAt(problems, 'timeout_seconds')}
                    hint="1–86,400; a human step's wait" />
      <${TextField} label="Attempts" ...${NUMBER} min="1" max="10" value=${retry.max_attempts ?? ''}
                    onInput=${(v) => setRetry('max_attempts', v)} problem=${problemsAt(problems, 'retry.max_attempts', '=retry')}
                    hint="retry: 1–10 attempts in all" />
      <${TextField} label="Backoff (seconds)" ...${NUMBER} min="0" max="3600" value=${retry.backoff_seconds ?? ''}
                    onInput=${(v) => setRetry('backoff_seconds', v)} problem=${problemsAt(problems, 'retry.backoff_seconds')}
                    hint="0–3,600, doubled per attempt" />
      <${Select} label="On error" value=${extra.on_error || 'fail'} onChange=${(v) => setExtra('on_error', v === 'fail' ? undefined : v)}
                 problem=${problemsAt(problems, 'on_error')}
                 options=${[['fail', 'fail the run (default)'], ['continue', 'continue (output null)']]} />
      <div class="wide"><${TextArea} label="Output schema (JSON Schema)" value=${step.schemaText || ''} rows="1" fit class="code" spellcheck="false"
                 onInput=${(v) => onChange({ ...step, schemaText: v })} problem=${problemsAt(problems, 'output_schema')}
                 hint=${human ? 'the reply is then a form of these fields' : 'the output is then JSON of this shape'} /></div>
      ${human && html`<div class="wide"><${TextField} label="Default reply" value=${step.defaultText || ''} onInput=${(v) => onChange({ ...step, defaultText: v })}
        problem=${problemsAt(problems, 'default')} hint=${step.schemaText ? 'JSON of the output schema, used when the timeout passes'
          : 'used when the timeout passes without a reply'} /></div>`}
    </div>
  </details>`;
}

/** The step's shape: once (one call), a foreach or a loop. */
export function ShapeSelect({ step, onChange, problems, newInner }) {
  const extra = step.extra || {};
  const setShape = (shape) => {
    const rest = without(extra, 'foreach', 'loop', 'steps', 'output');
    if (shape === 'foreach') onChange({ ...step, shape, extra: { ...rest, foreach: { items: 'input' } } });
    else if (shape === 'loop') onChange({ ...step, shape, innerText: step.innerText || '[]', inner: step.inner || [newInner([], 'loop')],
      extra: { ...rest, loop: { until: 'false', max_iterations: 3 } } });
    else onChange({ ...step, shape, extra: rest });
  };
  return html`<${Select} label="Runs" value=${step.shape} onChange=${setShape} problem=${problemsAt(problems, '=foreach', '=loop')}
               options=${[['step', 'once'], ['foreach', 'for each item (foreach)'], ['loop', 'in a loop (loop)']]}
               hint=${step.shape === 'foreach' ? 'once per item of a list' : step.shape === 'loop' ? 'again until a condition holds' : ''} />`;
}

/** A container's own controls (a foreach's or a loop's), and its inner steps. */
export function ContainerControls({ step, onChange, problems, newInner, innerEditor }) {
  const extra = step.extra || {};
  const setIn = (key, field, value) => {
    const inner = { ...(extra[key] || {}), [field]: value };
    if (value === undefined || value === '') delete inner[field];
    onChange({ ...step, extra: { ...extra, [key]: inner } });
  };
  const perItem = extra.steps !== undefined ? 'steps' : 'agent';
  const setPerItem = (mode) => onChange(mode === 'steps'
    ? { ...step, innerText: step.innerText || '[]', inner: step.inner || [newInner([], 'foreach')], extra: { ...extra, steps: [] } }
    : { ...step, extra: without(extra, 'steps', 'output') });
  const setOutput = (value) => onChange({ ...step, extra: value ? { ...extra, output: value } : without(extra, 'output') });
  const fe = extra.foreach || {};
  const lp = extra.loop || {};
  if (step.shape !== 'foreach' && step.shape !== 'loop') return null;
  return html`<div class="container-controls">
    ${step.shape === 'foreach' && html`<div class="grid">
      <${TextField} label="Items" value=${fe.items || ''} onInput=${(v) => setIn('foreach', 'items', v)} class="code" spellcheck="false"
                    problem=${problemsAt(problems, 'foreach.items')} hint="a CEL list, e.g. input.topics; each is {{item}}, {{index}}" />
      <${TextField} label="At once" ...${NUMBER} min="1" max="64" value=${fe.max_concurrency ?? ''}
                    onInput=${(v) => setIn('foreach', 'max_concurrency', numberOr(v))} problem=${problemsAt(problems, 'foreach.max_concurrency')}
                    hint="max_concurrency, 1–64 (4)" />
      <${Select} label="When an item fails" value=${fe.on_error || 'fail'} onChange=${(v) => setIn('foreach', 'on_error', v === 'fail' ? undefined : v)}
                 problem=${problemsAt(problems, 'foreach.on_error')}
                 options=${[['fail', 'fail the step (default)'], ['continue', 'continue (its result null)']]} />
      <${Select} label="Per item" value=${perItem} onChange=${setPerItem}
                 options=${[['agent', 'one step'], ['steps', 'several steps']]}
                 hint=${perItem === 'steps' ? 'a small workflow, below' : 'an agent or a human, below'} />
    </div>`}
    ${step.shape === 'loop' && html`<div class="grid">
      <${TextField} label="Until" value=${lp.until || ''} onInput=${(v) => setIn('loop', 'until', v)} class="code" spellcheck="false"
                    problem=${problemsAt(problems, 'loop.until')} hint="a CEL condition over this iteration's steps" />
      <${TextField} label="Max iterations" ...${NUMBER} min="1" max="100" value=${lp.max_iterations ?? ''}
                    onInput=${(v) => setIn('loop', 'max_iterations', numberOr(v))} problem=${problemsAt(problems, 'loop.max_iterations')}
                    hint="1–100" />
      <${TextField} label="Loop output" value=${lp.output || ''} onInput=${(v) => setIn('loop', 'output', v)} class="code" spellcheck="false"
                    problem=${problemsAt(problems, 'loop.output')} hint="a CEL expression; default: the last inner step's output" />
    </div>`}
    ${step.inner && !usesAgent(step) && innerEditor}
    ${!step.inner && !usesAgent(step) && html`
      <${TextArea} label=${step.shape === 'loop' ? 'Steps of each iteration (JSON)' : 'Steps of each item (JSON)'} rows="3" fit class="code"
                   spellcheck="false" value=${step.innerText || ''} onInput=${(v) => onChange({ ...step, innerText: v })}
                   problem=${problemsAt(problems, step.shape === 'loop' ? 'loop.steps' : 'steps')}
                   hint='a list of steps: [{"id": "draft", "agent": {"worker": "…"}, "prompt": "…", "depends_on": []}]' />`}
    ${step.shape === 'foreach' && perItem === 'steps' && html`<${TextField} label="Item output" value=${extra.output || ''}
        onInput=${setOutput} class="code" spellcheck="false" problem=${problemsAt(problems, 'output')}
        hint="a CEL expression over the item's steps; default: the last inner step's output" />`}
  </div>`;
}
