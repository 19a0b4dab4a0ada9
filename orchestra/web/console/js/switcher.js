// The workspace bar, under the header: the switcher — the caller's workspaces (the
// personal one first, as GET /workspace lists them) and "All workspaces"; the choice
// scopes every page's lists — and the pages of the chosen workspace: its members, its
// audit log.
import { html } from './html.js';
import { chooseWorkspace, useWorkspaces } from './workspace.js';
import { useId } from './ui.js';

export const WORKSPACE_PAGES = [['members', 'Members'], ['audit', 'Audit log']];

/** A workspace's name as the switcher shows it. */
export function workspaceLabel(w) {
  return w.personal ? `${w.name} (personal)` : w.name;
}

function WorkspaceSwitcher() {
  const { workspaces, chosen } = useWorkspaces();
  const id = useId('workspace');
  return html`<span class="switcher">
    <label for=${id}>Workspace</label>
    <select id=${id} value=${chosen} disabled=${!workspaces}
            onChange=${(e) => chooseWorkspace(e.target.value)}>
      <option value="" selected=${!chosen}>All workspaces</option>
      ${(workspaces || []).map((w) => html`<option key=${w.workspace_id} value=${w.workspace_id}
          selected=${w.workspace_id === chosen} title=${`your role: ${w.role}`}>${workspaceLabel(w)}</option>`)}
    </select>
  </span>`;
}

export function WorkspaceBar({ page }) {
  return html`<nav class="workspace-bar" aria-label="Workspace pages">
    <${WorkspaceSwitcher} />
    ${WORKSPACE_PAGES.map(([name, label]) => html`<a key=${name} href=${`#/${name}`}
        aria-current=${page === name ? 'page' : undefined}>${label}</a>`)}
  </nav>`;
}
