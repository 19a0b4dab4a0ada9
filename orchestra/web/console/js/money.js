// Money in the console (SPEC §12): exact USD decimal strings added without floats, a
// run's budget top-up, and bar charts of what runs cost.
import { html, useState } from './html.js';
import { api } from './api.js';
import { ErrorBox, attempt } from './ui.js';

/** a + b for decimal strings ("0.000435"), exactly (BigInt on aligned digits). */
export function addUsd(a, b) {
  if (a == null) return b;
  if (b == null) return a;
  const [ai, af = ''] = String(a).split('.');
  const [bi, bf = ''] = String(b).split('.');
  const n = Math.max(af.length, bf.length);
  const sum = (BigInt(ai + af.padEnd(n, '0')) + BigInt(bi + bf.padEnd(n, '0'))).toString().padStart(n + 1, '0');
  const whole = sum.slice(0, sum.length - n);
  const frac = sum.slice(sum.length - n).replace(/0+$/, '');
  return frac ? `${whole}.${frac}` : whole;
}

/** `$0.0012`, or `unknown` for a cost no price could give. */
export function usd(value) {
  return value == null ? 'unknown' : `$${value}`;
}

/** a − b for decimal strings, exactly; null when either is missing. */
export function subUsd(a, b) {
  if (a == null || b == null) return null;
  const neg = String(b).startsWith('-') ? String(b).slice(1) : `-${b}`;
  const [ai, af = ''] = String(a).split('.');
  const [bi, bf = ''] = neg.split('.');
  const n = Math.max(af.length, bf.length);
  const value = BigInt(ai + af.padEnd(n, '0')) + BigInt(bi + bf.padEnd(n, '0'));
  const sign = value < 0n ? '-' : '';
  const digits = (value < 0n ? -value : value).toString().padStart(n + 1, '0');
  const frac = digits.slice(digits.length - n).replace(/0+$/, '');
  return `${sign}${digits.slice(0, digits.length - n)}${frac ? `.${frac}` : ''}`;
}

/** What the next call lacks (its worst case less what is left), up to a cent: the least top-up. */
function lacking(budget) {
  if (!budget || budget.next == null) return '0.50';
  const lacks = subUsd(budget.next, subUsd(budget.budget, budget.spent));
  if (lacks == null || lacks.startsWith('-')) return '0.01';
  const [whole, frac = ''] = lacks.split('.');
  const cents = BigInt(whole + frac.slice(0, 2).padEnd(2, '0')) + (/[1-9]/.test(frac.slice(2)) ? 1n : 0n);
  const text = (cents > 0n ? cents : 1n).toString().padStart(3, '0');
  return `${text.slice(0, -2)}.${text.slice(-2)}`;
}

/** A run waiting for budget: what it spent of what, what its next call may cost, and how
 * much to add, sent to POST /run/{id}/budget (`onRaised` gets the answer). */
export function TopUp({ traceId, budget = null, onRaised = () => {} }) {
  const [amount, setAmount] = useState(() => lacking(budget));
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const submit = (e) => {
    e.preventDefault();
    setBusy(true);
    attempt(setError, () => api('POST', `/workflow/run/${encodeURIComponent(traceId)}/budget`, { add_usd: amount }).then(onRaised))
      .finally(() => setBusy(false));
  };
  const left = budget ? subUsd(budget.budget, budget.spent) : null;
  return html`<form class="card top-up" onSubmit=${submit}>
    <p><strong>The run's budget cannot pay for its next model call.</strong> It waits, held by no server, until the budget is raised.</p>
    ${budget && budget.spent != null && html`<p class="budget-spent">Spent <strong>$${budget.spent}</strong> of $${budget.budget}${
      left != null ? ` ($${left} left)` : ''}${budget.next != null ? `; the next call may cost up to $${budget.next}` : ''}.</p>`}
    <label>Add (USD) <input name="add_usd" inputmode="decimal" value=${amount} onInput=${(e) => setAmount(e.target.value)} /></label>
    <button type="submit" class="primary" disabled=${busy}>Raise the budget</button>
    <${ErrorBox} error=${error} />
  </form>`;
}

/** Horizontal bars of cost (or, when nothing is priced, calls) per row key. */
export function BarChart({ rows, title, label }) {
  const value = (r) => (r.cost_usd != null ? Number(r.cost_usd) : 0);
  const priced = rows.some((r) => r.cost_usd != null);
  const measure = priced ? value : (r) => r.calls;
  const top = Math.max(...rows.map(measure), 0) || 1;
  const height = 22;
  return html`<figure class="chart">
    <figcaption>${title} (${priced ? 'cost, USD' : 'calls'})</figcaption>
    <svg role="img" aria-label=${title} width="100%" height=${rows.length * height + 4} viewBox=${`0 0 600 ${rows.length * height + 4}`}>
      ${rows.map((r, i) => html`<g key=${String(r.key)} transform=${`translate(0 ${i * height})`}>
        <text x="0" y="15" font-size="12">${label(r.key)}</text>
        <rect x="180" y="3" height="16" width=${Math.max(1, (measure(r) / top) * 300)} class="bar" />
        <text x=${190 + (measure(r) / top) * 300} y="15" font-size="12">${priced ? usd(r.cost_usd) : `${r.calls} calls`}</text>
      </g>`)}
    </svg>
  </figure>`;
}
