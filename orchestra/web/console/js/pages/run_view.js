// The live run view: the step graph with each step's status, streamed text per step, tool
// calls and results, a reply box while a question is open, cancel, the output and token
// usage. Built only from the event stream, so a finished run opens as its replay.
import { html, useEffect, useMemo, useReducer, useState } from '../html.js';
import { api } from '../api.js';
import { ErrorBox, StatusBadge, TextArea, useLoad, when, duration, attempt, problemsByField, shown, LongValue } from '../ui.js';
import { StepGraph } from '../graph.js';
import { followRun } from '../stream.js';
import { InstanceGroup, childrenOf, parentOf } from '../instances.js';
import { SchemaFields, emptyDraft, draftValue } from '../schema_form.js';
import { ForkPanel } from '../fork_panel.js';
import { TopUp, addUsd, usd } from '../money.js';

const LOG_SHOWN = 400;

/** The step definition a path's last segment names (`research[2].facts` → `facts`),
 * searched in the template's steps and their inner steps. */
function definitionOf(steps, path) {
  const id = path.replace(/(\[\d+\]|#\d+)$/, '').split('.').pop();
  const walk = (list) => {
    for (const s of Array.isArray(list) ? list : []) {
      if (!s || typeof s !== 'object') continue;
      if (s.id === id) return s;
      const inner = walk(s.steps) || walk(s.loop && s.loop.steps);
      if (inner) return inner;
    }
    return null;
  };
  return walk(steps);
}

/** A foreach's items, when its `items` expression is a plain path the page can follow
 * itself: `input…`, `steps.<id>.output…` (a step of the same scope), or a JSON list;
 * undefined otherwise (the items are then named by their index). */
function itemsOf(template, state, path) {
  const def = template && definitionOf(template.steps, path);
  const expression = def && def.foreach && typeof def.foreach.items === 'string' ? def.foreach.items.trim() : '';
  if (!expression) return undefined;
  try { const list = JSON.parse(expression); return Array.isArray(list) ? list : undefined; } catch { /* an expression */ }
  const plain = /^(input|steps\.([A-Za-z0-9_-]+)\.output)((?:\.[A-Za-z_][A-Za-z0-9_]*)*)$/.exec(expression);
  if (!plain) return undefined;
  const scope = path.includes('.') ? path.slice(0, path.lastIndexOf('.') + 1) : '';
  let value = plain[2] ? (state.steps[scope + plain[2]] || {}).output : state.input;
  for (const key of plain[3].split('.').slice(1)) value = value && typeof value === 'object' ? value[key] : undefined;
  return Array.isArray(value) ? value : undefined;
}

function freshStep(id, extra = {}) {
  return { id, status: 'pending', text: '', tools: [], depends_on: [], agent: null, prompt: '',
    output: null, error: null, usage: null, answer: null, attempt: 0, ...extra };
}

/** The run's top-level steps (its instances below containers come with the events). */
function initialState(run) {
  const steps = {};
  const top = run.steps.filter((s) => parentOf(s.path || s.step_id) === null);
  for (const s of top) steps[s.step_id] = freshStep(s.step_id, { agent: s.agent, depends_on: s.depends_on, child: s.child_trace_id || null });
  return { status: 'queued', input: run.input, order: top.map((s) => s.step_id), steps, questions: [],
    output: null, error: null, notices: [], log: [], count: 0, lastSeq: 0, startedTs: null, endedTs: null,
    budgetUsd: run.budget_usd ?? null, budget: null, continuing: false };
}

/** `id` is an instance path (`research[3]`; a top-level step's path is its id). */
function withStep(state, id, change) {
  const step = state.steps[id] || freshStep(id);
  const order = state.order.includes(id) || parentOf(id) !== null ? state.order : [...state.order, id];
  return { ...state, order, steps: { ...state.steps, [id]: { ...step, ...change(step) } } };
}

/** One event applied to the view's state. */
function apply(state, { kind, data, seq }) {
  state = { ...state, lastSeq: seq, count: state.count + 1, log: [...state.log.slice(-(LOG_SHOWN - 1)), { seq, kind, step: data.step_id }] };
  const id = data.path || data.step_id;
  switch (kind) {
    case 'run_started':
      return { ...state, status: 'running', startedTs: state.startedTs || data.ts };
    case 'run_resumed': {  // questions of the restarted steps died with the old process; the others stay open
      const questions = state.questions.filter((q) => !(data.restarted_steps || []).some((r) => r === q.step_id || r === q.path));
      if (data.reason === 'budget') {  // a top-up let it go on: no server stopped, no attempt used
        return { ...state, status: questions.length ? 'waiting_reply' : 'running', questions, continuing: true,
          notices: [...state.notices, `The budget was raised${state.budgetUsd != null ? ` to $${state.budgetUsd}` : ''}: the run goes on from where it paused.`] };
      }
      return { ...state, status: questions.length ? 'waiting_reply' : 'running', questions, continuing: false,
        notices: [...state.notices,
        `The run was taken over after its server stopped (attempt ${data.attempt}); ${(data.restarted_steps || []).length
          ? `started again: ${data.restarted_steps.join(', ')}.` : 'no step had to start again.'}${
          questions.length ? ` Still waiting for a reply to ${questions.map((q) => q.path || q.step_id).join(', ')}.` : ''}`] };
    }
    case 'step_started': {  // also after a resume: the step runs again, so its text starts again
      const questions = state.questions.filter((q) => q.path !== id);  // another step's open question keeps the run waiting
      return withStep({ ...state, status: questions.length ? 'waiting_reply' : 'running', questions }, id, (s) => ({ status: 'running', text: '', tools: [], output: null,
        error: null, usage: null, prompt: data.prompt, agent: data.agent || s.agent,
        // after a budget pause a paused step goes on: the same run of it, not another one
        attempt: state.continuing && s.attempt ? Math.max(s.attempt, data.attempt || 0) : Math.max(s.attempt + 1, data.attempt || 0),
        request: data.http || s.request || null, workflow: data.workflow || s.workflow || null,
        container: data.items !== undefined ? 'foreach' : data.max_iterations !== undefined ? 'loop' : s.container,
        retrying: null, skipped: null }));
    }
    case 'token':
      return withStep(state, id, (s) => ({ text: s.text + data.text }));
    case 'tool_call':
      return withStep(state, id, (s) => ({ tools: [...s.tools, { call_id: data.call_id, name: data.name, arguments: data.arguments }] }));
    case 'tool_result':
      return withStep(state, id, (s) => ({ tools: s.tools.map((t) => (t.call_id === data.call_id
        ? { ...t, result: data.result, error: data.error, done: true } : t)) }));
    case 'reply_requested':
      return withStep({ ...state, status: 'waiting_reply', questions: [...state.questions,
        { request_id: data.request_id, step_id: data.step_id, path: id, prompt: data.prompt, schema: data.schema || null,
          child_trace_id: data.child_trace_id || null }] }, id,
        // a human step's prompt is stored once, here (its step_started has none): the card shows it too
        (s) => ({ status: 'waiting_reply', ...(s.agent && s.agent.human ? { prompt: data.prompt } : {}) }));
    case 'reply_received': {
      const questions = state.questions.filter((q) => q.request_id !== data.request_id);
      return withStep({ ...state, questions, status: questions.length ? 'waiting_reply' : 'running' }, id,
        (s) => ({ answer: data.content, status: s.status === 'waiting_reply' ? 'running' : s.status }));
    }
    case 'reply_withdrawn':  // asked by an earlier attempt, not again: no longer answerable
      return { ...state, questions: state.questions.filter((q) => q.request_id !== data.request_id) };
    case 'reply_timed_out': {  // no reply in time: the step's default is its output
      const questions = state.questions.filter((q) => q.request_id !== data.request_id);
      return withStep({ ...state, questions, status: questions.length ? 'waiting_reply' : 'running' }, id,
        () => ({ answer: data.content, timedOut: true }));
    }
    case 'child_started':  // a workflow step's child run (SPEC §14): the card opens it
      return withStep(state, id, () => ({ child: data.child_trace_id, childStatus: null }));
    case 'child_finished':
      return withStep(state, id, () => ({ child: data.child_trace_id, childStatus: data.status }));
    case 'step_finished':
      return withStep(state, id, () => ({ status: 'succeeded', output: data.output, usage: data.usage, cost: data.cost_usd,
        counts: data.items || null, iterations: data.iterations ?? null, exhausted: !!data.exhausted }));
    case 'step_reused':  // a fork's copy of its source's instance: no provider call
      return withStep(state, id, () => ({ status: 'succeeded', output: data.output, reused: true,
        overridden: !!data.overridden, source: data.source_trace_id }));
    case 'step_skipped':
      return withStep(state, id, () => ({ status: 'skipped', output: null,
        skipped: data.reason === 'when' ? 'its condition was false' : 'every dependency was skipped' }));
    case 'step_retrying':
      return withStep(state, id, () => ({ retrying: `Attempt ${data.attempt} failed (${data.error}); trying again in ${data.delay_seconds} s.` }));
    case 'step_failed':
      return withStep(state, id, () => ({ status: 'failed', error: data.error }));
    case 'budget_exhausted': {  // on_budget pause: the run waits for a top-up, held by no server
      if (data.child_trace_id) return state;  // a run below waits: its own page raises it
      const steps = { ...state.steps };  // what was running is paused: nothing runs it now
      for (const path of data.paused_steps || []) if (steps[path]) steps[path] = { ...steps[path], status: 'pending' };
      return { ...state, steps, status: 'waiting_budget', budgetUsd: data.budget_usd ?? state.budgetUsd,
        budget: { budget: data.budget_usd, spent: data.spent_usd, next: data.next_call_usd ?? null } };
    }
    case 'budget_raised':  // the page's own top-up answered (not an event of the stream)
      return { ...state, budgetUsd: data.budget_usd };
    case 'budget_exceeded':
      return { ...state, notices: [...state.notices, `The budget of $${data.budget_usd} cannot pay for the next model call: $${data.spent_usd} spent${
        data.next_call_usd ? `, and the next call may cost up to $${data.next_call_usd}` : ''}. The run stops.`] };
    case 'run_finished':
      return { ...state, status: data.status || 'succeeded', output: data.output, questions: [], endedTs: data.ts };
    case 'run_failed':
    case 'run_cancelled':
      return { ...endSteps(state, kind === 'run_cancelled' ? 'cancelled' : data.status),
        status: data.status || (kind === 'run_cancelled' ? 'cancelled' : 'failed'),
        error: data.error || data.reason || null, questions: [], endedTs: data.ts };
    default:
      return state;
  }
}

/** Steps still going when the run ends take its end (the server's record says the same). */
function endSteps(state, status) {
  const steps = {};
  for (const [id, s] of Object.entries(state.steps)) {
    steps[id] = ['running', 'waiting_reply'].includes(s.status) ? { ...s, status } : s;
  }
  return { ...state, steps };
}

function reducer(state, action) {
  return action.reset ? initialState(action.reset) : apply(state, action);
}

function usageTotal(steps) {
  let prompt = 0;
  let completion = 0;
  let cost = null;
  for (const s of Object.values(steps)) {
    if (s.usage) {
      prompt += s.usage.prompt_tokens || 0;
      completion += s.usage.completion_tokens || 0;
    }
    cost = addUsd(cost, s.cost ?? null);
  }
  return { prompt, completion, cost };
}

function ToolCalls({ tools }) {
  if (!tools.length) return null;
  return html`<ul class="tools-log">${tools.map((t) => html`<li key=${t.call_id}>
    <span class="call">→ ${t.name}(<code>${JSON.stringify(t.arguments)}</code>)</span>
    ${t.done && (t.error
      ? html`<span class="result failed">← error: ${t.error}</span>`
      : html`<span class="result">← <code>${t.result}</code></span>`)}
  </li>`)}</ul>`;
}

/** The answer box of one open question: text, or a form made from the step's `output_schema`
 * (the server validates it; a 422 is shown at the field it names and the question stays open). */
function ReplyBox({ traceId, question }) {
  const [draft, setDraft] = useState(() => (question.schema ? emptyDraft(question.schema) : { kind: 'text', text: '' }));
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const send = async (e) => {
    e.preventDefault();
    let content;
    try {
      content = question.schema ? draftValue(question.schema, draft, 'content') : draft.text;
    } catch (err) {
      setError({ status: 422, message: err.message, detail: [{ field: err.field || 'content', problem: err.message }] });
      return;
    }
    setBusy(true);
    try {
      // a child run's question (shown here with child_trace_id) is answered on the child's trace
      await api('POST', `/workflow/reply/${question.child_trace_id || traceId}`, { content, request_id: question.request_id });
    } catch (err) {
      setError(err);
      setBusy(false);
    }
  };
  const empty = draft.kind !== 'form' && !draft.text;
  return html`<form class="reply" onSubmit=${send} data-request=${question.request_id}>
    <p class="question"><strong>${question.path || question.step_id} asks:</strong> <span class="prompt-text">${question.prompt}</span></p>
    ${question.schema
      ? html`<${SchemaFields} schema=${question.schema} draft=${draft} onDraft=${setDraft} prefix="content"
                              label="Your reply" problems=${problemsByField(error)} />`
      : html`<${TextArea} label="Your reply" value=${draft.text} onInput=${(text) => setDraft({ ...draft, text })} rows="2" fit autofocus />`}
    <${ErrorBox} error=${error} />
    <button type="submit" class="primary" disabled=${busy || empty}>Send reply</button>
  </form>`;
}

const FORKABLE = ['succeeded', 'failed', 'skipped', 'cancelled', 'interrupted'];

function StepCard({ step, traceId, questions, view }) {
  const [forking, setForking] = useState(false);
  const human = step.agent && step.agent.human;
  const container = step.container || view.children.has(step.id);
  const forkable = FORKABLE.includes(step.status) && parentOf(step.id) === null;
  return html`<article class=${`step-card status-${step.status}`} data-step=${step.id} aria-labelledby=${`step-${step.id}`}>
    <header><h3 id=${`step-${step.id}`}>${step.id}</h3> <${StatusBadge} status=${step.status} />
      ${step.container && html`<small class="kind">${step.container}</small>`}
      ${step.attempt > 1 && html`<small> run ${step.attempt} times</small>`}
      ${step.usage && html`<small class="usage">${step.usage.prompt_tokens} in · ${step.usage.completion_tokens} out tokens${step.cost !== undefined ? ` · ${usd(step.cost)}` : ''}</small>`}
      ${step.reused && html`<small class="reused">${step.overridden ? 'set by the fork' : 'reused'}</small>`}
      ${forkable && !forking && html`<button type="button" class="link fork" onClick=${() => setForking(true)}>Fork from here</button>`}
    </header>
    ${forking && html`<${ForkPanel} traceId=${traceId} step=${step} definition=${view.definition(step.id)}
                                    onClose=${() => setForking(false)} />`}
    ${step.prompt && html`<details><summary>Prompt</summary><pre>${step.prompt}</pre></details>`}
    ${step.request && html`<p class="http-request"><code>${step.request.method} ${step.request.url}</code></p>`}
    ${step.child && html`<p class="child-run"><a href=${`#/run/${step.child}`}>Open the child run</a>${
      step.childStatus ? html` <${StatusBadge} status=${step.childStatus} />` : ''}</p>`}
    ${step.skipped && html`<p class="note">Skipped: ${step.skipped}.</p>`}
    ${step.retrying && step.status === 'running' && html`<p class="note warn retrying">${step.retrying}</p>`}
    <${ToolCalls} tools=${step.tools} />
    ${step.text && html`<pre class="stream" aria-live="polite">${step.text}</pre>`}
    ${human && step.answer !== null && html`<p class="answer"><strong>${step.timedOut ? 'No reply in time; the default:' : 'Answer:'}</strong> <span class="text">${shown(step.answer)}</span></p>`}
    ${!human && step.answer !== null && html`<p class="answer"><strong>You answered:</strong> <span class="text">${shown(step.answer)}</span></p>`}
    ${container && html`<${InstanceGroup} path=${step.id} view=${view} />`}
    ${step.exhausted && html`<p class="note">Stopped after ${step.iterations} iterations (max_iterations).</p>`}
    ${step.output !== null && !step.text && !human && (container
      ? html`<details class="container-output"><summary>Output</summary><pre class="output">${shown(step.output)}</pre></details>`
      : html`<pre class="output">${shown(step.output)}</pre>`)}
    ${step.error && html`<p class="error">${step.error}</p>`}
    ${questions.map((q) => html`<${ReplyBox} key=${q.request_id} traceId=${traceId} question=${q} />`)}
  </article>`;
}

const CONNECTION_TEXT = {
  connecting: 'connecting…', live: 'live', reconnecting: 'connection lost: reconnecting…',
  ended: 'ended', failed: 'stopped',
};

function Run({ run, traceId }) {
  const [state, dispatch] = useReducer(reducer, run, initialState);
  // The template, to name a foreach's items by their value (best effort: it may be gone).
  const [template] = useLoad(() => api('GET', `/workflow/template/${encodeURIComponent(run.template_id)}`)
    .then((answer) => answer.template, () => null), [run.template_id]);
  // The definitions the run ran (its version's; the template's now if that is gone), for
  // a step's output_schema when it is forked.
  const [version] = useLoad(() => (run.template_id && run.template_version
    ? api('GET', `/workflow/template/${encodeURIComponent(run.template_id)}/versions/${run.template_version}`)
      .then((answer) => answer.version, () => null) : Promise.resolve(null)), [run.template_id, run.template_version]);
  const [connection, setConnection] = useState({ state: 'connecting' });
  const [actionError, setActionError] = useState(null);
  useEffect(() => followRun(traceId, {
    onEvent: (kind, data, seq) => dispatch({ kind, data, seq }),
    onState: (s, error) => setConnection({ state: s, error }),
  }), [traceId]);
  const cancel = () => attempt(setActionError, () => api('POST', `/workflow/cancel/${traceId}`));
  const ended = ['succeeded', 'failed', 'cancelled', 'interrupted'].includes(state.status);
  const statuses = Object.fromEntries(state.order.map((id) => [id, state.steps[id].status]));
  const steps = state.order.map((id) => { const s = state.steps[id];
    return { id, depends_on: s.depends_on, agent: s.agent, ...(s.container ? { [s.container]: {} } : {}) }; });
  const children = useMemo(() => childrenOf(Object.keys(state.steps)), [state.steps]);
  const open = ended ? [] : state.questions;
  const view = { steps: state.steps, children,
    definition: (path) => definitionOf((version || template || { steps: [] }).steps, path),
    itemValue: (container, index) => { const items = itemsOf(template, state, container); return items ? items[index] : undefined; },
    renderQuestions: (path) => open.filter((q) => q.path === path).map((q) => html`<${ReplyBox} key=${q.request_id} traceId=${traceId} question=${q} />`) };
  const usage = usageTotal(state.steps);
  return html`<section class="run" data-status=${state.status}>
    <h1>Run of ${run.template_name} <${StatusBadge} status=${state.status} /></h1>
    ${run.parent && html`<p class="parent-run">A child run of <a href=${`#/run/${run.parent.trace_id}`}>run <code>${run.parent.trace_id}</code></a>
      (its step <code>${run.parent.path}</code>)</p>`}
    <p class="meta">
      <span>trace <code>${traceId}</code></span>
      ${run.template_version && html`<span>version ${run.template_version}</span>`}
      ${run.forked_from && html`<span class="forked">forked from <a href=${`#/run/${run.forked_from.trace_id}`}>${run.forked_from.trace_id.slice(0, 8)}</a>${
        run.forked_from.from_step ? ` at ${run.forked_from.from_step}` : ''}</span>`}
      <span>started ${when(state.startedTs || run.created_at)}</span>
      <span>${ended ? `took ${duration(state.startedTs || run.started_at, state.endedTs)}` : ''}</span>
      ${state.budgetUsd != null && html`<span class="budget">budget $${state.budgetUsd}</span>`}
      <span class=${`connection ${connection.state}`} role="status">${run.finished_at ? 'replay · ' : ''}${CONNECTION_TEXT[connection.state]}</span>
      ${!ended && html`<button type="button" class="danger" onClick=${cancel}>Cancel run</button>`}
    </p>
    <${ErrorBox} error=${actionError || (connection.state === 'failed' ? connection.error : null)} />
    ${connection.state === 'reconnecting' && connection.error && html`<p class="notice">${connection.error.shown || connection.error.message}</p>`}
    ${state.notices.map((n) => html`<p class="notice resumed" role="status">${n}</p>`)}
    ${state.status === 'waiting_budget' && html`<${TopUp} traceId=${traceId} budget=${state.budget}
        onRaised=${(answer) => dispatch({ kind: 'budget_raised', data: { budget_usd: answer.budget_usd }, seq: state.lastSeq })} />`}
    ${state.input !== null && state.input !== undefined && state.input !== '' && (shown(state.input).length > 600
      ? html`<${LongValue} value=${state.input} label="Input" cls="run-input" />`
      : html`<p><strong>Input:</strong> ${shown(state.input)}</p>`)}
    <${StepGraph} steps=${steps} statuses=${statuses} />
    <div class="steps">${state.order.map((id) => html`<${StepCard} key=${id} step=${state.steps[id]} traceId=${traceId}
        view=${view} questions=${open.filter((q) => q.path === id)} />`)}</div>
    ${ended && html`<section class=${`card outcome status-${state.status}`} aria-labelledby="outcome">
      <h2 id="outcome">Run ${state.status}</h2>
      ${state.output !== null && state.output !== undefined && html`<${LongValue} value=${state.output} label="Output" cls="output final-output" />`}
      ${state.error && html`<p class="error">${state.error}</p>`}
      <p class="usage">Tokens: ${usage.prompt} prompt · ${usage.completion} completion · ${usage.prompt + usage.completion} total${usage.cost != null ? ` · cost of its steps $${usage.cost}` : ''}</p>
    </section>`}
    <details class="events"><summary>Events (${state.count}, last ${state.lastSeq})</summary>
      <ol class="event-log" data-count=${state.count} data-last=${state.lastSeq}>
        ${state.log.map((e) => html`<li key=${e.seq} value=${e.seq} data-seq=${e.seq}>${e.kind}${e.step ? ` · ${e.step}` : ''}</li>`)}
      </ol>
    </details>
  </section>`;
}

export function RunView({ traceId }) {
  const [run, error] = useLoad(() => api('GET', `/workflow/run/${encodeURIComponent(traceId)}`), [traceId]);
  if (error) return html`<section><h1>Run</h1><${ErrorBox} error=${error} /></section>`;
  if (!run) return html`<p class="loading">Loading…</p>`;
  return html`<${Run} run=${run} traceId=${traceId} />`;
}

