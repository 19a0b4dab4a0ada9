// The console's shell: a router over the URL fragment (`#/runs/<id>`), the navigation
// each role may use, and the sign-in gate.
import { html, render, useState, useEffect } from './html.js';
import { currentSession, onSession, signOut, isAdmin, isSuperAdmin } from './api.js';
import { SignIn, Register } from './pages/auth.js';
import { Providers } from './pages/providers.js';
import { McpServers } from './pages/mcp.js';
import { Secrets } from './pages/secrets.js';
import { Workers } from './pages/workers.js';
import { Templates, TemplateEditor } from './pages/templates.js';
import { Runs } from './pages/runs.js';
import { RunView } from './pages/run_view.js';
import { Users } from './pages/users.js';
import { Schedules } from './pages/schedules.js';
import { Subscriptions } from './pages/subscriptions.js';
import { Keys } from './pages/keys.js';
import { Hooks } from './pages/hooks.js';
import { Usage } from './pages/usage.js';
import { Members } from './pages/members.js';
import { Audit } from './pages/audit.js';
import { WorkspaceBar, WORKSPACE_PAGES } from './switcher.js';
import { useWorkspaces, workspaceOf, atLeast } from './workspace.js';

function currentRoute() {
  const [path, query = ''] = location.hash.replace(/^#\/?/, '').split('?');
  const parts = (path || 'runs').split('/').map(decodeURIComponent);
  return { page: parts[0], arg: parts[1] || '', query: new URLSearchParams(query) };
}

function useRoute() {
  const [route, setRoute] = useState(currentRoute);
  useEffect(() => {
    const update = () => {
      setRoute(currentRoute());
      // After a navigation, focus the new page's heading so screen readers announce it
      // and Tab starts from the top of the page, not from the link that was followed.
      requestAnimationFrame(() => {
        const heading = document.querySelector('main h1');
        if (heading) {
          heading.tabIndex = -1;
          heading.focus({ preventScroll: true });
        }
      });
    };
    addEventListener('hashchange', update);
    return () => removeEventListener('hashchange', update);
  }, []);
  return route;
}

function useSession() {
  const [session, setSession] = useState(currentSession);
  useEffect(() => onSession(setSession), []);
  return session;
}

const NAV = [
  ['runs', 'Runs', () => true],
  ['templates', 'Templates', () => true],
  ['schedules', 'Schedules', () => true],
  ['subscriptions', 'Subscriptions', () => true],
  ['workers', 'Workers', () => true],
  ['providers', 'Providers', adminHere],
  ['mcp', 'MCP servers', () => true],
  ['secrets', 'Secrets', adminHere],
  ['hooks', 'Webhooks', () => true],
  ['keys', 'API keys', () => true],
  ['usage', 'Usage', () => true],
  ['users', 'Users', isSuperAdmin],
];

/** Instance-wide providers and secrets are ADMINISTRATOR+'s; a workspace's own, its admins' and owners'. */
function adminHere() {
  const workspace = workspaceOf();
  return workspace ? atLeast(workspace.role, 'admin') : isAdmin();
}

// The header's role, short (the whole name is its title), so the navigation keeps to one line at 1280 px.
const ROLE_SHORT = { SUPER_ADMINISTRATOR: 'super admin', ADMINISTRATOR: 'admin', USER: 'user' };

function Page({ route }) {
  const { page, arg } = route;
  switch (page) {
    case 'providers': return adminHere() ? html`<${Providers} />` : html`<${Forbidden} />`;
    case 'workers': return html`<${Workers} />`;
    case 'mcp': return html`<${McpServers} />`;
    case 'secrets': return adminHere() ? html`<${Secrets} />` : html`<${Forbidden} />`;
    case 'hooks': return html`<${Hooks} />`;
    case 'keys': return html`<${Keys} />`;
    case 'templates': return arg ? html`<${TemplateEditor} key=${arg} templateId=${arg} />` : html`<${Templates} />`;
    case 'schedules': return html`<${Schedules} />`;
    case 'subscriptions': return html`<${Subscriptions} />`;
    case 'run': return html`<${RunView} key=${arg} traceId=${arg} />`;
    case 'users': return isSuperAdmin() ? html`<${Users} />` : html`<${Forbidden} />`;
    case 'runs': return html`<${Runs} query=${route.query} />`;
    case 'usage': return html`<${Usage} />`;
    case 'members': return html`<${Members} />`;
    case 'audit': return html`<${Audit} />`;
    default: return html`<section><h1>Not found</h1><p>Nothing is at <code>#/${page}</code>.</p></section>`;
  }
}

function Forbidden() {
  return html`<section><h1>Not allowed</h1>
    <p class="error" role="alert">Your role does not allow this page.</p></section>`;
}

function App() {
  const session = useSession();
  const route = useRoute();
  const { workspaces, error: workspacesError, chosen } = useWorkspaces();
  const [menu, setMenu] = useState(false);  // the navigation, folded into a menu on a phone (console.css)
  useEffect(() => setMenu(false), [route]);
  useEffect(() => {
    const label = [...NAV, ...WORKSPACE_PAGES].find(([page]) => page === route.page);
    document.title = `${label ? label[1] : 'orchestra'} · orchestra`;
  }, [route]);
  if (!session) {
    return html`<main id="main" class="narrow">
      ${route.page === 'register' ? html`<${Register} />` : html`<${SignIn} />`}
    </main>`;
  }
  return html`
    <header class="top" onKeyDown=${(e) => { if (e.key === 'Escape' && menu) { setMenu(false); e.currentTarget.querySelector('.menu-toggle').focus(); } }}>
      <a class="brand" href="#/runs">orchestra</a>
      <button type="button" class="menu-toggle" aria-expanded=${menu ? 'true' : 'false'} aria-controls="main-nav"
              onClick=${() => setMenu(!menu)}>Menu</button>
      <nav id="main-nav" class=${menu ? 'open' : undefined} aria-label="Main"
           onClick=${(e) => { if (e.target.closest('a')) setMenu(false); }}>
        ${NAV.filter(([, , allowed]) => allowed()).map(([page, label]) => html`
          <a href=${`#/${page}`} aria-current=${route.page === page || (page === 'runs' && route.page === 'run') ? 'page' : undefined}>${label}</a>`)}
      </nav>
      <span class="who" title=${`${session.user_name} (${session.role})`}>${session.user_name} <small>${ROLE_SHORT[session.role] || session.role}</small></span>
      <button type="button" class="link" onClick=${() => signOut('You signed out.')}>Sign out</button>
    </header>
    <${WorkspaceBar} page=${route.page} />
    <main id="main">${workspaces || workspacesError
      // A page is drawn for one workspace (or all): choosing another draws it again, its lists reloaded.
      ? html`<${Page} key=${route.page === 'members' ? 'members' : chosen} route=${route} />`
      : html`<p class="loading">Loading…</p>`}</main>`;
}

const root = document.getElementById('app');
root.textContent = '';  // the static "Loading…" line
render(html`<${App} />`, root);
