// A form generated from a JSON Schema: an object of string, number, integer, boolean and
// enum fields gets one labelled control per property; anything else falls back to a JSON
// text area. The server validates what is sent; its 422 problems (`content.approved`,
// `input.topics.2`) are shown at the field they name.
import { html } from './html.js';
import { TextField, TextArea, Select, useId } from './ui.js';

const SIMPLE = new Set(['string', 'number', 'integer', 'boolean']);
const isScalar = (v) => v === null || ['string', 'number', 'boolean'].includes(typeof v);

/** The kind of control a property gets: 'enum', a simple type, or null (none fits). */
function controlOf(prop) {
  if (!prop || typeof prop !== 'object') return null;
  if (Array.isArray(prop.enum) && prop.enum.length && prop.enum.every(isScalar)) return 'enum';
  return typeof prop.type === 'string' && SIMPLE.has(prop.type) ? prop.type : null;
}

/** 'form' (an object of simple fields), 'text' (a string), or 'json' (anything else). */
export function formKind(schema) {
  if (!schema || typeof schema !== 'object') return 'json';
  if (schema.type === 'string' && !schema.enum) return 'text';
  if (schema.type !== 'object' || !schema.properties || typeof schema.properties !== 'object') return 'json';
  const props = Object.values(schema.properties);
  return props.length && props.every((p) => controlOf(p)) ? 'form' : 'json';
}

/** A fresh draft for the schema: per field its raw control value, or the text. */
export function emptyDraft(schema) {
  const kind = formKind(schema);
  if (kind !== 'form') return { kind, text: '' };
  const fields = {};
  for (const [name, prop] of Object.entries(schema.properties)) {
    const control = controlOf(prop);
    fields[name] = control === 'boolean' ? prop.default === true : prop.default !== undefined && control !== 'enum'
      ? String(prop.default) : control === 'enum' && prop.default !== undefined ? String(prop.enum.indexOf(prop.default)) : '';
  }
  return { kind, fields };
}

/** The JSON value a draft stands for; throws an Error (with `field` when it names one) when it cannot be read. */
export function draftValue(schema, draft, prefix) {
  if (draft.kind === 'text') return draft.text;
  if (draft.kind === 'json') {
    try {
      return JSON.parse(draft.text);
    } catch (err) {
      throw Object.assign(new Error(`This is not JSON: ${err.message}`), { field: prefix });
    }
  }
  const required = new Set(schema.required || []);
  const value = {};
  for (const [name, prop] of Object.entries(schema.properties)) {
    const raw = draft.fields[name];
    const control = controlOf(prop);
    if (control === 'boolean') value[name] = !!raw;
    else if (control === 'enum') { if (raw !== '') value[name] = prop.enum[Number(raw)]; }
    else if (raw === '') { if (required.has(name) && control === 'string') value[name] = ''; }
    else if (control === 'string') value[name] = raw;
    else {
      const number = Number(raw);
      if (!Number.isFinite(number)) throw Object.assign(new Error(`${name}: not a number`), { field: `${prefix}.${name}` });
      value[name] = number;
    }
  }
  return value;
}

/** JSON on one line with a space after each `:` and `,` (places a line may break, so a
 * phone never cuts `"maxItems"` in two), cut at `most` characters. */
function spaced(value, most) {
  const text = JSON.stringify(value, null, 1).replace(/\n\s*/g, ' ').replace(/([[{]) /g, '$1').replace(/ ([\]}])/g, '$1');
  return text.length > most ? `${text.slice(0, most - 1)}…` : text;
}

/** The fields of `schema` for `draft`; `problems` is {field: problem} with fields under `prefix`. */
export function SchemaFields({ schema, draft, onDraft, problems = {}, prefix, label }) {
  const groupId = useId('schema');
  const whole = problems[prefix];
  if (draft.kind !== 'form') {
    const inner = Object.entries(problems).filter(([f]) => f.startsWith(`${prefix}.`)).map(([f, p]) => `${f.slice(prefix.length + 1)}: ${p}`);
    return html`<${TextArea} label=${draft.kind === 'json' ? `${label} (JSON)` : label} value=${draft.text} rows="3" fit
        class=${draft.kind === 'json' ? 'code' : ''} spellcheck=${draft.kind === 'json' ? 'false' : undefined}
        onInput=${(text) => onDraft({ ...draft, text })} problem=${[whole, ...inner].filter(Boolean).join(' ')}
        hint=${draft.kind === 'json' && schema ? html`as JSON of the schema <code>${spaced(schema, 160)}</code>` : ''} />`;
  }
  const required = new Set(schema.required || []);
  const set = (name) => (raw) => onDraft({ ...draft, fields: { ...draft.fields, [name]: raw } });
  return html`<fieldset class="schema-form" aria-labelledby=${groupId}>
    <legend id=${groupId}>${label}</legend>
    ${whole && html`<small class="problem" role="alert">${whole}</small>`}
    ${Object.entries(schema.properties).map(([name, prop]) => {
      const control = controlOf(prop);
      const text = `${prop.title || name}${required.has(name) ? '' : ' (optional)'}`;
      const problem = problems[`${prefix}.${name}`];
      const hint = prop.description || '';
      if (control === 'boolean') {
        return html`<div class=${'field check-field' + (problem ? ' invalid' : '')} data-field=${name}>
          <label class="check"><input type="checkbox" checked=${!!draft.fields[name]} aria-invalid=${problem ? 'true' : undefined}
            onChange=${(e) => set(name)(e.target.checked)} /> ${text}</label>
          ${hint && html`<small class="hint">${hint}</small>`}
          ${problem && html`<small class="problem">${problem}</small>`}</div>`;
      }
      if (control === 'enum') {
        const options = prop.enum.map((v, i) => [String(i), typeof v === 'string' ? v : JSON.stringify(v)]);
        return html`<div data-field=${name}><${Select} label=${text} value=${draft.fields[name]} onChange=${set(name)} problem=${problem} hint=${hint}
          options=${[['', required.has(name) ? 'choose…' : '—'], ...options]} /></div>`;
      }
      return html`<div data-field=${name}><${TextField} label=${text} value=${draft.fields[name]} onInput=${set(name)} problem=${problem} hint=${hint}
        type=${control === 'string' ? 'text' : 'number'} step=${control === 'integer' ? '1' : control === 'number' ? 'any' : undefined} /></div>`;
    })}
  </fieldset>`;
}
