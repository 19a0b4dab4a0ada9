// The public API, and the signed-in session: tokens live in this tab's sessionStorage,
// the access token is refreshed (with the single-use refresh token) a minute (or a fifth of
// its lifetime, if shorter) before it expires, and an expired token met on a request is refreshed once and the request repeated.

const API = '/api/v1';
const STORE_KEY = 'orchestra.session';
const REFRESH_MARGIN_S = 60;
const REFRESH_MARGIN_SHARE = 0.2;

/** An answer the API refused: its `message` is what the user reads. */
export class ApiError extends Error {
  constructor(status, body, retryAfter) {
    const message = (body && body.message) || `The server answered ${status}.`;
    super(message);
    this.status = status;
    this.error = body && body.error;
    this.detail = body && body.detail;
    this.retryAfter = retryAfter;
  }

  /** The sentence shown: the API's message, plus when to try again on 429/503. */
  get shown() {
    if ((this.status === 429 || this.status === 503) && this.retryAfter) {
      return `${this.message} Try again in ${this.retryAfter} s.`;
    }
    return this.message;
  }
}

const UNREACHABLE = 'The server cannot be reached. Check that `orchestra serve` is running.';

function decodeClaims(token) {
  const part = token.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
  const bytes = Uint8Array.from(atob(part), (c) => c.charCodeAt(0));
  return JSON.parse(new TextDecoder().decode(bytes));
}

let session = null;
try {
  session = JSON.parse(sessionStorage.getItem(STORE_KEY) || 'null');
} catch {
  session = null;
}
let endedMessage = '';
let refreshTimer = null;
let refreshing = null;
const listeners = new Set();

function changed() {
  if (session) sessionStorage.setItem(STORE_KEY, JSON.stringify(session));
  else sessionStorage.removeItem(STORE_KEY);
  for (const listener of listeners) listener(session);
}

function scheduleRefresh() {
  clearTimeout(refreshTimer);
  if (!session) return;
  const margin = Math.min(REFRESH_MARGIN_S, (session.exp - session.iat) * REFRESH_MARGIN_SHARE);
  const wait = Math.max(1, session.exp - Date.now() / 1000 - margin);
  refreshTimer = setTimeout(() => refreshTokens().catch(() => {}), wait * 1000);
}

/** Subscribe to sign-in / sign-out; returns the unsubscribe function. */
export function onSession(listener) {
  listeners.add(listener);
  return () => listeners.delete(listener);
}

export function currentSession() {
  return session;
}

/** Why the last session ended (shown on the sign-in page), then forgotten. */
export function takeEndedMessage() {
  const message = endedMessage;
  endedMessage = '';
  return message;
}

export function signIn(accessToken, refreshToken) {
  const claims = decodeClaims(accessToken);
  session = {
    access_token: accessToken,
    refresh_token: refreshToken,
    user_id: claims.sub,
    user_name: claims.name,
    role: claims.role,
    exp: claims.exp,
    iat: claims.iat,
  };
  scheduleRefresh();
  changed();
}

export function signOut(reason = '') {
  endedMessage = reason;
  session = null;
  clearTimeout(refreshTimer);
  changed();
}

export function isAdmin() {
  return !!session && (session.role === 'ADMINISTRATOR' || session.role === 'SUPER_ADMINISTRATOR');
}

export function isSuperAdmin() {
  return !!session && session.role === 'SUPER_ADMINISTRATOR';
}

async function errorOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  return new ApiError(response.status, body, response.headers.get('Retry-After'));
}

async function send(method, path, body, token) {
  const headers = {};
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  try {
    return await fetch(API + path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch {
    throw new ApiError(0, { message: UNREACHABLE });
  }
}

/** Exchange the refresh token for a new pair; one exchange at a time (tokens are single-use). */
export function refreshTokens() {
  if (!refreshing) {
    refreshing = (async () => {
      if (!session) throw new ApiError(401, { message: 'You are signed out.' });
      const response = await send('POST', '/auth/refresh', { refresh_token: session.refresh_token });
      if (!response.ok) {
        const error = await errorOf(response);
        if (response.status === 401) signOut(`Your session ended: ${error.message} Please sign in again.`);
        throw error;
      }
      const tokens = await response.json();
      signIn(tokens.access_token, tokens.refresh_token);
    })().finally(() => {
      refreshing = null;
    });
  }
  return refreshing;
}

/** An access token good for at least a few more seconds (refreshing it first if not). */
export async function freshAccessToken() {
  if (session && session.exp - Date.now() / 1000 < Math.min(10, (session.exp - session.iat) * 0.1)) await refreshTokens();
  return session && session.access_token;
}

/** Call the API; resolves to the JSON body, or throws ApiError with the API's message. */
export async function api(method, path, body) {
  const token = await freshAccessToken();
  let response = await send(method, path, body, token);
  if (response.status === 401 && session) {
    const error = await errorOf(response);
    if (error.error !== 'TokenExpiredError') {
      signOut(`Your session ended: ${error.message} Please sign in again.`);
      throw error;
    }
    await refreshTokens();
    response = await send(method, path, body, session && session.access_token);
  }
  if (!response.ok) throw await errorOf(response);
  return response.status === 204 ? {} : response.json();
}

/** Every item of a paged list (`GET path`, items under `key`), following `next_cursor`;
 * resolves to `{ [key]: items }`, the shape of one unpaged answer. */
export async function apiAll(path, key) {
  const items = [];
  let cursor = null;
  do {
    const sep = path.includes('?') ? '&' : '?';
    const page = await api('GET', `${path}${sep}limit=1000${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`);
    items.push(...page[key]);
    cursor = page.next_cursor;
  } while (cursor);
  return { [key]: items };
}

/** Unauthenticated calls (register, login): same errors, no token. */
export async function publicApi(method, path, body) {
  const response = await send(method, path, body);
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

/** Upload files (multipart, field `file`) with progress callbacks `onProgress(0..1)`. */
export async function upload(files, onProgress) {
  const token = await freshAccessToken();
  return new Promise((resolve, reject) => {
    const form = new FormData();
    for (const file of files) form.append('file', file, file.name);
    const xhr = new XMLHttpRequest();
    xhr.open('POST', `${API}/adapter/client/upload`);
    xhr.setRequestHeader('Authorization', `Bearer ${token}`);
    xhr.responseType = 'json';
    xhr.upload.onprogress = (e) => e.lengthComputable && onProgress(e.loaded / e.total);
    xhr.onerror = () => reject(new ApiError(0, { message: UNREACHABLE }));
    xhr.onload = () => {
      if (xhr.status === 201) {
        onProgress(1);
        resolve(xhr.response.files);
      } else {
        reject(new ApiError(xhr.status, xhr.response, xhr.getResponseHeader('Retry-After')));
      }
    };
    xhr.send(form);
  });
}

if (session) scheduleRefresh();  // a reload keeps the tab's session (and refreshes it on time)
