// Follow a run's event stream with EventSource (`?access_token=`, since EventSource cannot
// set headers). Resumes from the last event id with no gap or duplicate:
//  - after a dropped connection the browser reconnects by itself and sends `Last-Event-ID`;
//  - when the browser gives up (an HTTP error, e.g. 401 once the token expired), we ask the
//    API for the run (which refreshes the token or tells a gone run from a down server) and
//    open a new EventSource with `?last_event_id=`;
//  - every event at or below the last seq seen is dropped, whatever the transport did.
// It stops at the terminal event (a reconnect after it would get 204).
import { api, freshAccessToken } from './api.js';

export const KINDS = ['run_started', 'run_resumed', 'step_started', 'token', 'tool_call', 'tool_result',
  'reply_requested', 'reply_received', 'reply_withdrawn', 'reply_timed_out', 'step_finished', 'step_failed',
  'step_skipped', 'step_retrying', 'step_reused', 'child_started', 'child_finished', 'run_finished', 'run_failed',
  'run_cancelled', 'budget_exceeded', 'budget_exhausted'];
export const TERMINAL = new Set(['run_finished', 'run_failed', 'run_cancelled']);

/** Start following; `onEvent(kind, data, seq)`, `onState(state, error?)` with state
 * `connecting | live | reconnecting | ended | failed`. Returns a function that stops. */
export function followRun(traceId, { onEvent, onState }) {
  let source = null;
  let lastSeq = 0;
  let stopped = false;
  let timer = null;
  let failures = 0;
  const url = (token) => {
    const params = new URLSearchParams({ access_token: token });
    if (lastSeq) params.set('last_event_id', String(lastSeq));
    return `/api/v1/workflow/sse/${encodeURIComponent(traceId)}?${params}`;
  };
  const stop = () => {
    stopped = true;
    clearTimeout(timer);
    if (source) source.close();
  };
  const retryLater = (error) => {
    failures += 1;
    onState('reconnecting', error);
    timer = setTimeout(probeThenOpen, Math.min(8000, 250 * 2 ** Math.min(failures, 5)));
  };
  const receive = (kind) => (message) => {
    const seq = Number(message.lastEventId);
    if (!(seq > lastSeq)) return;
    lastSeq = seq;
    onEvent(kind, JSON.parse(message.data), seq);
    if (TERMINAL.has(kind)) {
      stop();
      onState('ended');
    }
  };
  const open = async () => {
    if (stopped) return;
    let token;
    try {
      token = await freshAccessToken();
    } catch (err) {
      onState('failed', err);
      return;
    }
    if (stopped) return;
    source = new EventSource(url(token));
    source.onopen = () => {
      failures = 0;
      onState('live');
    };
    KINDS.forEach((kind) => source.addEventListener(kind, receive(kind)));
    source.onerror = () => {
      if (stopped) return;
      if (source.readyState === EventSource.CONNECTING) {
        onState('reconnecting');
        return;
      }
      source.close();
      retryLater();
    };
  };
  async function probeThenOpen() {
    if (stopped) return;
    try {
      await api('GET', `/workflow/run/${encodeURIComponent(traceId)}`);
    } catch (err) {
      if ([401, 403, 404].includes(err.status)) {
        stop();
        onState('failed', err);
      } else {
        retryLater(err);
      }
      return;
    }
    open();
  }
  onState('connecting');
  open();
  return stop;
}
