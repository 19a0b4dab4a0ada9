// Small shared pieces: labelled fields, the error banner, loading lists, times.
import { html, useState, useEffect, useLayoutEffect, useCallback, useRef } from './html.js';

let nextId = 0;
/** A stable id for label/input pairs. */
export function useId(prefix) {
  const [id] = useState(() => `${prefix}-${++nextId}`);
  return id;
}

/** A labelled form control; `problem` (a 422 detail) shows under it and marks it invalid. */
export function Field({ label, problem, hint, children, id }) {
  const control = children({ id, 'aria-invalid': problem ? 'true' : undefined,
    'aria-describedby': problem ? `${id}-problem` : undefined });
  return html`<div class=${'field' + (problem ? ' invalid' : '')}>
    <label for=${id}>${label}</label>
    ${control}
    ${hint && html`<small class="hint">${hint}</small>`}
    ${problem && html`<small class="problem" id=${`${id}-problem`}>${problem}</small>`}
  </div>`;
}

export function TextField({ label, value, onInput, problem, type = 'text', hint, ...rest }) {
  const id = useId('f');
  return html`<${Field} label=${label} problem=${problem} hint=${hint} id=${id}>
    ${(a) => html`<input ...${a} ...${rest} type=${type} value=${value ?? ''}
                         onInput=${(e) => onInput(e.target.value)} />`}
  <//>`;
}

/** A text area; with `fit` it is sized to its text: `rows` lines at least (one, for a box
 * that is mostly empty), up to `maxRows`, then it scrolls. */
export function TextArea({ label, value, onInput, problem, rows = 3, hint, fit = false, maxRows = 24, class: cls, ...rest }) {
  const id = useId('f');
  const ref = useRef(null);
  useLayoutEffect(() => { if (fit && ref.current) fitToText(ref.current); });
  return html`<${Field} label=${label} problem=${problem} hint=${hint} id=${id}>
    ${(a) => html`<textarea ...${a} ...${rest} ref=${ref} class=${[cls, fit ? 'fit' : ''].filter(Boolean).join(' ') || undefined}
                            rows=${rows} data-max-rows=${fit ? maxRows : undefined} value=${value ?? ''}
                            onInput=${(e) => { if (fit) fitToText(e.target); onInput(e.target.value); }}></textarea>`}
  <//>`;
}

/** Size a `fit` text area to its text (its `rows` the least, `data-max-rows` the most).
 * A hidden one (in a closed <details>) is sized when it is shown. */
export function fitToText(area) {
  if (!area.isConnected || !area.getClientRects().length) return;
  const style = getComputedStyle(area);
  const edges = parseFloat(style.borderTopWidth) + parseFloat(style.borderBottomWidth);
  const padding = parseFloat(style.paddingTop) + parseFloat(style.paddingBottom);
  const line = parseFloat(style.lineHeight) || parseFloat(style.fontSize) * 1.5;
  const most = line * Number(area.dataset.maxRows || 24) + padding;
  area.style.height = 'auto';  // the height of `rows` lines, so scrollHeight is the text's
  const wanted = area.scrollHeight;
  area.style.height = `${Math.min(wanted, most) + edges}px`;
  area.style.overflowY = wanted > most ? 'auto' : 'hidden';
}

const fitAll = (root) => root.querySelectorAll && root.querySelectorAll('textarea.fit').forEach(fitToText);
if (typeof document !== 'undefined') {
  // A <details> opened, or a window resized (lines wrap differently): size again.
  document.addEventListener('toggle', (e) => fitAll(e.target), true);
  addEventListener('resize', () => fitAll(document));
}

export function Select({ label, value, onChange, options, problem, hint, ...rest }) {
  const id = useId('f');
  return html`<${Field} label=${label} problem=${problem} hint=${hint} id=${id}>
    ${(a) => html`<select ...${a} ...${rest} value=${value ?? ''} onChange=${(e) => onChange(e.target.value)}>
      ${options.map(([v, text]) => html`<option value=${v} selected=${v === value}>${text}</option>`)}
    </select>`}
  <//>`;
}

