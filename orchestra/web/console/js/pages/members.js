// Members of the chosen workspace (SPEC §16): the list with roles for every member; an
// admin or owner adds a member by user name, changes a role, removes a member. The API's
// refusals (the last owner: 409, no such user: 404, a role too low: 403 naming the role
// needed) are shown as its message next to the form or row. Also: create a workspace.
import { html, useState } from '../html.js';
import { api, currentSession } from '../api.js';
import { TextField, Select, ErrorBox, Notice, useLoad, useId, ConfirmButton, attempt, problemsByField, when } from '../ui.js';
import { useWorkspaces, chooseWorkspace, refreshWorkspaces, atLeast } from '../workspace.js';
import { workspaceLabel } from '../switcher.js';

export const ROLES = ['owner', 'admin', 'editor', 'runner', 'viewer'];
const ROLE_OPTIONS = ROLES.map((r) => [r, r]);

function memberPath(workspaceId, userId = '') {
  return `/workspace/${encodeURIComponent(workspaceId)}/member${userId ? `/${encodeURIComponent(userId)}` : ''}`;
}

function MemberRow({ workspaceId, member, manage, onChanged }) {
  const [role, setRole] = useState(member.role);
  const [error, setError] = useState(null);
  const id = useId('member-role');
  const me = currentSession().user_id === member.user_id;
  const save = () => attempt(setError, async () => {
    await api('PUT', memberPath(workspaceId, member.user_id), { role });
    onChanged(`${member.user_name} is now ${role}.`);
  });
  const remove = () => attempt(setError, async () => {
    await api('DELETE', memberPath(workspaceId, member.user_id));
    onChanged(`${member.user_name} was removed from the workspace.`);
  });
  return html`<tr data-member=${member.user_name}>
      <td data-label="Member">${member.user_name}${me && html` <small>(you)</small>`}</td>
      <td data-label="Role">${manage
        ? html`<label class="sr-only" for=${id}>Role of ${member.user_name}</label>
            <select id=${id} value=${role} onChange=${(e) => setRole(e.target.value)}>
              ${ROLES.map((r) => html`<option value=${r} selected=${r === role}>${r}</option>`)}
            </select>`
        : member.role}</td>
      ${manage && html`<td class="actions" data-label="Actions">
        <button type="button" onClick=${save} disabled=${role === member.role}>Save role</button>
        <${ConfirmButton} label="Remove" confirm=${`Remove ${member.user_name}`} onConfirm=${remove} />
      </td>`}
    </tr>
    ${error && html`<tr class="result"><td colspan="3"><${ErrorBox} error=${error} /></td></tr>`}`;
}

function AddMember({ workspaceId, onAdded }) {
  const [form, setForm] = useState({ user_name: '', role: 'viewer' });
  const [error, setError] = useState(null);
  const problems = problemsByField(error);
  const submit = (e) => {
    e.preventDefault();
    attempt(setError, async () => {
      const answer = await api('POST', memberPath(workspaceId), form);
      setForm({ user_name: '', role: form.role });
      onAdded(`${answer.member.user_name} was added as ${answer.member.role}.`);
    });
  };
  return html`<form class="card" onSubmit=${submit} aria-labelledby="add-member">
    <h2 id="add-member">Add a member</h2>
    <div class="grid">
      <${TextField} label="User name" value=${form.user_name} onInput=${(user_name) => setForm({ ...form, user_name })}
                    required autocomplete="off" problem=${problems.user_name} />
      <${Select} label="Role" value=${form.role} onChange=${(role) => setForm({ ...form, role })}
                 options=${ROLE_OPTIONS} problem=${problems.role}
                 hint="owner > admin > editor > runner > viewer; only an owner grants owner" />
    </div>
    <${ErrorBox} error=${error} />
    <button type="submit" class="primary">Add member</button>
  </form>`;
}

function CreateWorkspace() {
  const [name, setName] = useState('');
  const [error, setError] = useState(null);
  const [notice, setNotice] = useState('');
  const problems = problemsByField(error);
  const submit = (e) => {
    e.preventDefault();
    attempt(setError, async () => {
      const made = await api('POST', '/workspace', { name });
      setName('');
      await refreshWorkspaces();
      chooseWorkspace(made.workspace_id);  // the console now works in it
      setNotice(`Workspace '${made.workspace.name}' created; you are its owner.`);
    });
  };
  return html`<form class="card" onSubmit=${submit} aria-labelledby="create-workspace">
    <h2 id="create-workspace">Create a workspace</h2>
    <${Notice} text=${notice} />
    <${TextField} label="Workspace name" value=${name} onInput=${setName} required problem=${problems.name}
                  hint="a team's templates, workers, runs and secrets, shared with its members by role" />
    <${ErrorBox} error=${error} />
    <button type="submit" class="primary">Create workspace</button>
  </form>`;
}

function MemberList({ workspace }) {
  const [data, loadError, reload] = useLoad(() => api('GET', memberPath(workspace.workspace_id)), [workspace.workspace_id]);
  const [notice, setNotice] = useState('');
  const manage = atLeast(workspace.role, 'admin');
  const changed = (text) => { setNotice(text); reload(); refreshWorkspaces(); };
  return html`
    <p class="hint">Your role here: <strong data-my-role>${workspace.role}</strong>.
      ${manage ? ' Admins manage members below owner; only an owner grants or removes owner, and the last owner stays.'
               : ' Only its admins and owners change its members.'}</p>
    <${Notice} text=${notice} />
    <${ErrorBox} error=${loadError} />
    <div class="table-wrap"><table class="stack members">
      <thead><tr><th>Member</th><th>Role</th>${manage && html`<th>Actions</th>`}</tr></thead>
      <tbody>${data && data.members.map((m) => html`<${MemberRow} key=${m.user_id + m.role} workspaceId=${workspace.workspace_id}
                member=${m} manage=${manage} onChanged=${changed} />`)}</tbody>
    </table></div>
    ${manage && html`<${AddMember} workspaceId=${workspace.workspace_id} onAdded=${changed} />`}`;
}

/** Your workspaces, to choose one (shown while "All workspaces" is chosen). */
function WorkspaceList({ workspaces }) {
  return html`<div class="table-wrap"><table class="stack">
    <thead><tr><th>Workspace</th><th>Your role</th><th>Created</th></tr></thead>
    <tbody>${workspaces.map((w) => html`<tr key=${w.workspace_id} data-workspace=${w.name}>
      <td data-label="Workspace"><button type="button" class="link" onClick=${() => chooseWorkspace(w.workspace_id)}>${workspaceLabel(w)}</button></td>
      <td data-label="Your role">${w.role}</td><td data-label="Created">${when(w.created_at)}</td></tr>`)}</tbody>
  </table></div>`;
}

export function Members() {
  const { workspaces, error, workspace } = useWorkspaces();
  let body;
  if (!workspace) {
    body = html`<p class="hint">Choose a workspace (in the header, or below) to see its members.</p>
      ${workspaces && html`<${WorkspaceList} workspaces=${workspaces} />`}`;
  } else if (workspace.personal) {
    body = html`<p class="hint">Your personal workspace is never shared: you are its only member. Create a team
      workspace below to work with others.</p>`;
  } else {
    body = html`<${MemberList} key=${workspace.workspace_id} workspace=${workspace} />`;
  }
  return html`<section>
    <h1>Members${workspace ? html` of ${workspace.name}` : ''}</h1>
    <${ErrorBox} error=${error} />
    ${body}
    <${CreateWorkspace} />
  </section>`;
}
