// Sign in and register (POST /auth/login, /auth/register).
import { html, useState } from '../html.js';
import { publicApi, signIn, takeEndedMessage } from '../api.js';
import { TextField, ErrorBox, Notice, problemsByField, go } from '../ui.js';

async function logIn(userName, password) {
  const tokens = await publicApi('POST', '/auth/login', { user_name: userName, password });
  signIn(tokens.access_token, tokens.refresh_token);
  if (!location.hash || location.hash === '#/register' || location.hash === '#/login') go('runs');
}

function CredentialsForm({ title, submitLabel, onSubmit, footer, notice, confirm = false }) {
  const [userName, setUserName] = useState('');
  const [password, setPassword] = useState('');
  const [repeated, setRepeated] = useState('');
  const [mismatch, setMismatch] = useState('');
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const problems = problemsByField(error);
  const submit = async (e) => {
    e.preventDefault();
    if (confirm && password !== repeated) {  // a typo would lock the new user out
      setMismatch('The two passwords differ: type the same password twice.');
      return;
    }
    setMismatch('');
    setBusy(true);
    setError(null);
    try {
      await onSubmit(userName, password);
    } catch (err) {
      setError(err);
      setBusy(false);
    }
  };
  return html`<section class="card">
    <h1>${title}</h1>
    <${Notice} text=${notice} />
    <form onSubmit=${submit}>
      <${TextField} label="User name" value=${userName} onInput=${setUserName} autocomplete="username"
                    required problem=${problems.user_name} />
      <${TextField} label="Password" type="password" value=${password} onInput=${setPassword}
                    autocomplete=${confirm ? 'new-password' : 'current-password'}
                    hint=${confirm ? '8 to 256 characters' : ''} required problem=${problems.password} />
      ${confirm && html`<${TextField} label="Repeat the password" type="password" value=${repeated}
                    onInput=${setRepeated} autocomplete="new-password" required problem=${mismatch} />`}
      <${ErrorBox} error=${error} />
      <button type="submit" class="primary" disabled=${busy}>${submitLabel}</button>
    </form>
    ${footer}
  </section>`;
}

export function SignIn() {
  const [notice] = useState(takeEndedMessage);
  return html`<${CredentialsForm} title="Sign in to orchestra" submitLabel="Sign in" notice=${notice}
    onSubmit=${logIn}
    footer=${html`<p>No account yet? <a href="#/register">Register</a></p>`} />`;
}

export function Register() {
  return html`<${CredentialsForm} title="Create an account" submitLabel="Register" confirm=${true}
    onSubmit=${async (name, password) => {
      await publicApi('POST', '/auth/register', { user_name: name, password });
      await logIn(name, password);
    }}
    footer=${html`<p>Already registered? <a href="#/login">Sign in</a></p>`} />`;
}