/** The API's message for an error, in a live region so screen readers announce it. */
export function ErrorBox({ error }) {
  if (!error) return null;
  const text = typeof error === 'string' ? error : error.shown || error.message;
  return html`<p class="error" role="alert">${text}</p>`;
}

export function Notice({ text }) {
  return text ? html`<p class="notice" role="status">${text}</p>` : null;
}

/** Load something from the API: [data, error, reload]. */
export function useLoad(loader, deps = []) {
  const [state, setState] = useState({ data: null, error: null });
  const reload = useCallback(() => {
    loader().then((data) => setState({ data, error: null }), (error) => setState({ data: null, error }));
  }, deps);
  useEffect(reload, [reload]);
  return [state.data, state.error, reload];
}

/** `detail` of a 422 as {field: problem}; the first problem of a field wins. */
export function problemsByField(error) {
  const out = {};
  if (error && error.status === 422 && Array.isArray(error.detail)) {
    for (const { field, problem } of error.detail) if (!(field in out)) out[field] = problem;
  }
  return out;
}

export function when(iso) {
  if (!iso) return '–';
  const d = new Date(iso);
  return d.toLocaleString(undefined, { dateStyle: 'short', timeStyle: 'medium' });
}

/** How long ago `iso` was, in words: `just now`, `5 min ago`, `3 h ago`, `2 days ago`. */
export function ago(iso, now = Date.now()) {
  if (!iso) return 'never';
  const s = Math.max(0, (now - new Date(iso)) / 1000);
  if (s < 45) return 'just now';
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400 * 2) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} days ago`;
}

export function duration(start, end) {
  if (!start) return '–';
  const ms = (end ? new Date(end) : new Date()) - new Date(start);
  return ms < 1000 ? `${ms} ms` : ms < 60000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms / 60000)} min`;
}

export function StatusBadge({ status }) {
  return html`<span class=${`badge status-${status}`}>${status}</span>`;
}

/** A button that asks "Really?" on the first press (no browser dialog). */
export function ConfirmButton({ label, confirm, onConfirm, ...rest }) {
  const [armed, setArmed] = useState(false);
  const confirmRef = useRef(null);
  useEffect(() => { if (armed && confirmRef.current) confirmRef.current.focus(); }, [armed]);  // keyboard users land on it
  return armed
    ? html`<span class="confirm">
        <button class="danger" ref=${confirmRef} ...${rest} onClick=${() => { setArmed(false); onConfirm(); }}>${confirm}</button>
        <button type="button" onClick=${() => setArmed(false)}>Keep</button></span>`
    : html`<button type="button" ...${rest} onClick=${() => setArmed(true)}>${label}</button>`;
}

/** Navigate to a console page, e.g. go(`run/${id}`). */
export function go(path) {
  location.hash = `#/${path}`;
}

let flash = '';
/** A message for the next page (e.g. "saved" after a navigation), shown once. */
export function setFlash(text) {
  flash = text;
}

export function takeFlash() {
  const text = flash;
  flash = '';
  return text;
}

/** Run an API action; its error (or null on success) goes to `setError`. True when it worked. */
export async function attempt(setError, action) {
  try {
    await action();
    setError(null);
    return true;
  } catch (err) {
    setError(err);
    return false;
  }
}

/** A value as text: a string as it is, anything else as JSON. */
export function shown(value) {
  return typeof value === 'string' ? value : JSON.stringify(value, null, 2);
}

/** A value in a <pre>; a long one (a 300-item list) folded under a summary. */
export function LongValue({ value, label, cls = 'output' }) {
  const text = shown(value);
  if (text.length <= 600) return html`<pre class=${cls}>${text}</pre>`;
  return html`<details class="long-value"><summary>${label} (${text.length.toLocaleString()} characters)</summary>
    <pre class=${cls}>${text}</pre></details>`;
}
