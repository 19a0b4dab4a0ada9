// Users (super administrators): list, change role, delete. The API's refusals (the
// last super administrator above all) are shown as its message, next to the user.
import { html, useState } from '../html.js';
import { api, currentSession } from '../api.js';
import { ErrorBox, Notice, useLoad, useId, ConfirmButton, attempt } from '../ui.js';

const ROLES = ['USER', 'ADMINISTRATOR', 'SUPER_ADMINISTRATOR'];

function UserRow({ user, onChanged }) {
  const [role, setRole] = useState(user.role);
  const [error, setError] = useState(null);
  const id = useId('role');
  const me = currentSession().user_id === user.user_id;
  const save = () => attempt(setError, async () => {
    await api('PUT', '/auth/authority', { user_id: user.user_id, new_authority: role });
    onChanged(`${user.user_name} is now ${role}.`);
  });
  const remove = () => attempt(setError, async () => {
    await api('DELETE', `/auth/${encodeURIComponent(user.user_id)}`);
    onChanged(`${user.user_name} was deleted, with their workers, runs and files.`);
  });
  return html`<tr data-user=${user.user_name}>
      <td data-label="User">${user.user_name}${me && html` <small>(you)</small>`}</td>
      <td data-label="Role"><label class="sr-only" for=${id}>Role of ${user.user_name}</label>
        <select id=${id} value=${role} onChange=${(e) => setRole(e.target.value)}>
          ${ROLES.map((r) => html`<option value=${r} selected=${r === role}>${r}</option>`)}
        </select></td>
      <td class="actions" data-label="Actions">
        <button type="button" onClick=${save} disabled=${role === user.role}>Save role</button>
        <${ConfirmButton} label="Delete" confirm=${`Delete ${user.user_name}`} onConfirm=${remove} />
      </td>
    </tr>
    ${error && html`<tr class="result"><td colspan="3"><${ErrorBox} error=${error} /></td></tr>`}`;
}

export function Users() {
  const [data, loadError, reload] = useLoad(() => api('GET', '/auth/list'));
  const [notice, setNotice] = useState('');
  return html`<section>
    <h1>Users</h1>
    <p class="hint">Changing a role or deleting a user ends their sessions. The last super administrator can be neither demoted nor deleted.</p>
    <${Notice} text=${notice} />
    <${ErrorBox} error=${loadError} />
    <div class="table-wrap"><table class="stack">
      <thead><tr><th>User</th><th>Role</th><th>Actions</th></tr></thead>
      <tbody>${data && data.users.map((u) => html`<${UserRow} key=${u.user_id + u.role} user=${u}
                onChanged=${(text) => { setNotice(text); reload(); }} />`)}</tbody>
    </table></div>
  </section>`;
}
