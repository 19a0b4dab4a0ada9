// The workspace the console works in (SPEC §16), chosen in the header and remembered in
// localStorage per user: every list a page loads asks `?workspace_id=` of it, every
// create sends it as `workspace_id`. '' is "All workspaces" (the API's default: lists
// show all of yours, a create goes to your personal workspace).
import { useState, useEffect } from './html.js';
import { api, currentSession, onSession } from './api.js';

const STORE_PREFIX = 'orchestra.workspace.';
const RANK = { viewer: 0, runner: 1, editor: 2, admin: 3, owner: 4 };

let known = null;  // the signed-in user's workspaces (GET /workspace), once loaded
let loadError = null;
const listeners = new Set();

function storeKey() {
  const session = currentSession();
  return session ? STORE_PREFIX + session.user_id : null;
}

function changed() {
  for (const listener of listeners) listener();
}

/** The chosen workspace's id, or '' for all of them. */
export function chosenWorkspace() {
  const key = storeKey();
  return (key && localStorage.getItem(key)) || '';
}

/** Choose a workspace ('' for all); the pages reload their lists. */
export function chooseWorkspace(id) {
  const key = storeKey();
  if (!key) return;
  if (id) localStorage.setItem(key, id);
  else localStorage.removeItem(key);
  changed();
}

/** The chosen workspace as the API answers it (null for all, or before the list is known). */
export function workspaceOf(id = chosenWorkspace()) {
  return (known || []).find((w) => w.workspace_id === id) || null;
}

/** Whether `role` (a workspace role) is at least `least`. */
export function atLeast(role, least) {
  return (RANK[role] ?? -1) >= RANK[least];
}

/** `path` asking for the chosen workspace's items only (unchanged for all). */
export function scoped(path) {
  const id = chosenWorkspace();
  if (!id) return path;
  return `${path}${path.includes('?') ? '&' : '?'}workspace_id=${encodeURIComponent(id)}`;
}

/** A create's body, in the chosen workspace (unchanged for all: the personal one). */
export function inWorkspace(body) {
  const id = chosenWorkspace();
  return id ? { ...body, workspace_id: id } : body;
}

/** Load the caller's workspaces again; a remembered one the caller is no longer in is forgotten. */
export async function refreshWorkspaces() {
  try {
    known = (await api('GET', '/workspace')).workspaces;
    loadError = null;
    const id = chosenWorkspace();
    if (id && !known.some((w) => w.workspace_id === id)) chooseWorkspace('');
  } catch (err) {
    loadError = err;
  }
  changed();
  return known;
}

/** {workspaces (null until loaded), error, chosen (id or ''), workspace (its object or null)}, kept current. */
export function useWorkspaces() {
  const [, setTick] = useState(0);
  useEffect(() => {
    const update = () => setTick((n) => n + 1);
    listeners.add(update);
    return () => listeners.delete(update);
  }, []);
  return { workspaces: known, error: loadError, chosen: chosenWorkspace(), workspace: workspaceOf() };
}

let signedIn = currentSession() && currentSession().user_id;
onSession((session) => {  // another user's console: their own workspaces, their own choice
  const user = session && session.user_id;
  if (user === signedIn) return;  // a token refresh
  signedIn = user;
  known = null;
  loadError = null;
  if (user) refreshWorkspaces();
  else changed();
});
if (signedIn) refreshWorkspaces();
